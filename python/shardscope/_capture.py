"""The `shardscope-capture` console command of the wheel: runs the native executable that the
wheel carries inside the package (shardscope/_bin/shardscope-capture), with the same arguments,
standard streams and exit status. `cmake --install` and the .deb install the executable itself."""

import os
import sys


def executable() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "shardscope-capture")


def main() -> None:
    path = executable()
    if not os.access(path, os.X_OK):
        sys.stderr.write(f"shardscope-capture: {path} is missing or not executable; this "
                         f"installation of shardscope is incomplete: reinstall the wheel "
                         f"(pip install --force-reinstall shardscope-*.whl)\n")
        sys.exit(2)
    os.execv(path, ["shardscope-capture"] + sys.argv[1:])


if __name__ == "__main__":
    main()
