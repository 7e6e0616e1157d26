"""The deepspeed_ops-X.Y.Z fixture: builds the release's JIT op (the CPU accelerator's
shared-memory collective) once, before its cases. DeepSpeed missing fails it, unless
SHARDSCOPE_ALLOW_SKIP names deepspeed or deepspeed-X.Y.Z (tests/support/prerequisite.h);
then it says so and succeeds, and the suites that need it skip by the same rule.
Usage: build_ops.py X.Y.Z"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import prerequisite  # noqa: E402


def main():
    version = sys.argv[1]
    try:
        from deepspeed.comm.torch import build_shm_op
    except ImportError as e:
        status = prerequisite.missing(["deepspeed", f"deepspeed-{version}"],
                                      f"DeepSpeed {version} cannot be imported ({e}; scripts/deps "
                                      f"installs it)")
        return 0 if status == prerequisite.SKIP else status
    build_shm_op()
    return 0


if __name__ == "__main__":
    sys.exit(main())
