"""Where a module sits in its model while the model is still being built: the path of a
module below the outermost one that holds it, found through its parents' ``_modules``."""

from __future__ import annotations

import gc
import sys
from typing import Any, Optional, Tuple


def walk_up(module: Any) -> Tuple[Any, str]:
    """(top, path of module below top) through the parents' _modules dicts. The links come
    first from the subtrees of the modules whose __init__ is running (on the stack: what
    model-building code touches is in one of them, and a walk of their modules is cheap);
    above a module none of them holds, from gc referrers (a scan of the whole heap per call:
    33 of them took 1 s of a small wav2vec2's build, and grow with the model)."""
    import torch.nn as nn

    building: list = []
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "__init__":
            s = frame.f_locals.get("self")
            # "_modules": past Module.__init__ (a child may be built before super().__init__())
            if isinstance(s, nn.Module) and "_modules" in s.__dict__ and \
                    not any(s is b for b in building):
                building.append(s)
        frame = frame.f_back  # type: ignore[assignment]
    links: dict[int, Tuple[Any, str]] = {}  # id(child) -> (parent, attribute)
    for b in building:
        for parent in b.modules():
            for key, child in parent._modules.items():
                if child is not None:
                    links.setdefault(id(child), (parent, key))
    parts = []
    current = module
    for _ in range(64):
        found = links.get(id(current))
        if found is None:
            if any(current is b for b in building):
                break  # its __init__ is running: it is not assigned to a parent yet
            found = referrer_parent(current)
            if found is None:
                break
        current = found[0]
        parts.append(found[1])
    return current, ".".join(reversed(parts))


def referrer_parent(module: Any) -> Optional[Tuple[Any, str]]:
    """(parent, attribute) of a module through gc referrers: the dict holding it that is a
    module's _modules, and that module; None when no module holds it."""
    for holder in gc.get_referrers(module):
        if not isinstance(holder, dict):
            continue
        children: dict = holder
        for owner_dict in gc.get_referrers(holder):
            if isinstance(owner_dict, dict) and owner_dict.get("_modules") is holder:
                for owner in gc.get_referrers(owner_dict):
                    if getattr(owner, "__dict__", None) is owner_dict:
                        key = next((k for k, v in children.items() if v is module), None)
                        if key is not None:
                            return owner, key
                        break
    return None
