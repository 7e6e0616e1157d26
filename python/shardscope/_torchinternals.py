"""Every private name of torch itself (not of FSDP2: ``_fsdpinternals``) that an agent uses.

Both agents check them at install (``missing()``, through ``_dsinternals.check_version`` and
``_fsdpinternals.check``): a torch that lacks a required one is refused with its name; an
optional one only turns off what it serves.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Optional, Tuple

# (module, name, what the agents use it for): required.
REQUIRED = (
    # the read watching keeps its TorchFunctionMode at the bottom of the mode stack, under
    # the user's modes (_torchmodes.enter_below / leave_mode)
    ("torch._C", "_len_torch_function_stack", "the function-mode stack's depth"),
    ("torch.overrides", "_pop_mode", "taking a mode off the stack"),
    ("torch.overrides", "_push_mode", "putting a mode on the stack"),
    # a backward inside the autograd engine (a reentrant checkpoint's) is not the script's
    # (_runtime.watch_backward)
    ("torch._C", "_current_graph_task_id", "whether autograd's engine is running"),
)

# Used where this torch has them; without one, what it serves is left out.
OPTIONAL = (
    # the agents' wrappers are not compiled as frames of their own (fsdp._dynamo_skips_frame)
    ("torch._dynamo.eval_frame", "skip_code", "keeping dynamo out of the agent's wrappers"),
)

# Read off a module torch imported, never imported here: compiled autograd's switch
# (a backward under it is seen by FSDP2's agent as a compiled one).
COMPILED_AUTOGRAD = ("torch._dynamo.compiled_autograd", "compiled_autograd_enabled")

# nn.Module's instance attributes the agents read (a module's parameters and children, and
# weight_norm's pre-hooks: the parameter a late one replaced).
MODULE_ATTRIBUTES = ("_parameters", "_modules", "_forward_pre_hooks")


def _lookup(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name)


def missing() -> list[str]:
    """The required names this torch lacks, each as module.name."""
    out = []
    for module, name, _ in REQUIRED:
        try:
            _lookup(module, name)
        except (ImportError, AttributeError):
            out.append(f"{module}.{name}")
    try:
        import torch.nn as nn

        m = nn.Module()
        out.extend(f"torch.nn.Module.{a}" for a in MODULE_ATTRIBUTES if not hasattr(m, a))
    except ImportError:
        out.append("torch.nn")
    return out


def optional(module: str, name: str) -> Optional[Any]:
    """An OPTIONAL name, or None where this torch does not have it."""
    assert any(m == module and n == name for m, n, _ in OPTIONAL), f"{module}.{name} is not declared"
    try:
        return _lookup(module, name)
    except (ImportError, AttributeError):
        return None


_mode_stack: list = []


def function_mode_stack() -> Tuple[Callable[[], int], Callable[[], Any], Callable[[Any], None]]:
    """(depth, pop, push) of torch's function-mode stack (looked up once)."""
    if not _mode_stack:
        _mode_stack.append((_lookup("torch._C", "_len_torch_function_stack"),
                            _lookup("torch.overrides", "_pop_mode"),
                            _lookup("torch.overrides", "_push_mode")))
    return _mode_stack[0]


_graph_task_id: list = []


def current_graph_task_id() -> Callable[[], int]:
    """torch._C._current_graph_task_id (looked up once): it returns -1 outside autograd's engine."""
    if not _graph_task_id:
        _graph_task_id.append(_lookup("torch._C", "_current_graph_task_id"))
    return _graph_task_id[0]


def compiled_autograd_on() -> bool:
    """Whether a backward beginning now runs under compiled autograd: its module's flag, set by
    torch._dynamo.compiled_autograd._enable (which torch.compile also enters for a backward
    inside a compiled function under torch._dynamo.config.compiled_autograd); read off the
    module if torch imported it, nothing imported here."""
    module, name = COMPILED_AUTOGRAD
    ca = sys.modules.get(module)
    return ca is not None and bool(getattr(ca, name, False))
