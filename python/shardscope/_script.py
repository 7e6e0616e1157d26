"""Running the user's own training script as Python runs it: the one way `shardscope.run` (and
the ranks of `shardscope-check`) start a script or module the user wrote, unchanged.

`python train.py a b` gives the script `__name__ == "__main__"`, `sys.argv == ["train.py", "a",
"b"]`, the script's real directory as `sys.path[0]`, and a traceback that starts at the script's
first frame. `run()` gives the same from inside another module: the frames of the launcher and
of `runpy` are left out of the traceback printed for an exception the script did not catch
(`sys.excepthook`), and the exception itself, its type, message and exit status are untouched.
"""

from __future__ import annotations

import os
import runpy
import sys
import types
from typing import Callable, Optional, Sequence

_OWN_FILES = {os.path.abspath(__file__), os.path.abspath(runpy.__file__)}


def _ours(tb: types.TracebackType, extra: frozenset) -> bool:
    filename = tb.tb_frame.f_code.co_filename
    return (filename.startswith("<frozen runpy") or os.path.abspath(filename) in _OWN_FILES
            or os.path.abspath(filename) in extra)


def user_traceback(tb: Optional[types.TracebackType],
                   launchers: Sequence[str] = ()) -> Optional[types.TracebackType]:
    """tb without its leading frames of runpy, this module and the launcher files given."""
    extra = frozenset(os.path.abspath(f) for f in launchers)
    first = tb
    while first is not None and _ours(first, extra):
        first = first.tb_next
    return first if first is not None else tb


def _trim_uncaught(launchers: Sequence[str]) -> None:
    previous: Callable = sys.excepthook

    def hook(kind, value, tb):
        trimmed = user_traceback(tb, launchers)
        # Python's default hook prints the exception's own __traceback__ when it has one, not
        # the tb it is given: the exception carries the trimmed one (at exit, nothing else
        # reads it).
        if isinstance(value, BaseException) and trimmed is not tb:
            value.__traceback__ = trimmed
        previous(kind, value, trimmed)

    sys.excepthook = hook


def run(target: str, args: Sequence[str], *, module: bool = False,
        launchers: Sequence[str] = ()) -> None:
    """Runs the script at `target` (or, with module=True, the module named `target`) as
    __main__ with `args` as its arguments, as `python target args...` (`python -m target
    args...`) would. Returns when it returns; its SystemExit and exceptions propagate as they
    are. launchers: files whose frames the printed traceback leaves out as well."""
    _trim_uncaught(launchers)
    if module:
        sys.argv = [target, *args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    here = os.path.dirname(os.path.realpath(target))
    # `python -m shardscope.run` put the working directory first; `python train.py` puts the
    # script's own (symbolic links resolved).
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path[0] = here
    else:
        sys.path.insert(0, here)
    sys.argv = [target, *args]
    runpy.run_path(target, run_name="__main__")
