"""Every private DeepSpeed name the agent relies on, and nothing else.

These are internals of DeepSpeed's ZeRO-3 (``deepspeed/runtime/zero``) and of
``DeepSpeedEngine``; they change between releases, so the agent refuses versions it has
not been checked against (``KNOWN_VERSIONS``) instead of observing them wrongly. Each
patch wraps the original and calls it unchanged: the agent observes, it never changes what
DeepSpeed does, except that ``guard="error"`` raises before DeepSpeed's silent automatic
registration.

What is observed where (DeepSpeed 0.14.5):

- status changes (``ds_status``): every assignment, wherever DeepSpeed makes it, through a
  data descriptor on the converted parameters' class (``torch.nn.Parameter``) that keeps the
  value in the instance dict as before (reads, ``hasattr`` and ``del`` behave unchanged);
- ``ds_active_sub_modules``: read when a step ends and when the agent flushes (not per change);
- ``Init._zero_init_param``: a parameter converted (``zero.Init``, or adoption of late
  parameters by ``deepspeed.initialize``);
- ``Init._post_init_method``: a module built under ``zero.Init``;
  ``InsertPostInitMethodToModuleSubClasses.__exit__``: the end of ``zero.Init``;
- ``ZeROOrderedDict.__getitem__``: reads of parameters by attribute after
  ``deepspeed.initialize`` (where DeepSpeed registers external parameters automatically);
  before it, modules built under ``zero.Init`` get an observing ``_parameters`` dict;
- ``register_external_parameter`` / ``unregister_external_parameter`` (module globals of
  ``partition_parameters`` and ``parameter_offload``, and ``deepspeed.zero``);
- ``DeepSpeedZeRoOffload.{pre,post}_sub_module_{forward,backward}_function``: module scopes;
- ``PartitionedParameterCoordinator._invalidate_trace`` (called by ``trace_prologue``):
  trace invalidation, with its private ``__submodule_order`` and ``__step_id``;
- ``GatheredParameters.__enter__`` / ``__exit__`` (``params``, ``src_rank``);
- ``DeepSpeedEngine.forward`` / ``backward`` / ``step``: steps and the loss;
- ``DeepSpeedZeRoOffload._convert_to_zero_parameters``: late parameters adopted;
- ``deepspeed.initialize``: the engine to attach to.
"""

from collections import OrderedDict

KNOWN_VERSIONS = ("0.14.5",)

# deepspeed.runtime.zero.partition_parameters.ZeroParamStatus values -> ShardScope's status
# numbers (0 NOT_AVAILABLE, 1 INFLIGHT, 2 AVAILABLE).
STATUS_NAMES = {"NOT_AVAILABLE": 0, "INFLIGHT": 1, "AVAILABLE": 2}


def deepspeed_version():
    import deepspeed

    return getattr(deepspeed, "__version__", "unknown")


def check_version():
    """Raises ShardScopeError naming the known versions when this DeepSpeed is not one."""
    from . import ShardScopeError

    version = deepspeed_version()
    base = version.split("+")[0]
    if base not in KNOWN_VERSIONS:
        raise ShardScopeError(
            f"shardscope.deepspeed observes DeepSpeed's ZeRO-3 internals, and knows DeepSpeed "
            f"{', '.join(KNOWN_VERSIONS)}; this is DeepSpeed {version}. Run a known version, or "
            f"leave the agent out of this run (its internals may differ).")
    return version


def status_number(ds_status):
    return STATUS_NAMES.get(getattr(ds_status, "name", ""), 0)


def native_names():
    """The DeepSpeed attribute names the native hot path reads and writes (hotpath.cpp takes
    them from here, so that every DeepSpeed name stays in this file): a converted parameter's
    status, id and active sub-modules, the engine's step counter, and backward's loss
    argument."""
    return {"status": "ds_status", "id": "ds_id", "active": "ds_active_sub_modules",
            "global_steps": "global_steps", "loss": "loss"}


def status_members():
    """ZeroParamStatus's NOT_AVAILABLE, INFLIGHT, AVAILABLE: the native hot path compares
    statuses with them by identity."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    by_number = sorted(ZeroParamStatus, key=lambda m: STATUS_NAMES[m.name])
    return tuple(by_number)


class _Patches:
    """Originals of everything patched, so that uninstall() restores them and pause() can
    take the patches out of DeepSpeed's path for a while."""

    def __init__(self):
        self._saved = []  # (owner, name, original, replacement)

    def replace(self, owner, name, new):
        if not hasattr(owner, name):
            return  # a re-export this version does not have
        self._saved.append((owner, name, owner.__dict__.get(name, getattr(owner, name)), new))
        setattr(owner, name, new)

    def unapply(self):
        for owner, name, old, _ in reversed(self._saved):
            setattr(owner, name, old)

    def apply(self):
        for owner, name, _, new in self._saved:
            setattr(owner, name, new)

    def restore(self):
        self.unapply()
        self._saved.clear()


def install(observer):
    """Patches DeepSpeed for observer (shardscope.deepspeed._Agent); returns uninstall()."""
    import torch
    import deepspeed
    from deepspeed.runtime import engine as ds_engine
    from deepspeed.runtime import zero as ds_zero
    from deepspeed.runtime.zero import parameter_offload, partition_parameters
    from deepspeed.runtime.zero import partitioned_param_coordinator as coordinator_mod

    patches = _Patches()
    Init = partition_parameters.Init
    InsertPost = partition_parameters.InsertPostInitMethodToModuleSubClasses
    ZeROOrderedDict = parameter_offload.ZeROOrderedDict
    Offload = parameter_offload.DeepSpeedZeRoOffload
    Coordinator = coordinator_mod.PartitionedParameterCoordinator
    Gathered = partition_parameters.GatheredParameters
    Engine = ds_engine.DeepSpeedEngine
    NOT_AVAILABLE = partition_parameters.ZeroParamStatus.NOT_AVAILABLE

    def is_not_available(param):
        return param.__dict__.get("ds_status") is NOT_AVAILABLE

    # ds_status, observed: a data descriptor (native: HotPath) on the converted parameters'
    # own class, torch.nn.Parameter, so that every assignment is seen and reads behave as
    # the instance attribute they were. Not a subclass per parameter: torch's fast path
    # holds only for an exact Parameter, and every op on a subclass's instance looks up
    # __torch_function__ (docs/performance.md, section 10).
    status_descriptor = observer.hot.status_descriptor()
    missing = object()
    observed_classes = {}  # class given the descriptor -> what its own ds_status was

    def observe_class(cls):
        if cls in observed_classes or getattr(cls, "ds_status", None) is status_descriptor:
            return
        previous = cls.__dict__.get("ds_status", missing)
        try:
            setattr(cls, "ds_status", status_descriptor)
        except (TypeError, AttributeError):
            observer.on_unobservable_class(cls)
            return
        observed_classes[cls] = previous

    def adopt_param(param):
        observe_class(type(param))

    def unobserve_classes():
        for cls, previous in observed_classes.items():
            if cls.__dict__.get("ds_status") is not status_descriptor:
                continue  # already taken out (pause, then uninstall)
            if previous is missing:
                delattr(cls, "ds_status")
            else:
                setattr(cls, "ds_status", previous)

    def pause():
        """DeepSpeed's own code again: every patch out, ds_status a plain attribute."""
        patches.unapply()
        unobserve_classes()

    def resume():
        patches.apply()
        for cls in observed_classes:
            setattr(cls, "ds_status", status_descriptor)

    # ---- zero.Init: conversion, modules built, end of the context
    zero_init_param = Init._zero_init_param

    def _zero_init_param(self, param):
        zero_init_param(self, param)
        adopt_param(param)
        observer.on_param_converted(param)

    patches.replace(Init, "_zero_init_param", _zero_init_param)

    post_init = Init._post_init_method

    def _post_init_method(self, module):
        post_init(self, module)
        if type(module._parameters) is OrderedDict:
            module._parameters = BuildTimeParameters(module, module._parameters)
        observer.on_module_built(module)

    patches.replace(Init, "_post_init_method", _post_init_method)

    init_exit = InsertPost.__exit__

    def __exit__(self, exc_type, exc_value, traceback):
        result = init_exit(self, exc_type, exc_value, traceback)
        if getattr(self, "enabled", True) and partition_parameters.zero_init_context == 0:
            observer.on_init_exit(exc_type is not None)
        return result

    patches.replace(InsertPost, "__exit__", __exit__)

    # ---- reads of parameters by attribute
    class BuildTimeParameters(OrderedDict):
        """A module's _parameters under zero.Init, until deepspeed.initialize replaces it
        with DeepSpeed's ZeROOrderedDict: reads of partitioned parameters are observed."""

        def __init__(self, module, items):
            super().__init__(items)
            self._shardscope_module = module

        def __getitem__(self, key):
            param = OrderedDict.__getitem__(self, key)
            if param is not None and "ds_id" in param.__dict__:
                param.__dict__["_shardscope_seen_as"] = (self._shardscope_module, key)
                if is_not_available(param):
                    observer.on_param_read(self._shardscope_module, key, param, False)
            return param

        def __reduce__(self):
            return (OrderedDict, (list(self.items()), ))

    getitem = ZeROOrderedDict.__getitem__

    def zero_getitem_not_available(self, key, param):
        """ZeROOrderedDict.__getitem__ of a NOT_AVAILABLE parameter (the native hook's slow
        path; every other read goes straight to DeepSpeed's)."""
        # Raises under guard="error" before DeepSpeed registers it silently.
        observer.on_param_read(self._parent_module, key, param,
                               bool(self._parent_module._parameters._in_forward))
        with observer.automatic_registration():
            return getitem(self, key)

    patches.replace(ZeROOrderedDict, "__getitem__",
                    observer.hot.getitem_hook(getitem, zero_getitem_not_available))

    # ---- external parameters
    register = partition_parameters.register_external_parameter
    unregister = partition_parameters.unregister_external_parameter

    def register_external_parameter(module, parameter):
        register(module, parameter)
        observer.on_register_external(module, parameter)

    def unregister_external_parameter(module, parameter):
        unregister(module, parameter)
        observer.on_unregister_external(module, parameter)

    for owner in (partition_parameters, parameter_offload, ds_zero):
        patches.replace(owner, "register_external_parameter", register_external_parameter)
        patches.replace(owner, "unregister_external_parameter", unregister_external_parameter)

    # ---- module scopes
    # (native hooks: HotPath keeps the scope stack and the fetching module's own parameters)
    forward_phase, backward_phase = observer.PHASES["forward"], observer.PHASES["backward"]
    for name, phase, begin in (("pre_sub_module_forward_function", forward_phase, True),
                               ("post_sub_module_forward_function", forward_phase, False),
                               ("pre_sub_module_backward_function", backward_phase, True),
                               ("post_sub_module_backward_function", backward_phase, False)):
        hook = observer.hot.scope_hook(getattr(Offload, name), phase, begin)
        patches.replace(Offload, name, hook)

    # ---- trace invalidation (the coordinator's private trace); trace_prologue calls it for
    # the module being entered, which is the observer's innermost scope by then
    invalidate_trace = Coordinator._invalidate_trace

    def _invalidate_trace(self):
        order = self._PartitionedParameterCoordinator__submodule_order
        step_id = self._PartitionedParameterCoordinator__step_id
        observer.on_trace_invalidated(order[step_id] if len(order) > step_id else None)
        return invalidate_trace(self)

    patches.replace(Coordinator, "_invalidate_trace", _invalidate_trace)

    # ---- GatheredParameters
    gathered_enter = Gathered.__enter__
    gathered_exit = Gathered.__exit__

    def _gathered_enter(self):
        params = list(getattr(self, "params", ())) if getattr(self, "enabled", True) else []
        observer.on_gathered_enter(params)
        try:
            return gathered_enter(self)
        finally:
            observer.on_gathered_entered(params)

    def _gathered_exit(self, *exc):
        params = list(getattr(self, "params", ())) if getattr(self, "enabled", True) else []
        observer.on_gathered_exit(params, getattr(self, "src_rank", None))
        try:
            return gathered_exit(self, *exc)
        finally:
            observer.on_gathered_exited(params)

    patches.replace(Gathered, "__enter__", _gathered_enter)
    patches.replace(Gathered, "__exit__", _gathered_exit)

    # ---- steps (native hooks: HotPath begins a step on the engine's first forward, keeps
    # the loss handed to backward, closes the scopes backward leaves open, and ends the step
    # when step() stepped)
    for name in ("forward", "backward", "step"):
        patches.replace(Engine, name, observer.hot.engine_hook(getattr(Engine, name), name))

    # ---- late parameters adopted, and the engine itself
    convert = Offload._convert_to_zero_parameters

    def _convert_to_zero_parameters(self, ds_config, module, mpu):
        late = [p for p in module.parameters() if "ds_id" not in p.__dict__]
        result = convert(self, ds_config, module, mpu)
        observer.on_late_adopted(module, late)
        return result

    patches.replace(Offload, "_convert_to_zero_parameters", _convert_to_zero_parameters)

    initialize = deepspeed.initialize

    def _initialize(*args, **kwargs):
        result = initialize(*args, **kwargs)
        observer.on_initialize(result[0])
        return result

    patches.replace(deepspeed, "initialize", _initialize)

    def uninstall():
        patches.restore()
        unobserve_classes()
        observed_classes.clear()

    observer.ds_is_not_available = is_not_available
    observer.ds_pause = pause
    observer.ds_resume = resume
    observer.ds_iter_params = coordinator_mod.iter_params
    observer.ds_fwd_module_stack = parameter_offload.FWD_MODULE_STACK
    observer.ds_torch = torch
    return uninstall
