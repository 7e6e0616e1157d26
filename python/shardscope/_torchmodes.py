"""torch function modes as the agents use them to watch reads of sharded parameters: kept at
the bottom of torch's mode stack, under the user's own modes, and taken off wherever they are.

The private torch names used here are declared in ``_torchinternals`` (checked at install).
"""

from __future__ import annotations

from typing import Any, Callable, Optional


def _metadata_only() -> set:
    """Tensor functions that do not read a parameter's data (hashing it into a set, reading
    its attributes): GatheredParameters does these to a partitioned parameter, legally."""
    import torch

    names = ("__hash__", "__repr__", "__format__", "__reduce_ex__", "__deepcopy__",
             "__setstate__", "__getstate__", "__get__", "__set__", "__delete__")
    return {getattr(torch.Tensor, n) for n in names if hasattr(torch.Tensor, n)}


class MetadataOnly:
    """Membership test for the tensor functions that read no data, also matching property
    getters and setters (``func in METADATA_ONLY``)."""

    def __init__(self) -> None:
        self.funcs: Optional[set] = None

    def __contains__(self, func: Callable[..., Any]) -> bool:
        if self.funcs is None:
            self.funcs = _metadata_only()
        return func in self.funcs or getattr(func, "__name__", "") in ("__get__", "__set__", "__delete__")


METADATA_ONLY = MetadataOnly()


def _stack() -> tuple:
    from . import _torchinternals

    return _torchinternals.function_mode_stack()


def enter_below(mode: Any) -> None:
    """Puts mode at the bottom of torch's function-mode stack, under the modes the user (or
    torch: `with torch.device(...)`) entered before: their __exit__ pops the top one, which
    must stay theirs (issue #30, defect 3). It still sees every call they pass on."""
    depth, pop, push = _stack()
    above = []
    while depth() > 0:
        above.append(pop())
    push(mode)
    for m in reversed(above):
        push(m)


def leave_mode(mode: Any) -> bool:
    """Takes mode off torch's function-mode stack wherever it is: modes the user pushed above
    it stay, in their order (TorchFunctionMode.__exit__ would pop the top one, theirs).
    Returns whether it was there."""
    depth, pop, push = _stack()
    above = []
    found = False
    while depth() > 0:
        top = pop()
        if top is mode:
            found = True
            break
        above.append(top)
    for m in reversed(above):
        push(m)
    return found
