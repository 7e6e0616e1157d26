"""Every private PyTorch FSDP2 name shardscope.fsdp relies on, in one place.

FSDP2 (``torch.distributed.fsdp.fully_shard``) keeps its state in private classes of
``torch.distributed.fsdp._fully_shard``: one ``FSDPState`` per ``fully_shard`` call, holding
``FSDPParamGroup``\\ s (the parameters communicated together), each holding ``FSDPParam``\\ s.
The agent wraps methods of these classes (at class level, so that modules sharded before
``install()`` are observed as well: FSDP calls them as ``self.method(...)``) and reads the
attributes below. ``check()`` verifies all of them at ``install()``/``attach()``: a torch
that lacks one is refused with a message naming it, and nothing is patched.
"""

import importlib
import warnings

from . import ShardScopeError

# torch releases the agent was tested on (tests/fsdp, docs/fsdp.md).
TESTED_TORCH = ("2.13",)

_PKG = "torch.distributed.fsdp._fully_shard."

# (module, class, method): the methods wrapped, and what each tells the agent.
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
    # the root's forward begins (a step begins) / ends (the root's post-forward calls it)
    ("_fsdp_state", "FSDPState", "_root_pre_forward"),
    ("_fsdp_state", "FSDPState", "_force_complete_incomplete_states"),
    # the end of backward (queued by the first pre-backward; looked up on the instance then)
    ("_fsdp_state", "FSDPState", "_root_post_backward_final_callback"),
    # FSDP finds the root and checks for parameters shared by two groups (tied weights)
    ("_fsdp_state", "FSDPState", "_lazy_init"),
    ("_fsdp_state", "FSDPState", "_validate_no_duplicate_params"),
)

# Attributes read (not wrapped), by class; checked on the first objects the agent meets.
# Also read where present (set by FSDP's lazy init, the root's first forward):
# FSDPParam._param_fqn, .orig_dtype, .param_dtype, ._unsharded_param.
PRIVATE_ATTRIBUTES = {
    "FSDPState": ("_fsdp_param_groups", "_modules", "_is_root"),
    "FSDPParamGroup": ("fsdp_params", "modules", "_all_gather_result", "is_unsharded",
                       "is_sharded", "_reshard_after_forward", "mesh_info", "_training_state"),
    "FSDPParam": ("sharded_param", "_orig_size", "padded_sharded_param_size", "sharded_size",
                  "fsdp_placement", "_orig_param_uid"),
}

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


def torch_version():
    import torch

    return torch.__version__.split("+")[0]


def _class(module, cls):
    return getattr(importlib.import_module(_PKG + module), cls)


def check():
    """Raises ShardScopeError naming what this torch lacks; warns outside the tested range.
    Returns the torch version."""
    try:
        import torch
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
        if method not in c.__dict__:
            missing.append(f"{_PKG}{module}.{cls}.{method}")
    try:
        getattr(importlib.import_module(_PKG + STATE_OF[0]), STATE_OF[1])
    except (ImportError, AttributeError):
        missing.append(_PKG + ".".join(STATE_OF))
    if missing:
        raise ShardScopeError(
            f"shardscope.fsdp cannot observe FSDP2 in torch {version}: "
            f"{', '.join(sorted(set(missing)))} does not exist. It is tested on torch "
            f"{', '.join(TESTED_TORCH)}; FSDP1 (FullyShardedDataParallel) is not inspected")
    if not any(version.startswith(t) for t in TESTED_TORCH):
        warnings.warn(f"shardscope.fsdp is tested on torch {', '.join(TESTED_TORCH)}, not "
                      f"{version}; every FSDP2 method it observes is there, so it runs",
                      stacklevel=3)
    return version


def check_attributes(kind, obj):
    """Raises ShardScopeError when an FSDP object lacks an attribute the agent reads."""
    for name in PRIVATE_ATTRIBUTES[kind]:
        if not hasattr(obj, name):
            raise ShardScopeError(
                f"shardscope.fsdp cannot read {kind}.{name} in torch {torch_version()}; it is "
                f"tested on torch {', '.join(TESTED_TORCH)}")


def state_of(module):
    """The FSDPState of a module fully_shard was called on, or None."""
    return getattr(importlib.import_module(_PKG + STATE_OF[0]), STATE_OF[1])(module)


def install(observer):
    """Wraps HOOKS so that each calls observer.on_<method>(original, self, *args); returns the
    function that restores the originals."""
    restored = []
    for module, cls, method in HOOKS:
        c = _class(module, cls)
        original = c.__dict__[method]
        handler = getattr(observer, "on" + method if method.startswith("_") else "on_" + method)
        if isinstance(original, staticmethod):
            fn = original.__func__

            def wrapper(*args, __fn=fn, __h=handler, **kwargs):
                return __h(__fn, *args, **kwargs)

            setattr(c, method, staticmethod(wrapper))
        else:

            def wrapper(self, *args, __fn=original, __h=handler, **kwargs):
                return __h(__fn, self, *args, **kwargs)

            wrapper.__name__ = method
            wrapper.__qualname__ = f"{cls}.{method}"
            setattr(c, method, wrapper)
        restored.append((c, method, original))

    def uninstall():
        for c, method, original in reversed(restored):
            setattr(c, method, original)

    return uninstall
