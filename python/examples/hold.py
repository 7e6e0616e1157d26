"""--hold SECONDS [--hold-until FILE]: the examples' wait after training, for a client to attach.

With --hold-until the wait ends as soon as FILE exists (a test creates it once its clients are
done), so a loaded machine cannot make a client arrive after the ranks left; SECONDS stays the
upper bound."""

import os
import time


def add_hold_arguments(parser):
    parser.add_argument("--hold", type=float, default=0.0,
                        help="seconds to wait after the last step (for a client to attach)")
    parser.add_argument("--hold-until", default="", metavar="FILE",
                        help="end the --hold wait early once FILE exists")


def hold(args):
    deadline = time.monotonic() + args.hold
    while time.monotonic() < deadline:
        if args.hold_until and os.path.exists(args.hold_until):
            return
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
