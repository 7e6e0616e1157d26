"""Where in the user's code something happened: the innermost frame outside the libraries,
as every agent's violations, late parameters and checks name it (``file:line``).

[Note: user frames] A frame is the user's when its file is outside ShardScope, the libraries
of ``LIBRARIES`` and Python's standard library (contextlib's and functools' wrappers). Each
file is classified once. ``location`` gives the frame and up to ``CHAIN`` user frames above
it: the chain a violation shows.
"""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any, Optional, Protocol, Tuple

# A violation's place: (file, line, function, the user frames above it as "file:line in f").
Location = Tuple[str, int, str, list]

# Packages whose frames are never the user's (also when installed in site-packages).
LIBRARIES = ("torch", "deepspeed", "transformers", "accelerate")
CHAIN = 4  # frames above the user's, shown with it

_library_dirs: Optional[Tuple[str, ...]] = None
_user_files: dict[str, bool] = {}  # co_filename -> whether it is the user's: each file looked at once


def library_prefixes() -> Tuple[str, ...]:
    """The directories (ending in a separator) whose files are not the user's."""
    global _library_dirs
    if _library_dirs is None:
        import sysconfig

        dirs = {os.path.dirname(os.path.abspath(__file__))}  # shardscope itself
        for name in LIBRARIES:
            m = sys.modules.get(name)
            f = getattr(m, "__file__", None)
            if f:
                dirs.add(os.path.dirname(os.path.abspath(f)))
        for key in ("stdlib", "platstdlib"):
            d = sysconfig.get_paths().get(key)
            if d:
                dirs.add(os.path.abspath(d))
        _library_dirs = tuple(d.rstrip(os.sep) + os.sep for d in dirs)
    return _library_dirs


def is_user(frame: FrameType) -> bool:
    name = frame.f_code.co_filename
    user = _user_files.get(name)
    if user is None:
        user = _user_files[name] = is_user_file(name)
    return user


def is_user_file(name: str) -> bool:
    """Whether a code object's file name is the user's (the note above)."""
    if name.startswith("<"):
        return False
    if "site-packages" in name or "dist-packages" in name:
        top = name.replace("\\", "/").split("-packages/", 1)[1].split("/", 1)[0]
        if top in LIBRARIES or top == "shardscope":
            return False
    return not os.path.abspath(name).startswith(library_prefixes())


def user_frame(frame: Optional[FrameType]) -> Optional[FrameType]:
    """frame or the first of its callers that is the user's; None when none is."""
    while frame is not None and not is_user(frame):
        frame = frame.f_back
    return frame


def called_by(frame: Optional[FrameType], package: str) -> bool:
    """Whether frame, or one of its callers below the user's innermost frame, is code of the
    (imported) package: "deepspeed" (save_checkpoint taking the module's state dict, with its
    partitions beside it), "torch.distributed.checkpoint" (DCP's writer calling torch.save)."""
    module = sys.modules.get(package)
    f = getattr(module, "__file__", None)
    if not f:
        return False
    prefix = os.path.dirname(os.path.abspath(f)) + os.sep
    while frame is not None and not is_user(frame):
        if os.path.abspath(frame.f_code.co_filename).startswith(prefix):
            return True
        frame = frame.f_back
    return False


def frame_text(frame: FrameType) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def location(frame: FrameType) -> Location:
    """(file, line, function, chain) of the user's frame, chain: the user frames above it."""
    chain: list = []
    up = frame.f_back
    while up is not None and len(chain) < CHAIN:
        if is_user(up):
            chain.append(frame_text(up))
        up = up.f_back
    code = frame.f_code
    function = getattr(code, "co_qualname", code.co_name)
    return (code.co_filename, int(frame.f_lineno), function, chain)


class _Removable(Protocol):
    def remove(self) -> None: ...


def watch_registrations() -> _Removable:
    """Where parameters are registered, for the late ones' location: torch's global parameter
    registration hook, while an agent is installed, keeps the user's frame (location(), as a
    violation's) on each parameter registered through Module.register_parameter (a module's
    constructor, weight_norm, an adapter assigned to a module). FSDP2 and DeepSpeed replace
    parameters without it. Returns the hook's handle (remove() to stop)."""
    from torch.nn.modules.module import register_module_parameter_registration_hook

    def registered(module: Any, name: str, param: Any) -> None:
        frame = user_frame(sys._getframe(1))
        if frame is not None:
            param.__dict__["_shardscope_site"] = location(frame)

    return register_module_parameter_registration_hook(registered)


def site(param: Any) -> Optional[Location]:
    """Where param was registered (watch_registrations), or None."""
    return param.__dict__.get("_shardscope_site")
