"""Which shardscope the agent benchmarks measure: the build tree's (build/python on PYTHONPATH,
build/bin/shardscope-capture) or, with --installed, the package this Python has installed from
the wheel (pip install shardscope-*.whl) and the shardscope-capture beside it, as a user runs it."""

import os
import sys


def add_installed_argument(parser):
    parser.add_argument("--installed", action="store_true",
                        help="the shardscope package installed in this Python (the wheel), not "
                             "build/python")


def package_env(args, build):
    """os.environ for the ranks, with build/python first on PYTHONPATH unless --installed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if not args.installed:
        env["PYTHONPATH"] = os.path.join(build, "python")
    return env


def capture_command(args, build):
    if args.installed:
        return os.path.join(os.path.dirname(sys.executable), "shardscope-capture")
    return os.path.join(build, "bin", "shardscope-capture")
