"""Every private DeepSpeed name the agent relies on, and nothing else.

These are internals of DeepSpeed's ZeRO-3 (``deepspeed/runtime/zero``) and of
``DeepSpeedEngine``; they change between releases, so at install the agent checks that every
hook it needs is there with the parameters it calls it with (``HOOKS``), refuses a release
that lacks one (naming it) instead of observing it wrongly, and warns on a release outside
the tested range (``TESTED_VERSIONS``). Each
patch wraps the original and calls it unchanged: the agent observes, it never changes what
DeepSpeed does, except that ``guard="error"`` raises before DeepSpeed's silent automatic
registration.

What is observed where (DeepSpeed 0.16.9 and 0.19.8; 0.14.5 had the same hooks):

- status changes (``ds_status``): every assignment, wherever DeepSpeed makes it, through a
  data descriptor on the converted parameters' class (``torch.nn.Parameter``) that keeps the
  value in the instance dict as before (reads, ``hasattr`` and ``del`` behave unchanged);
- ``ds_active_sub_modules``: read when a step ends and when the agent flushes (not per change);
  it holds modules' ``ds_id`` since 0.16.4 (``id`` before: ``module_key_attribute``);
- ``Init._zero_init_param``: a parameter converted (``zero.Init``, or adoption of late
  parameters by ``deepspeed.initialize``);
- ``Init._post_init_method``: a module built under ``zero.Init``;
  ``InsertPostInitMethodToModuleSubClasses.__exit__``: the end of ``zero.Init``;
- ``ZeROOrderedDict.__getitem__``: reads of parameters by attribute after
  ``deepspeed.initialize`` (where DeepSpeed registers external parameters automatically);
  before it, modules built under ``zero.Init`` get an observing ``_parameters`` dict of the
  container's own class (a plain ``dict`` on torch >= 2.5, an ``OrderedDict`` before), which
  DeepSpeed's ``_inject_parameters`` / ``ensure_zero_ordered_dict`` later replace;
- ``register_external_parameter`` / ``unregister_external_parameter`` (module globals of
  ``partition_parameters`` and ``parameter_offload``, and ``deepspeed.zero``);
- ``DeepSpeedZeRoOffload.{pre,post}_sub_module_{forward,backward}_function``: module scopes;
- ``PartitionedParameterCoordinator._invalidate_trace`` (called by ``trace_prologue``):
  trace invalidation, with its private ``__submodule_order`` and ``__step_id``;
- ``GatheredParameters.__enter__`` / ``__exit__`` (``params``, ``src_rank``);
- ``DeepSpeedEngine.forward`` / ``backward`` / ``step``: steps and the loss;
  ``DeepSpeedEngine._backward_post_hook`` (present from 0.18.3, when a plain
  ``loss.backward()`` became supported) and ``_running_engine_backward``: the loss of a plain
  ``loss.backward()``, kept by the pass-through wrapper of ``torch.Tensor.backward`` every
  agent shares (``_runtime.watch_backward``);
- ``DeepSpeedZeRoOffload._convert_to_zero_parameters``: late parameters adopted;
- ``deepspeed.initialize``: the engine to attach to;
- checkpoints (docs/deepspeed.md, "Checkpoints"): ``torch.nn.Module.state_dict`` and
  ``load_state_dict`` (torch's, public: a state dict of ZeRO-3's placeholders taken, full
  tensors loaded into them) and ``DeepSpeedEngine.load_checkpoint`` (a resume at another
  data-parallel world size; the checkpoint's world is counted from its
  ``zero_pp_rank_<dp>_mp_rank_<mp>_optim_states.pt`` files, and the run's is
  ``seq_dp_world_size``, what DeepSpeed compares).
"""

from __future__ import annotations

import inspect
import sys
import warnings
from collections import OrderedDict
from typing import Any, Callable, Optional

from . import _native

# The DeepSpeed releases the agent is tested on, newest first (the tests run each one:
# tests/deepspeed/CMakeLists.txt; scripts/deps installs them; the first is the one pinned in
# python/requirements.txt). Another release is not refused: check_version() checks every
# hook below and runs with a warning if they are all there.
TESTED_VERSIONS = ("0.19.8", "0.16.9")
# The torch releases they were tested on: 2.13 by the whole suite (python/requirements.txt),
# 2.14 and 2.15 by scripts/matrix (docs/deepspeed.md, "Tested releases").
TESTED_TORCH = ("2.13", "2.14", "2.15")

# deepspeed.runtime.zero.partition_parameters.ZeroParamStatus values -> ShardScope's status
# numbers: the engine's ParamStatus (engine/base/types.h), whose names are ZeRO's, exported by
# the native module.
STATUS_NAMES = _native.PARAM_STATUSES

_ZERO = "deepspeed.runtime.zero."
# Stage 3's reduce-scatter of a bucket of gradients, name-mangled (Patched._gradient_reduce_scatters).
STAGE3_REDUCE = "DeepSpeedZeroOptimizer_Stage3._DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads"
# Every DeepSpeed function the agent wraps or reads, with the parameters it calls it with
# (None: any; the agent passes what it was given). check_hooks() checks each.
HOOKS = (
    (_ZERO + "partition_parameters", "Init._zero_init_param", ("self", "param")),
    (_ZERO + "partition_parameters", "Init._post_init_method", ("self", "module")),
    (_ZERO + "partition_parameters", "InsertPostInitMethodToModuleSubClasses.__exit__",
     ("self", "exc_type", "exc_value", "traceback")),
    (_ZERO + "partition_parameters", "register_external_parameter", ("module", "parameter")),
    (_ZERO + "partition_parameters", "unregister_external_parameter", ("module", "parameter")),
    (_ZERO + "partition_parameters", "GatheredParameters.__enter__", ("self", )),
    (_ZERO + "partition_parameters", "GatheredParameters.__exit__", None),
    (_ZERO + "partition_parameters", "ZeroParamStatus", None),
    (_ZERO + "partition_parameters", "zero_init_context", None),
    (_ZERO + "parameter_offload", "ZeROOrderedDict.__getitem__", ("self", "key")),
    (_ZERO + "parameter_offload", "FWD_MODULE_STACK", None),
    (_ZERO + "parameter_offload", "DeepSpeedZeRoOffload.pre_sub_module_forward_function",
     ("self", "sub_module")),
    (_ZERO + "parameter_offload", "DeepSpeedZeRoOffload.post_sub_module_forward_function",
     ("self", "sub_module")),
    (_ZERO + "parameter_offload", "DeepSpeedZeRoOffload.pre_sub_module_backward_function",
     ("self", "sub_module")),
    (_ZERO + "parameter_offload", "DeepSpeedZeRoOffload.post_sub_module_backward_function",
     ("self", "sub_module")),
    (_ZERO + "parameter_offload", "DeepSpeedZeRoOffload._convert_to_zero_parameters",
     ("self", "ds_config", "module", "mpu")),
    (_ZERO + "partitioned_param_coordinator", "PartitionedParameterCoordinator._invalidate_trace",
     ("self", )),
    (_ZERO + "partitioned_param_coordinator", "iter_params", None),
    # the function all_gather_coalesced issues every ZeRO-3 all-gather through (a module
    # global: replaced there, HotPath.gather_hook)
    (_ZERO + "partition_parameters", "_dist_allgather_fn", ("input_tensor", "output_tensor", "group")),
    ("deepspeed.runtime.engine", "DeepSpeedEngine.forward", None),
    ("deepspeed.runtime.engine", "DeepSpeedEngine.backward", None),
    ("deepspeed.runtime.engine", "DeepSpeedEngine.step", None),
    ("deepspeed.runtime.engine", "DeepSpeedEngine.load_checkpoint",
     ("self", "load_dir", "tag", "load_module_strict", "load_optimizer_states",
      "load_lr_scheduler_states", "load_module_only")),
    ("deepspeed", "initialize", None),
    # stage 3 reduce-scatters a bucket of gradients in backward (name-mangled; 0.16 takes
    # safe_mode and reads params_in_ipg_bucket, 0.19 takes the communication dtype and reads
    # ipg_buckets[dtype].params: reduce_bucket() tells them apart)
    (_ZERO + "stage3", STAGE3_REDUCE, None),
)
# Private attributes the agent reads, and the code that must set them.
PRIVATE_ATTRIBUTES = (
    (_ZERO + "partitioned_param_coordinator", "PartitionedParameterCoordinator.__init__",
     ("self.__submodule_order", "self.__step_id")),
    (_ZERO + "parameter_offload", "ZeROOrderedDict.__init__",
     ("self._parent_module", "self._in_forward")),
    # a module's external parameters ({id: parameter}), where register_external_parameter
    # puts them (external_params())
    (_ZERO + "partition_parameters", "_init_external_params", ("module._external_params",)),
    # the engine's DeepSpeedConfig, whose zero_config the agent shows (zero_config())
    ("deepspeed.runtime.engine", "DeepSpeedEngine.__init__", ("self._config",)),
)

# A ZeRO checkpoint's partition files, one per data-parallel rank (and model-parallel rank):
# DeepSpeedEngine._get_rank_zero_ckpt_name's names (bf16_ in bf16 mode).
ZERO_PARTITION_FILE = r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$"


def deepspeed_version():
    """DeepSpeed's version; ShardScopeError saying what to install when this Python has no
    DeepSpeed (a Transformers or Accelerate script run without it) or no torch."""
    from . import ShardScopeError

    try:
        import deepspeed
    except ImportError as e:  # ModuleNotFoundError, or DeepSpeed's own import failing
        missing = getattr(e, "name", None) or ""
        what = ("torch" if missing == "torch" else
                "DeepSpeed" if missing in ("deepspeed", "") else f"DeepSpeed's dependency {missing}")
        raise ShardScopeError(
            f"shardscope.deepspeed needs DeepSpeed, and {sys.executable} cannot import it "
            f"({what} is missing: {e}). Install DeepSpeed {TESTED_VERSIONS[0]} into this Python "
            f"(pip install deepspeed=={TESTED_VERSIONS[0]}; scripts/deps does it for the "
            f"project's .venv), or run the script with the Python that has it; a run without "
            f"DeepSpeed (plain PyTorch, FSDP) has nothing for this agent to observe.") from None
    return getattr(deepspeed, "__version__", "unknown")


def _release(version):
    """(major, minor, patch) of a version string, or None."""
    parts = version.split("+")[0].split(".")[:3]
    try:
        return tuple(int("".join(c for c in p if c.isdigit()) or "x") for p in parts)
    except ValueError:
        return None


def _resolve(module_name, dotted):
    import importlib

    obj = importlib.import_module(module_name)
    for part in dotted.split("."):
        obj = obj.__dict__[part] if isinstance(obj, type) and part in obj.__dict__ else getattr(obj, part)
    return obj


def check_hooks():
    """What of HOOKS and PRIVATE_ATTRIBUTES this DeepSpeed lacks: one sentence each."""
    problems = []
    for module_name, dotted, params in HOOKS:
        where = f"{module_name}.{dotted}"
        try:
            obj = _resolve(module_name, dotted)
        except (ImportError, AttributeError, KeyError):
            problems.append(f"{where} does not exist")
            continue
        if params is None:
            continue
        try:
            have = list(inspect.signature(obj).parameters.values())
        except (TypeError, ValueError):
            continue  # a builtin: nothing to compare
        names = [p.name for p in have if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = [p.name for p in have if p.default is p.empty and
                    p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if names[:len(params)] != list(params) or len(required) > len(params):
            problems.append(f"{where} takes ({', '.join(p.name for p in have)}), not "
                            f"({', '.join(params)})")
    from . import _torchinternals

    problems.extend(f"{name} does not exist" for name in _torchinternals.missing())
    for module_name, dotted, attributes in PRIVATE_ATTRIBUTES:
        where = f"{module_name}.{dotted}"
        try:
            source = inspect.getsource(_resolve(module_name, dotted))
        except (ImportError, AttributeError, KeyError, OSError, TypeError):
            problems.append(f"{where} cannot be read")
            continue
        for a in attributes:
            if a + " " not in source and a + ":" not in source and a + "=" not in source:
                problems.append(f"{where} no longer sets {a}")
    return problems


def check_version():
    """Checks this DeepSpeed and torch: raises ShardScopeError naming the first hook the agent
    needs and this DeepSpeed lacks; warns, naming the tested releases, when every hook is there
    but the release was not tested. Returns DeepSpeed's version."""
    from . import ShardScopeError

    version = deepspeed_version()
    tested = ", ".join(TESTED_VERSIONS)
    problems = check_hooks()
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ShardScopeError(
            f"shardscope.deepspeed cannot observe DeepSpeed {version}: {problems[0]}{more}. It is "
            f"tested on DeepSpeed {tested}; run one of those, or leave the agent out of this "
            f"run.")
    import torch

    torch_version = torch.__version__.split("+")[0]
    untested = []
    if version.split("+")[0] not in TESTED_VERSIONS:
        untested.append(f"DeepSpeed {version}")
    if ".".join(torch_version.split(".")[:2]) not in TESTED_TORCH:
        untested.append(f"torch {torch_version}")
    if untested:
        warnings.warn(
            f"shardscope.deepspeed is untested on {' and '.join(untested)} (tested: DeepSpeed "
            f"{tested} on torch {', '.join(TESTED_TORCH)}); every DeepSpeed hook it needs is "
            f"there, so it runs. If what it shows looks wrong, compare with a tested release.",
            stacklevel=4)  # check_version, install_agent, install(), the user's call
    return version


def module_key_attribute(version):
    """The module attribute DeepSpeed puts in a parameter's ds_active_sub_modules: ds_id since
    0.16.4 (deepspeed#6894), id before."""
    release = _release(version)
    return "ds_id" if release is None or release >= (0, 16, 4) else "id"


def status_number(ds_status):
    return STATUS_NAMES.get(getattr(ds_status, "name", ""), _native.PARAM_STATUS_NOT_AVAILABLE)


def native_names():
    """The DeepSpeed attribute names the native hot path reads and writes (hotpath.cpp takes
    them from here, so that every DeepSpeed name stays in this file): a converted parameter's
    status, id, active sub-modules and ZeRO++ hpZ secondary partition, the engine's step
    counter, and backward's loss argument."""
    return {"status": "ds_status", "id": "ds_id", "active": "ds_active_sub_modules",
            "secondary": "ds_secondary_tensor", "global_steps": "global_steps", "loss": "loss"}


def zero_config(engine: Any) -> Any:
    """The engine's ZeRO config (DeepSpeedEngine._config.zero_config), or None."""
    return getattr(getattr(engine, "_config", None), "zero_config", None)


def external_params(module: Any) -> list:
    """The parameters registered as external to module (register_external_parameter)."""
    return list(getattr(module, "_external_params", {}).values())


def has_hpz_group(param):
    """The parameter has a ZeRO++ hpZ secondary group (zero_hpz_partition_size > 1): DeepSpeed
    gives it a secondary partition (ds_secondary_tensor) at its releases."""
    return param.__dict__.get("ds_zero_param_process_group") is not None


def status_members() -> tuple[Any, Any, Any]:
    """ZeroParamStatus's NOT_AVAILABLE, INFLIGHT, AVAILABLE: the native hot path compares
    statuses with them by identity."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    not_available, inflight, available = sorted(ZeroParamStatus, key=lambda m: STATUS_NAMES[m.name])
    return not_available, inflight, available


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


def checkpoint_world(load_dir, tag):
    """(the tag's folder, the data-parallel world size a ZeRO checkpoint was saved at) for
    DeepSpeedEngine.load_checkpoint(load_dir, tag): tag None is the one the `latest` file
    names, as DeepSpeed reads it; the world is the number of data-parallel ranks with a
    partition file there. 0 where it cannot be told (no such folder, no partition file)."""
    import os
    import re

    try:
        if tag is None:
            with open(os.path.join(load_dir, "latest")) as f:
                tag = f.read().strip()
        folder = os.path.join(load_dir, str(tag))
        names = os.listdir(folder)
    except (OSError, TypeError):
        return "", 0
    pattern = re.compile(ZERO_PARTITION_FILE)
    ranks = {m.group(1) for m in map(pattern.match, names) if m is not None}
    return folder, len(ranks)


def reduce_bucket(optimizer, args, kwargs):
    """(parameters, communication dtype) of the bucket stage 3's
    __reduce_and_partition_ipg_grads(*args, **kwargs) is about to reduce-scatter."""
    import torch

    dtype = args[0] if args else kwargs.get("communication_data_type")
    buckets = getattr(optimizer, "ipg_buckets", None)
    if isinstance(dtype, torch.dtype) and buckets is not None:  # DeepSpeed >= 0.17
        bucket = buckets.get(dtype) if hasattr(buckets, "get") else buckets[dtype]
        return list(getattr(bucket, "params", ()) or ()), dtype
    return (list(getattr(optimizer, "params_in_ipg_bucket", ()) or ()),
            getattr(optimizer, "communication_data_type", None))


def bucketed_params(optimizer):
    """The parameters whose gradients stage 3's reduce buckets hold now (none once a backward
    has finished: its epilogue reduce-scatters them); [] for an optimizer that is not stage 3's."""
    buckets = getattr(optimizer, "ipg_buckets", None)
    if isinstance(buckets, dict):  # DeepSpeed >= 0.17: a bucket per communication dtype
        return [p for bucket in buckets.values() for p in (getattr(bucket, "params", ()) or ())]
    return list(getattr(optimizer, "params_in_ipg_bucket", ()) or ())


def observed_getitem(getitem, hook):
    """ZeROOrderedDict.__getitem__ as the agent installs it: the native hook (HotPath) in eager
    code, and DeepSpeed's own `getitem` while torch.compile's dynamo traces. Dynamo cannot
    subscript through a native __getitem__: it gave up on the whole frame and ran it eagerly,
    so a read DeepSpeed leaves unregistered under compile (`torch.compiler.is_compiling()`)
    was registered and gathered, and a model that fails under compile without the agent ran
    with it. Here dynamo inlines DeepSpeed's function as it does without the agent; a read it
    traces is not observed (it never reaches DeepSpeed's eager path either)."""
    import torch

    is_compiling = torch.compiler.is_compiling

    def __getitem__(self, key):
        if is_compiling():
            return getitem(self, key)
        return hook(self, key)

    return __getitem__


def install(observer: Any) -> Patched:
    """Patches DeepSpeed for observer (shardscope.deepspeed._Agent); returns the Patched
    whose uninstall() restores DeepSpeed."""
    return Patched(observer)


class Patched:
    """DeepSpeed as the agent observes it: each method below patches one concern of HOOKS
    (each patch wraps the original and calls it unchanged), and pause(), resume() and
    uninstall() take them out and put them back. Nothing is attached to the observer: the
    agent holds this object (``agent.ds``)."""

    def __init__(self, observer: Any) -> None:
        import torch
        from deepspeed.runtime.zero import partition_parameters
        from deepspeed.runtime.zero import partitioned_param_coordinator as coordinator_mod

        self.observer = observer
        self.patches = _Patches()
        self.NOT_AVAILABLE = partition_parameters.ZeroParamStatus.NOT_AVAILABLE
        self.is_compiling = torch.compiler.is_compiling
        # ds_status, observed: a data descriptor (native: HotPath) on the converted
        # parameters' own class, torch.nn.Parameter, so that every assignment is seen and
        # reads behave as the instance attribute they were. Not a subclass per parameter:
        # torch's fast path holds only for an exact Parameter, and every op on a subclass's
        # instance looks up __torch_function__ (docs/performance.md, section 10).
        self.status_descriptor = observer.hot.status_descriptor()
        self.observed_classes: dict = {}  # class given the descriptor -> its own ds_status
        self.keep_loss: Optional[Callable[[Any], Any]] = None
        self.unwatch_backward: Optional[Callable[[], None]] = None
        self.iter_params = coordinator_mod.iter_params  # a module's parameters, as ZeRO-3 walks them
        for patch in (self._zero_init, self._parameter_reads, self._external_parameters,
                      self._module_scopes, self._trace_invalidation, self._gathered_parameters,
                      self._steps, self._deepcompile, self._plain_backward,
                      self._late_parameters_and_engine, self._gradient_reduce_scatters,
                      self._gather_collectives,
                      self._checkpoints):
            patch()

    # ---- what the agent calls
    def is_not_available(self, param: Any) -> bool:
        return param.__dict__.get("ds_status") is self.NOT_AVAILABLE

    def adopt_param(self, param: Any) -> None:
        """Observes the ds_status of param's class (a parameter converted before install())."""
        cls = type(param)
        if cls in self.observed_classes or getattr(cls, "ds_status", None) is self.status_descriptor:
            return
        previous = cls.__dict__.get("ds_status", _MISSING)
        try:
            setattr(cls, "ds_status", self.status_descriptor)
        except (TypeError, AttributeError):
            self.observer.on_unobservable_class(cls)
            return
        self.observed_classes[cls] = previous

    def _unobserve_classes(self) -> None:
        for cls, previous in self.observed_classes.items():
            if cls.__dict__.get("ds_status") is not self.status_descriptor:
                continue  # already taken out (pause, then uninstall)
            if previous is _MISSING:
                delattr(cls, "ds_status")
            else:
                setattr(cls, "ds_status", previous)

    def pause(self) -> None:
        """DeepSpeed's own code again: every patch out, ds_status a plain attribute."""
        self.patches.unapply()
        if self.unwatch_backward is not None:
            self.unwatch_backward()
            self.unwatch_backward = None
        self._unobserve_classes()

    def resume(self) -> None:
        self.patches.apply()
        if self.keep_loss is not None and self.unwatch_backward is None:
            from . import _runtime

            self.unwatch_backward = _runtime.watch_backward(self.keep_loss)
        for cls in self.observed_classes:
            setattr(cls, "ds_status", self.status_descriptor)

    def uninstall(self) -> None:
        self.patches.restore()
        if self.unwatch_backward is not None:
            self.unwatch_backward()
            self.unwatch_backward = None
        self._unobserve_classes()
        self.observed_classes.clear()

    # ---- zero.Init: conversion, modules built, end of the context
    def _zero_init(self) -> None:
        from deepspeed.runtime.zero import partition_parameters

        observer, patches, adopt_param = self.observer, self.patches, self.adopt_param
        Init = partition_parameters.Init
        InsertPost = partition_parameters.InsertPostInitMethodToModuleSubClasses
        zero_init_param = Init._zero_init_param

        def _zero_init_param(self, param):
            zero_init_param(self, param)
            adopt_param(param)
            observer.on_param_converted(param)

        patches.replace(Init, "_zero_init_param", _zero_init_param)

        post_init = Init._post_init_method
        build_time_classes = self.build_time_classes = {
            base: self._build_time_parameters(base) for base in (dict, OrderedDict)}

        def _post_init_method(self, module):
            post_init(self, module)
            wrap = build_time_classes.get(type(module._parameters))
            if wrap is not None:
                module._parameters = wrap(module, module._parameters)
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
    def _build_time_parameters(self, base: type) -> type:
        """A module's _parameters under zero.Init, until deepspeed.initialize replaces it
        with DeepSpeed's ZeROOrderedDict: reads of partitioned parameters are observed. Of
        the container's own class: an OrderedDict before torch 2.5, a plain dict since
        (pytorch/pytorch#129164)."""
        observer, is_not_available = self.observer, self.is_not_available

        class BuildTimeParameters(base):

            def __init__(self, module, items):
                super().__init__(items)
                self._shardscope_module = module

            def __getitem__(self, key):
                param = base.__getitem__(self, key)  # type: ignore[index]
                if param is not None and "ds_id" in param.__dict__:
                    param.__dict__["_shardscope_seen_as"] = (self._shardscope_module, key)
                    if is_not_available(param):
                        observer.on_param_read(self._shardscope_module, key, param, False)
                return param

            def __reduce__(self):
                return (base, (list(self.items()), ))

        return BuildTimeParameters

    def _parameter_reads(self) -> None:
        from deepspeed.runtime.zero import parameter_offload

        observer = self.observer
        ZeROOrderedDict = parameter_offload.ZeROOrderedDict
        getitem = ZeROOrderedDict.__getitem__

        def zero_getitem_not_available(self, key, param):
            """ZeROOrderedDict.__getitem__ of a NOT_AVAILABLE parameter (the native hook's slow
            path; every other read goes straight to DeepSpeed's)."""
            # Raises under guard="error" before DeepSpeed registers it silently.
            observer.on_param_read(self._parent_module, key, param,
                                   bool(self._parent_module._parameters._in_forward))
            with observer.automatic_registration():
                return getitem(self, key)

        self.patches.replace(
            ZeROOrderedDict, "__getitem__",
            observed_getitem(getitem, observer.hot.getitem_hook(getitem, zero_getitem_not_available)))

    # ---- external parameters
    def _external_parameters(self) -> None:
        from deepspeed.runtime import zero as ds_zero
        from deepspeed.runtime.zero import parameter_offload, partition_parameters

        observer, is_compiling = self.observer, self.is_compiling
        register = partition_parameters.register_external_parameter
        unregister = partition_parameters.unregister_external_parameter

        # DeepSpeed before 0.19.3 registers a read while torch.compile's dynamo traces it
        # (ZeROOrderedDict.__getitem__ has no is_compiling() check there): dynamo then traces
        # DeepSpeed's function alone, as without the agent (through the agent's, it failed
        # with an error of its own where DeepSpeed fails later with another).
        def register_external_parameter(module, parameter):
            if is_compiling():
                return register(module, parameter)
            register(module, parameter)
            observer.on_register_external(module, parameter)

        def unregister_external_parameter(module, parameter):
            if is_compiling():
                return unregister(module, parameter)
            unregister(module, parameter)
            observer.on_unregister_external(module, parameter)

        for owner in (partition_parameters, parameter_offload, ds_zero):
            self.patches.replace(owner, "register_external_parameter", register_external_parameter)
            self.patches.replace(owner, "unregister_external_parameter", unregister_external_parameter)

    # ---- module scopes (native hooks: HotPath keeps the scope stack and the fetching
    # module's own parameters)
    def _module_scopes(self) -> None:
        from deepspeed.runtime.zero import parameter_offload

        Offload = parameter_offload.DeepSpeedZeRoOffload
        phases = self.observer.PHASES
        for name, phase, begin in (("pre_sub_module_forward_function", "forward", True),
                                   ("post_sub_module_forward_function", "forward", False),
                                   ("pre_sub_module_backward_function", "backward", True),
                                   ("post_sub_module_backward_function", "backward", False)):
            hook = self.observer.hot.scope_hook(getattr(Offload, name), phases[phase], begin)
            self.patches.replace(Offload, name, hook)

    # ---- trace invalidation (the coordinator's private trace); trace_prologue calls it for
    # the module being entered, which is the observer's innermost scope by then
    def _trace_invalidation(self) -> None:
        from deepspeed.runtime.zero import partitioned_param_coordinator as coordinator_mod

        observer = self.observer
        Coordinator = coordinator_mod.PartitionedParameterCoordinator
        invalidate_trace = Coordinator._invalidate_trace

        def _invalidate_trace(self):
            order = self._PartitionedParameterCoordinator__submodule_order
            step_id = self._PartitionedParameterCoordinator__step_id
            observer.on_trace_invalidated(order[step_id] if len(order) > step_id else None)
            return invalidate_trace(self)

        self.patches.replace(Coordinator, "_invalidate_trace", _invalidate_trace)

    # ---- GatheredParameters
    def _gathered_parameters(self) -> None:
        from deepspeed.runtime.zero import partition_parameters

        observer = self.observer
        Gathered = partition_parameters.GatheredParameters
        gathered_enter = Gathered.__enter__
        gathered_exit = Gathered.__exit__

        def _gathered_enter(self):
            params = list(getattr(self, "params", ())) if getattr(self, "enabled", True) else []
            observer.on_gathered_enter(params)
            begun = observer.gathered_collectives(params, "all_gather")
            try:
                entered = gathered_enter(self)
            finally:
                observer.end_collectives(begun)
                observer.on_gathered_entered(params)
            observer.on_gathered_scope(params, getattr(self, "src_rank", None), True)
            return entered

        def _gathered_exit(self, *exc):
            params = list(getattr(self, "params", ())) if getattr(self, "enabled", True) else []
            observer.on_gathered_scope(params, getattr(self, "src_rank", None), False)
            src_rank = getattr(self, "src_rank", None)
            observer.on_gathered_exit(params, src_rank)
            begun = observer.gathered_collectives(params, "broadcast") if src_rank is not None else ()
            try:
                return gathered_exit(self, *exc)
            finally:
                observer.end_collectives(begun)
                observer.on_gathered_exited(params)

        self.patches.replace(Gathered, "__enter__", _gathered_enter)
        self.patches.replace(Gathered, "__exit__", _gathered_exit)

    # ---- steps (native hooks: HotPath begins a step on the engine's first forward, keeps
    # the loss handed to backward, closes the scopes backward leaves open, and ends the step
    # when step() stepped)
    def _steps(self) -> None:
        from deepspeed.runtime import engine as ds_engine

        Engine = ds_engine.DeepSpeedEngine
        for name in ("forward", "backward", "step"):
            self.patches.replace(Engine, name, self.observer.hot.engine_hook(getattr(Engine, name), name))

    # ---- engine.compile() with DeepCompile on ZeRO-3 (0.16 on): DeepSpeed takes its module
    # hooks out and gathers inside the compiled graph, where the agent does not see; the
    # observer says so before DeepSpeed compiles (docs/deepspeed.md)
    def _deepcompile(self) -> None:
        from deepspeed.runtime import engine as ds_engine

        observer = self.observer
        Engine = ds_engine.DeepSpeedEngine
        engine_compile = Engine.__dict__.get("compile")
        if engine_compile is None:
            return

        def compile(self, *args, **kwargs):
            enabled = getattr(self, "is_deepcompile_enabled", None)
            if enabled is not None and enabled() and self.zero_optimization_partition_weights():
                observer.on_deepcompile()
            return engine_compile(self, *args, **kwargs)

        self.patches.replace(Engine, "compile", compile)

    # ---- a plain loss.backward() instead of engine.backward(loss) (DeepSpeed >= 0.18.3,
    # `_support_torch_style_backward`): DeepSpeed itself sees it only through hooks on the
    # forward's outputs, which carry no loss. Tensor.backward is where the loss is named; the
    # wrapper keeps it for the step's end (engine.step closes the backward scopes left open)
    # and is a plain pass-through for every other backward and while no engine runs a step.
    # The wrapper is the one every agent shares (_runtime.watch_backward); this watcher is
    # taken out with the patches (pause, uninstall).
    def _plain_backward(self) -> None:
        from deepspeed.runtime import engine as ds_engine

        from . import _runtime

        if not hasattr(ds_engine.DeepSpeedEngine, "_backward_post_hook"):
            return
        observer = self.observer

        def keep_loss(tensor):
            engine = observer.engine
            if (engine is not None and observer.hot.in_step
                    and not getattr(engine, "_running_engine_backward", True)):
                observer.hot.set_loss(tensor)
                handling = sys.exc_info()[1]  # a backward called inside the script's except

                def after():  # in the watcher's finally: what the backward raises, if it does
                    raised = sys.exc_info()[1]
                    if raised is not None and raised is not handling:
                        observer.on_backward_raised(engine, raised)

                return after
            return None

        self.keep_loss = keep_loss
        self.unwatch_backward = _runtime.watch_backward(keep_loss)

    # ---- late parameters adopted, and the engine itself
    def _late_parameters_and_engine(self) -> None:
        import deepspeed
        from deepspeed.runtime.zero import parameter_offload

        observer = self.observer
        Offload = parameter_offload.DeepSpeedZeRoOffload
        convert = Offload._convert_to_zero_parameters

        def _convert_to_zero_parameters(self, ds_config, module, mpu):
            # Late: not partitioned while the rest of the model was (zero.Init). A model with
            # no partitioned parameter yet (built without zero.Init: DeepSpeed's
            # getting-started pattern) is partitioned here as a whole, as DeepSpeed's own code
            # tells the two apart (zero_params[0].convert_to_zero_parameters, else
            # Init(module=module)): none of its parameters is late.
            params = list(module.parameters())
            late = [p for p in params if "ds_id" not in p.__dict__]
            if len(late) == len(params):
                late = []
            result = convert(self, ds_config, module, mpu)
            observer.on_late_adopted(module, late)
            return result

        self.patches.replace(Offload, "_convert_to_zero_parameters", _convert_to_zero_parameters)

        initialize = deepspeed.initialize

        def _initialize(*args, **kwargs):
            result = initialize(*args, **kwargs)
            observer.on_initialize(result[0])
            return result

        self.patches.replace(deepspeed, "initialize", _initialize)

    # ---- gradient reduce-scatters of stage 3's buckets
    # ---- the coordinator's all-gathers: one collective_begin per batch before DeepSpeed issues
    # it (native: HotPath.gather_hook; the batch is what went INFLIGHT since the last issue)
    def _gather_collectives(self) -> None:
        from deepspeed.runtime.zero import partition_parameters

        original = partition_parameters._dist_allgather_fn
        self.patches.replace(partition_parameters, "_dist_allgather_fn",
                             self.observer.hot.gather_hook(original))

    def _gradient_reduce_scatters(self) -> None:
        from deepspeed.runtime.zero import stage3 as stage3_mod

        observer = self.observer
        Stage3 = stage3_mod.DeepSpeedZeroOptimizer_Stage3
        reduce_name = STAGE3_REDUCE.split(".", 1)[1]
        reduce_ipg = Stage3.__dict__[reduce_name]

        def _reduce_ipg(self, *args, **kwargs):
            return observer.on_reduce_ipg_grads(reduce_ipg, self, *args, **kwargs)

        self.patches.replace(Stage3, reduce_name, _reduce_ipg)


    # ---- checkpoints: torch's Module.state_dict and load_state_dict (the outermost call:
    # they recurse into each child through the same method, which passes straight through),
    # and DeepSpeedEngine.load_checkpoint. Each calls the original unchanged; the observer
    # only looks at what the call takes or gives (docs/deepspeed.md, "Checkpoints").
    def _checkpoints(self) -> None:
        import threading

        import torch
        from deepspeed.runtime import engine as ds_engine

        observer = self.observer
        Module = torch.nn.Module
        state_dict = Module.__dict__["state_dict"]
        load_state_dict = Module.__dict__["load_state_dict"]
        inside = threading.local()  # a call already being observed on this thread (recursion)

        def observed_state_dict(self, *args, **kwargs):
            if getattr(inside, "depth", 0):
                return state_dict(self, *args, **kwargs)
            inside.depth = 1
            try:
                result = state_dict(self, *args, **kwargs)
            finally:
                inside.depth = 0
            observer.on_state_dict(self, result, sys._getframe(1))
            return result

        def observed_load_state_dict(self, state_dict, *args, **kwargs):
            if getattr(inside, "depth", 0):
                return load_state_dict(self, state_dict, *args, **kwargs)
            observer.on_load_state_dict(self, state_dict, sys._getframe(1))
            inside.depth = 1
            try:
                return load_state_dict(self, state_dict, *args, **kwargs)
            finally:
                inside.depth = 0

        for new, old in ((observed_state_dict, state_dict),
                         (observed_load_state_dict, load_state_dict)):
            new.__name__, new.__qualname__, new.__doc__ = old.__name__, old.__qualname__, old.__doc__
            new.__wrapped__ = old  # type: ignore[attr-defined]
            self.patches.replace(Module, old.__name__, new)

        Engine = ds_engine.DeepSpeedEngine
        load_checkpoint = Engine.__dict__["load_checkpoint"]
        signature = inspect.signature(load_checkpoint)

        def observed_load_checkpoint(self, *args, **kwargs):
            try:
                bound = signature.bind(self, *args, **kwargs)
            except TypeError:
                bound = None  # DeepSpeed's own error, from its own call below
            if bound is not None:
                bound.apply_defaults()
                observer.on_load_checkpoint(self, bound.arguments, sys._getframe(1))
            return load_checkpoint(self, *args, **kwargs)

        observed_load_checkpoint.__name__ = load_checkpoint.__name__
        observed_load_checkpoint.__qualname__ = load_checkpoint.__qualname__
        observed_load_checkpoint.__doc__ = load_checkpoint.__doc__
        observed_load_checkpoint.__wrapped__ = load_checkpoint  # type: ignore[attr-defined]
        self.patches.replace(Engine, "load_checkpoint", observed_load_checkpoint)


_MISSING = object()
