"""Every private PyTorch FSDP2 name shardscope.fsdp relies on, in one place.

FSDP2 (``torch.distributed.fsdp.fully_shard``) keeps its state in private classes of
``torch.distributed.fsdp._fully_shard``: one ``FSDPState`` per ``fully_shard`` call, holding
``FSDPParamGroup``\\ s (the parameters communicated together), each holding ``FSDPParam``\\ s.
The agent wraps methods of these classes (at class level, so that modules sharded before
``install()`` are observed as well: FSDP calls them as ``self.method(...)``) and reads the
attributes below. ``check()`` verifies all of them at ``install()``/``attach()``: a torch
that lacks one is refused with a message naming it, and nothing is patched.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from typing import Any

from . import ShardScopeError

# torch releases the agent was tested on (tests/fsdp, docs/fsdp.md).
# 2.13 in CI (python/requirements.txt); 2.11 by tests/fsdp/tst_fsdpagent with
# SHARDSCOPE_FSDP_PYTHON (CPU, gloo) and by scripts/gpu-check on an H200 (CUDA, NCCL).
TESTED_TORCH = ("2.11", "2.13", "2.14", "2.15")

_PKG = "torch.distributed.fsdp._fully_shard."

# (module, class, method): the methods wrapped, and what each tells the agent. A method may be
# a tuple of names: the first one this torch has is wrapped (torch moved some of them between
# releases; each alternative's handler is on_<that name>).
HOOKS = (
    # fully_shard(module) initialises the module's state: the last one is the root candidate
    ("_fsdp_state", "FSDPState", "init"),
    # an all-gather issued for a group (its parameters begin to be gathered)
    ("_fsdp_param_group", "FSDPParamGroup", "unshard"),
    # the group's parameters are unsharded (registered as plain tensors)
    ("_fsdp_param_group", "FSDPParamGroup", "_to_unsharded"),
    # the group's parameters are resharded (the sharded DTensors registered again)
    ("_fsdp_param_group", "FSDPParamGroup", "_to_sharded"),
    ("_fsdp_param_group", "FSDPParamGroup", "_to_sharded_post_forward"),
    # forward scope of the group's module; its unshard's cause is `forward`
    ("_fsdp_param_group", "FSDPParamGroup", "pre_forward"),
    ("_fsdp_param_group", "FSDPParamGroup", "post_forward"),
    # backward scope; its unshard's cause is `backward`; post_backward reduce-scatters
    ("_fsdp_param_group", "FSDPParamGroup", "pre_backward"),
    ("_fsdp_param_group", "FSDPParamGroup", "post_backward"),
    # a staticmethod: unshards issued inside it are prefetches
    ("_fsdp_param_group", "FSDPParamGroup", "_prefetch_unshard"),
    # the root's forward begins (a step begins) / ends: the root's post-forward calls
    # _force_complete_incomplete_states (torch >= 2.13); before it, every state's post-forward
    # calls _register_pre_backward_hook, the root's while it is still the iteration's root
    ("_fsdp_state", "FSDPState", "_root_pre_forward"),
    ("_fsdp_state", "FSDPState", ("_force_complete_incomplete_states", "_register_pre_backward_hook")),
    # the end of backward (queued by the first pre-backward; looked up on the instance then)
    ("_fsdp_state", "FSDPState", "_root_post_backward_final_callback"),
    # FSDP finds the root
    ("_fsdp_state", "FSDPState", "_lazy_init"),
)

# Wrapped where this torch has them; without them the agent does the same work another way.
OPTIONAL_HOOKS = (
    # FSDP checks for parameters shared by two groups (tied weights) and raises (torch >= 2.13).
    # Older releases accept them and train each group's copy on its own: the agent then finds
    # them itself at fully_shard (FSDPState.init) and records them at the root's first forward.
    ("_fsdp_state", "FSDPState", "_validate_no_duplicate_params"),
)

# (module, function): module-level functions wrapped where FSDPParamGroup calls them (its module
# imported them by name), each calling observer.on_<function>(original, *args).
FUNCTIONS = (
    # a group's gradients reduce-scattered (post_backward): the collective is issued in it and
    # its event returned (a CUDA stream's; on the CPU it has completed on return)
    ("_fsdp_param_group", "foreach_reduce"),
    # a group's all-gather issued (unshard(), only when one is needed): the collective's begin
    ("_fsdp_param_group", "foreach_all_gather"),
)

# Attributes read (not wrapped), by class; checked on the first objects the agent meets.
# Also read where present (set by FSDP's lazy init, the root's first forward):
# FSDPParam._param_fqn, .orig_dtype, .param_dtype, ._unsharded_param; and, where torch does
# not check tied parameters itself (< 2.13), FSDPParam._module_info (.module, .param_name).
PRIVATE_ATTRIBUTES = {
    # _fsdp_param_groups (torch >= 2.13, one group per mesh) or _fsdp_param_group (before): groups()
    # _training_state: the root's is PRE_BACKWARD from its pre-backward until the final
    # callback at the end of backward (shardscope.fsdp checks it at optimizer.step())
    "FSDPState": (("_fsdp_param_groups", "_fsdp_param_group"), "_modules", "_is_root",
                  "_training_state"),
    "FSDPParamGroup": ("fsdp_params", "modules", "_all_gather_result", "is_unsharded",
                       "is_sharded", "_reshard_after_forward", "mesh_info", "_training_state"),
    "FSDPParam": ("sharded_param", "_orig_size", "padded_sharded_param_size", "sharded_size",
                  "fsdp_placement"),
}
# Read only where the hook that needs it is there (_validate_no_duplicate_params).
TIED_ATTRIBUTE = ("FSDPParam", "_orig_param_uid")

# Read where present, with a fallback where not: FSDPParam._param_fqn (the name, when the
# agent has none), .orig_dtype and .param_dtype (the all-gather's element size), and
# ._unsharded_param (the unsharded tensor, known as FSDP's own); ._module_info (.module,
# .param_name) where torch does not check tied parameters itself (< 2.13).
OPTIONAL_ATTRIBUTES = {
    "FSDPParam": ("_param_fqn", "orig_dtype", "param_dtype", "_unsharded_param", "_module_info"),
}

# Attributes set in a constructor the agent reads before it has met an object to check them
# on: (module, the constructor, the attributes it must set), read off the source at check().
# FSDPState._state_ctx, the context the states of one root share: its iter_forward_root (the
# state whose forward began the iteration: the root's pre-forward and pre-backward hooks
# tell a step's root from an inner state) and all_states (the tied-parameter check).
CONSTRUCTED_ATTRIBUTES = (
    ("_fsdp_state", "FSDPState.__init__", ("self._state_ctx",)),
    ("_fsdp_state", "FSDPStateContext.__init__", ("self.all_states", "self.iter_forward_root")),
)

# Also read by shardscope-check's memory prediction (_checkboot._record_units), after the
# first step, where present (a torch without one gives no prediction, the check runs):
# FSDPState._states_to_forward_prefetch, ._states_to_backward_prefetch (set by
# set_modules_to_forward_prefetch / set_modules_to_backward_prefetch); FSDPParamGroup
# ._use_post_forward_mesh, .post_forward_mesh_info.shard_mesh_size (reshard_after_forward=int).
PREDICTION_ATTRIBUTES = {
    "FSDPState": ("_states_to_forward_prefetch", "_states_to_backward_prefetch"),
    "FSDPParamGroup": ("_use_post_forward_mesh", "post_forward_mesh_info"),
}

# A module's FSDP state: torch.distributed.fsdp._fully_shard._fsdp_state._get_module_fsdp_state
STATE_OF = ("_fsdp_state", "_get_module_fsdp_state")

# A group's training state during its pre-backward (FSDPParamGroup._training_state), and the
# root state's from its pre-backward until the end of backward (FSDPState._training_state):
# _fsdp_common.TrainingState.PRE_BACKWARD
PRE_BACKWARD = ("_fsdp_common", "TrainingState", "PRE_BACKWARD")
_pre_backward: list = []


def group_status(group: Any) -> int:
    """SHARDED, GATHERING or UNSHARDED (the state's NOT_AVAILABLE, INFLIGHT, AVAILABLE) of an
    FSDPParamGroup, read off it (at resume(): the native path keeps it while observing)."""
    from . import _native

    if group.is_unsharded:
        return _native.PARAM_STATUS_AVAILABLE
    if group._all_gather_result is not None:
        return _native.PARAM_STATUS_INFLIGHT
    return _native.PARAM_STATUS_NOT_AVAILABLE


def iter_forward_root(state: Any) -> Any:
    """The FSDPState whose forward began this iteration (FSDPStateContext.iter_forward_root)."""
    return state._state_ctx.iter_forward_root


def all_states(state: Any) -> list:
    """Every FSDPState under state's root (FSDPStateContext.all_states)."""
    return state._state_ctx.all_states


def pre_backward_state():
    """TrainingState.PRE_BACKWARD (looked up once: read on every group's pre-backward)."""
    if not _pre_backward:
        module, cls, member = PRE_BACKWARD
        _pre_backward.append(getattr(_class(module, cls), member))
    return _pre_backward[0]


def torch_version():
    import torch

    return torch.__version__.split("+")[0]


def _class(module, cls):
    return getattr(importlib.import_module(_PKG + module), cls)


def check():
    """Raises ShardScopeError naming what this torch lacks; warns outside the tested range.
    Returns the torch version."""
    try:
        import torch  # noqa: F401  (its absence is the message below)
        import torch.distributed.fsdp as fsdp
    except ImportError as e:
        raise ShardScopeError(f"shardscope.fsdp needs PyTorch with torch.distributed ({e}); it is "
                              f"tested on torch {', '.join(TESTED_TORCH)}") from None
    version = torch_version()
    missing = []
    if not hasattr(fsdp, "fully_shard"):
        missing.append("torch.distributed.fsdp.fully_shard")
    for module, cls, method in HOOKS:
        try:
            c = _class(module, cls)
        except (ImportError, AttributeError):
            missing.append(f"{_PKG}{module}.{cls}")
            continue
        if _present(c, method) is None:
            names = method if isinstance(method, tuple) else (method,)
            missing.append(" or ".join(f"{_PKG}{module}.{cls}.{m}" for m in names))
    for module, function in FUNCTIONS + (STATE_OF,):
        try:
            getattr(importlib.import_module(_PKG + module), function)
        except (ImportError, AttributeError):
            missing.append(f"{_PKG}{module}.{function}")
    for module, dotted, attributes in CONSTRUCTED_ATTRIBUTES:
        where = f"{_PKG}{module}.{dotted}"
        try:
            cls, method = dotted.split(".")
            source = inspect.getsource(getattr(_class(module, cls), method))
        except (ImportError, AttributeError, OSError, TypeError):
            missing.append(where)
            continue
        missing.extend(f"{where} setting {a}" for a in attributes
                       if not any(a + c in source for c in (" ", ":", "=")))
    from . import _torchinternals

    missing.extend(_torchinternals.missing())
    if missing:
        raise ShardScopeError(
            f"shardscope.fsdp cannot observe FSDP2 in torch {version}: "
            f"{', '.join(sorted(set(missing)))} does not exist. It is tested on torch "
            f"{', '.join(TESTED_TORCH)}; FSDP1 (FullyShardedDataParallel) is not inspected")
    if not any(version.startswith(t) for t in TESTED_TORCH):
        warnings.warn(f"shardscope.fsdp is tested on torch {', '.join(TESTED_TORCH)}, not "
                      f"{version}; every FSDP2 method it observes is there, so it runs",
                      stacklevel=4)  # check, install_agent, install(), the user's call
    return version


def _present(c, method):
    """The name of `method` (or of the first of its alternatives) that class c defines, or None."""
    for m in method if isinstance(method, tuple) else (method,):
        if m in c.__dict__:
            return m
    return None


def check_attributes(kind, obj):
    """Raises ShardScopeError when an FSDP object lacks an attribute the agent reads."""
    for name in PRIVATE_ATTRIBUTES[kind]:
        names = name if isinstance(name, tuple) else (name,)
        if not any(hasattr(obj, n) for n in names):
            raise ShardScopeError(
                f"shardscope.fsdp cannot read {kind}.{' or '.join(names)} in torch "
                f"{torch_version()}; it is tested on torch {', '.join(TESTED_TORCH)}")


def groups(state):
    """The FSDPParamGroups of an FSDPState: several per state from torch 2.13 (one per mesh),
    at most one before."""
    gs = getattr(state, "_fsdp_param_groups", None)
    if gs is not None:
        return gs
    g = getattr(state, "_fsdp_param_group", None)
    return [g] if g is not None else []


def has_tied_check():
    """Whether this torch checks for parameters shared by two FSDP groups itself."""
    return _present(_class("_fsdp_state", "FSDPState"), OPTIONAL_HOOKS[0][2]) is not None


def state_of(module):
    """The FSDPState of a module fully_shard was called on, or None."""
    return getattr(importlib.import_module(_PKG + STATE_OF[0]), STATE_OF[1])(module)


def install(observer):
    """Wraps HOOKS and FUNCTIONS and returns the function that restores the originals. A method
    is replaced by observer.native_hook(class name, method, original), a function by
    observer.native_hook(module name, function, original), where that gives a replacement (what
    FsdpPath observes in C++); else a method is wrapped so that it calls
    observer.on_<method>(original, self, *args), a function so that it calls
    observer.on_<function>(original, *args)."""
    restored = []
    for module, cls, method in HOOKS + OPTIONAL_HOOKS:
        c = _class(module, cls)
        method = _present(c, method)
        if method is None:  # an optional hook this torch does not have
            continue
        original = c.__dict__[method]
        static = isinstance(original, staticmethod)
        fn = original.__func__ if static else original
        wrapper = observer.native_hook(cls, method, fn)
        if wrapper is None:
            handler = getattr(observer, "on" + method if method.startswith("_") else "on_" + method)
            if static:

                def wrapper(*args, __fn=fn, __h=handler, **kwargs):
                    return __h(__fn, *args, **kwargs)

            else:

                def wrapper(self, *args, __fn=original, __h=handler, **kwargs):
                    return __h(__fn, self, *args, **kwargs)

                wrapper.__name__ = method
                wrapper.__qualname__ = f"{cls}.{method}"
        setattr(c, method, staticmethod(wrapper) if static else wrapper)
        restored.append((c, method, original))

    for module, function in FUNCTIONS:
        m = importlib.import_module(_PKG + module)
        original = getattr(m, function)
        wrapper = observer.native_hook(module, function, original)
        if wrapper is None:
            handler = getattr(observer, "on_" + function)

            def wrapper(*args, __fn=original, __h=handler, **kwargs):
                return __h(__fn, *args, **kwargs)

            wrapper.__name__ = function
        setattr(m, function, wrapper)
        restored.append((m, function, original))

    def uninstall():
        for c, method, original in reversed(restored):
            setattr(c, method, original)

    return uninstall
