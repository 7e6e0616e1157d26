"""The rule of tests/support/prerequisite.h for the Python test scripts: a missing prerequisite
fails the run (exit 1) unless SHARDSCOPE_ALLOW_SKIP names it; only a missing GPU skips on its
own (CTest's skip, exit 77)."""

import os

SKIP = 77  # CTest's SKIP_RETURN_CODE


def allowed_skips():
    return [n.strip() for n in os.environ.get("SHARDSCOPE_ALLOW_SKIP", "").split(",") if n.strip()]


def missing(names, why):
    """The exit status for a script whose prerequisite `why` is missing, known by `names`
    (any one allows the skip): 77 when the person running the tests asked for the skip, else 1;
    says which on stdout."""
    if any(n in allowed_skips() for n in names):
        print(f"SKIP (SHARDSCOPE_ALLOW_SKIP): {why}", flush=True)
        return SKIP
    print(f"FAIL: a prerequisite is missing, so this cannot run: {why}. Install it; or, to skip "
          f"it on purpose, run with SHARDSCOPE_ALLOW_SKIP={names[0]}", flush=True)
    return 1
