"""One rank of `shardscope-check` (docs/check.md): installs the agent before the user's
script runs, runs it unchanged as __main__, stops it after K optimizer steps, and leaves in
the check's directory what the report is made from:

  status.<rank>   the stage it is at (one line, rewritten): the parent's progress line
  result.<rank>.json  how it ended (steps done, model built, the error), the module order
  rank<rank>.json the agent's snapshot

Run as `python -m shardscope._checkboot script.py [args]` with SHARDSCOPE_CHECK_DIR and
SHARDSCOPE_CHECK_STEPS set by shardscope-check; the torchrun variables (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, ...) come from it too.
"""
import json
import os
import sys
import time
import traceback
from typing import Any

from shardscope import _script

_dir = os.environ.get("SHARDSCOPE_CHECK_DIR", ".")
_rank = int(os.environ.get("RANK", "0"))
_steps = int(os.environ.get("SHARDSCOPE_CHECK_STEPS", "3"))
_save_check = os.environ.get("SHARDSCOPE_CHECK_SAVE") == "1"
_script_path = ""  # the script being checked (main)
# initialize: None until the script calls deepspeed.initialize, then "called" (the model
# exists: initialize takes it), "returned" once it gave the engine back.
_result: dict[str, Any] = {"rank": _rank, "steps": 0, "model_built": False, "stopped": False, "exit": None,
           "error": None, "module_order": [], "stage": "starting", "times": [],
           "late_sites": {}, "batch": None, "initialize": None}
_t0 = time.monotonic()


class _Done(BaseException):
    """Raised out of the K-th step: the script stops there (not an Exception, so the script's
    own `except Exception` does not swallow it)."""


def _stop(frame):
    """The K-th step is done: with --save-check, the script's saves run once first (their
    records are the agent's, at the script's lines: _savecheck), then the script stops."""
    _result["stopped"] = True
    if _save_check:
        from shardscope import _savecheck

        _stage("running the script's saves (--save-check)")
        _result["save_check"] = _savecheck.run_saves(frame, _script_path,
                                                     os.path.join(_dir, f"saves.{_rank}"))
    raise _Done()


def _stage(text):
    _result["stage"] = text
    _result["times"].append([text, round(time.monotonic() - _t0, 3)])
    try:
        with open(os.path.join(_dir, f"status.{_rank}.tmp"), "w") as f:
            f.write(f"{time.monotonic() - _t0:.1f} {text}\n")
        os.replace(os.path.join(_dir, f"status.{_rank}.tmp"), os.path.join(_dir, f"status.{_rank}"))
    except OSError:
        pass


def _write_result():
    path = os.path.join(_dir, f"result.{_rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(_result, f)
    os.replace(path + ".tmp", path)


def _record_order(engine):
    """The order modules run in during the first step (rank 0): what the peak-memory
    prediction at the target world walks. One forward pre-hook, for the first step only."""
    import torch

    names = {id(m): path for path, m in engine.module.named_modules()}
    seen = set()
    order = _result["module_order"]

    def pre(module, args):
        path = names.get(id(module))
        if path is None or path in seen:
            return
        seen.add(path)
        params = []
        for p in module._parameters.values():
            if p is None:
                continue
            d = p.__dict__
            # ds_id: one parameter in two modules (a tied embedding) is counted once.
            params.append([int(d.get("ds_numel", p.numel())), p.element_size(),
                           bool(d.get("ds_persist", False)), int(d.get("ds_id", id(p)))])
        order.append([path, params])

    return torch.nn.modules.module.register_module_forward_pre_hook(pre)


# --------------------------------------------------------------------- --micro-batch N
_micro = int(os.environ.get("SHARDSCOPE_CHECK_MICRO_BATCH", "0") or 0)  # 0: the script's own
_world = int(os.environ.get("WORLD_SIZE", "1"))


def _with_micro_batch(config, micro, accumulation=None):
    """The user's DeepSpeed config (a dict, or a JSON file's path) with `micro` samples per
    rank: train_micro_batch_size_per_gpu = micro and, where the config names it (or its
    gradient accumulation), train_batch_size = micro x accumulation x this run's ranks, so
    DeepSpeed's consistency check holds at this world. accumulation: the Trainer's, when the
    config leaves it 'auto'. A new dict; the user's is not changed."""
    if isinstance(config, (str, os.PathLike)):
        with open(config) as f:
            config = json.load(f)
    config = dict(config)
    config["train_micro_batch_size_per_gpu"] = micro
    gas = config.get("gradient_accumulation_steps")
    gas = gas if isinstance(gas, int) else accumulation
    if isinstance(config.get("train_batch_size"), int) or (
            "train_batch_size" not in config and isinstance(config.get("gradient_accumulation_steps"), int)):
        config["train_batch_size"] = micro * (gas or 1) * _world
    return config


def _patch_initialize():
    """--micro-batch: deepspeed.initialize gets the config with N per rank (config=,
    config_params=, or args.deepspeed_config's file), also when Accelerate calls it."""
    import inspect

    import deepspeed

    original = deepspeed.initialize
    signature = inspect.signature(original)

    def initialize(*args, **kwargs):
        bound = signature.bind_partial(*args, **kwargs)
        a = bound.arguments
        for key in ("config", "config_params"):
            if a.get(key) is not None:
                a[key] = _with_micro_batch(a[key], _micro)
                break
        else:
            ns = a.get("args")
            path = getattr(ns, "deepspeed_config", None)
            if path and ns is not None:
                rewritten = os.path.join(_dir, f"ds_config.{_rank}.json")
                with open(rewritten, "w") as f:
                    json.dump(_with_micro_batch(path, _micro), f)
                ns.deepspeed_config = rewritten
        return original(*bound.args, **bound.kwargs)

    initialize.__wrapped__ = original  # type: ignore[attr-defined]
    deepspeed.initialize = initialize


def _track_initialize():
    """Whether the script got to deepspeed.initialize and whether it returned: a failure in it
    is reported as one of initialize, with the model built, not as one before the model."""
    import functools

    import deepspeed

    original = deepspeed.initialize

    @functools.wraps(original)
    def initialize(*args, **kwargs):
        _result["initialize"] = "called"
        _stage("deepspeed.initialize")
        out = original(*args, **kwargs)
        _result["initialize"] = "returned"
        return out

    deepspeed.initialize = initialize


class _PatchOnImport:
    """A meta path finder that runs patch(module) once `fullname` is imported by the script:
    the library is changed only where the script uses it, and never imported for it."""

    def __init__(self, fullname, patch):
        self.fullname, self.patch = fullname, patch

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.fullname:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        exec_module, patch = spec.loader.exec_module, self.patch

        def patched(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = patched  # type: ignore[method-assign]
        return spec


def _patch_training_arguments(module):
    """--micro-batch on a Hugging Face Trainer run: TrainingArguments.__post_init__ first sets
    per_device_train_batch_size = N (the Trainer's data loader) and the `deepspeed` config's
    values to match (HfDeepSpeedConfig's 'auto' values are filled from them)."""
    cls = module.TrainingArguments
    post_init = cls.__post_init__

    def __post_init__(self):
        self.per_device_train_batch_size = _micro
        if self.deepspeed is not None:
            self.deepspeed = _with_micro_batch(self.deepspeed, _micro,
                                               self.gradient_accumulation_steps)
        post_init(self)

    cls.__post_init__ = __post_init__


# An Accelerate config's deepspeed_config key -> the variable `accelerate launch` sets for it
# (accelerate/utils/launch.py prepare_deepspeed_cmd_env); DeepSpeedPlugin reads them.
_ACCELERATE_DS_ENV = {
    "zero_stage": "ACCELERATE_DEEPSPEED_ZERO_STAGE",
    "gradient_accumulation_steps": "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
    "gradient_clipping": "ACCELERATE_GRADIENT_CLIPPING",
    "offload_optimizer_device": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
    "offload_param_device": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
    "zero3_init_flag": "ACCELERATE_DEEPSPEED_ZERO3_INIT",
    "zero3_save_16bit_model": "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
    "deepspeed_config_file": "ACCELERATE_DEEPSPEED_CONFIG_FILE",
    "deepspeed_moe_layer_cls_names": "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES",
}


def _accelerate_config_env(path):
    """The variables `accelerate launch` gives a script from an Accelerate config whose
    distributed_type is DEEPSPEED (the file read by Accelerate's own loader): the script's
    Accelerator() then makes its DeepSpeedPlugin from them. Set only where not set already."""
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(path)
    ds = dict(config.deepspeed_config or {})
    env = {"ACCELERATE_USE_DEEPSPEED": "true"}
    fields = list(ds)
    if getattr(config, "mixed_precision", None) is not None:
        env["ACCELERATE_MIXED_PRECISION"] = str(config.mixed_precision)
        fields.append("mixed_precision")
    env["ACCELERATE_CONFIG_DS_FIELDS"] = ",".join(fields).lower()
    for key, name in _ACCELERATE_DS_ENV.items():
        if ds.get(key) is not None:
            keep_case = key in ("deepspeed_config_file", "deepspeed_moe_layer_cls_names")
            env[name] = str(ds[key]) if keep_case else str(ds[key]).lower()
    for name, value in env.items():
        os.environ.setdefault(name, value)


def _patch_accelerate_state(module):
    """Accelerate on the check's CPU ranks: Accelerate finds no accelerator device here and
    would run a DeepSpeedPlugin script as one process (its train_batch_size then disagrees
    with DeepSpeed's world). As `accelerate launch` on CPU machines, the ranks are a gloo job
    (MULTI_CPU), which Accelerate's DeepSpeed path then takes over, DeepSpeed running on its CPU
    accelerator. PartialState._prepare_backend is Accelerate's private name (state.py); a
    release without it is left as it is."""
    cls = getattr(module, "PartialState", None)
    original = getattr(cls, "_prepare_backend", None)
    if original is None:
        return

    def _prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        found, kind = original(self, cpu, sagemaker_dp, backend)
        deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
        if found is None and deepspeed and not cpu and not sagemaker_dp and os.environ.get("LOCAL_RANK"):
            return backend or "gloo", module.DistributedType.MULTI_CPU
        return found, kind

    cls._prepare_backend = _prepare_backend  # type: ignore[union-attr]


def _batch_of(engine, args, kwargs):
    """The batch the run used: DeepSpeed's figures, and the rows of the first forward's
    first tensor input (what the script fed, whatever the config says)."""
    import torch

    batch = {}
    for key, name in (("micro", "train_micro_batch_size_per_gpu"),
                      ("accumulation", "gradient_accumulation_steps"),
                      ("global", "train_batch_size")):
        try:
            batch[key] = int(getattr(engine, name)())
        except Exception:
            pass
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            batch["input_rows"] = int(value.shape[0])
            break
    batch["requested"] = _micro
    return batch


def _patch_deepspeed():
    from deepspeed.runtime.engine import DeepSpeedEngine

    original_step = DeepSpeedEngine.step
    original_forward = DeepSpeedEngine.forward
    hook = [None]
    if _micro:
        _patch_initialize()
    _track_initialize()

    def forward(self, *args, **kwargs):
        if not _result["model_built"]:
            _result["model_built"] = True
            _result["batch"] = _batch_of(self, args, kwargs)
            _stage("step 1")
            if _rank == 0:
                hook[0] = _record_order(self)
        return original_forward(self, *args, **kwargs)

    def step(self, *args, **kwargs):
        out = original_step(self, *args, **kwargs)
        if hook[0] is not None:
            hook[0].remove()
            hook[0] = None
        if self.is_gradient_accumulation_boundary() if hasattr(
                self, "is_gradient_accumulation_boundary") else True:
            _result["steps"] = int(getattr(self, "global_steps", _result["steps"] + 1))
            if _result["steps"] >= _steps:
                _stop(sys._getframe(1))
            _stage(f"step {_result['steps'] + 1}")
        return out

    DeepSpeedEngine.forward = forward
    DeepSpeedEngine.step = step


# The one place a backend plugs in: its agent module, how the agent is installed before the
# script, and how a step is counted. DeepSpeed: shardscope.deepspeed, DeepSpeedEngine.step.
# FSDP2 (python/shardscope/fsdp.py, when it exists): shardscope.fsdp with the same install()
# and finish(), steps counted by torch's global optimizer step hook. check.py refuses FSDP
# while shardscope.fsdp cannot be imported.
_AGENTS = {"deepspeed": "shardscope.deepspeed", "fsdp": "shardscope.fsdp"}
_backend = "deepspeed"
_installed = [None]  # the agent installed (the script's own finish() may have ended it)


def _agent_module():
    import importlib

    return importlib.import_module(_AGENTS[_backend])


def _record_units():
    """FSDP2, rank 0, the first step: the order in which the FSDP units (fully_shard states)
    begin and end their forward (a global forward pre-hook and hook, on every module call of
    that step only): what the peak-memory prediction at the target world walks. Returns
    finish(), called after the first optimizer step: it reads each unit's parameters, its
    reshard_after_forward and explicit prefetch lists (FSDP's lazy init has set them by then),
    writes them to the result and removes the hooks."""
    import torch

    from . import _fsdpinternals as _fi

    # FSDPState in order of first forward; per forward of the root (a micro-batch under
    # gradient accumulation: set_requires_gradient_sync(False)), its ("pre"|"post", index)
    # events. Each micro-batch's forward and backward are replayed on their own.
    states: list = []
    passes: list = []
    root: list = []

    def unit(module):
        state = _fi.state_of(module)
        if state is None or not _fi.groups(state):
            return None
        if state not in states:
            states.append(state)
        return states.index(state)

    def pre(module, args):
        i = unit(module)
        if i is None:
            return
        if not root:
            root.append(module)  # the first unit's module to begin forward: the root
        if module is root[0] or not passes:
            passes.append([])
        events = passes[-1]
        if ("pre", i) not in events:
            events.append(("pre", i))

    def post(module, args, output):
        i = unit(module)
        if i is not None and passes:
            events = passes[-1]
            if ("post", i) in events:
                events.remove(("post", i))  # a grouped unit ends with its last module
            events.append(("post", i))

    hooks = [torch.nn.modules.module.register_module_forward_pre_hook(pre),
             torch.nn.modules.module.register_module_forward_hook(post)]

    def finish():
        for h in hooks:
            h.remove()
        if not states:
            return
        try:
            _units()
        except Exception as e:  # a torch whose FSDP internals differ: no prediction, said
            _result["fsdp_units_error"] = f"{type(e).__name__}: {e}"

    def _units():
        root = states[0]._modules[0]
        paths = {id(m): path for path, m in root.named_modules()}
        units = []
        for state in states:
            params, reshard, post_world = [], True, None
            for g in _fi.groups(state):
                reshard = bool(g._reshard_after_forward)
                if reshard and getattr(g, "_use_post_forward_mesh", False):
                    post_world = int(g.post_forward_mesh_info.shard_mesh_size)
                for fp in g.fsdp_params:
                    shape = [int(x) for x in fp._orig_size]
                    orig = getattr(fp, "orig_dtype", None) or fp.sharded_param.dtype
                    gather = getattr(fp, "param_dtype", None) or orig
                    row = 1
                    for x in shape[1:]:
                        row *= x
                    params.append([shape[0] if shape else 1, row, gather.itemsize, orig.itemsize])

            def targets(name, state=state):
                return [states.index(t) for t in getattr(state, name, ()) if t in states]

            units.append({"path": paths.get(id(state._modules[0]), ""), "params": params,
                          "reshard_after_forward": reshard, "post_forward_world": post_world,
                          "forward_prefetch": targets("_states_to_forward_prefetch"),
                          "backward_prefetch": targets("_states_to_backward_prefetch")})
        distinct = []
        for events in passes:  # micro-batches alike are replayed once
            if events not in distinct:
                distinct.append(events)
        _result["fsdp_units"] = {"units": units,
                                 "passes": [[list(e) for e in events] for events in distinct]}

    return finish


def _count_optimizer_steps():
    """FSDP: a step is an optimizer step (any torch.optim.Optimizer)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    units = [_record_units() if _rank == 0 else None]

    def after(optimizer, args, kwargs):
        _result["model_built"] = True
        if units[0] is not None:
            units[0], finish = None, units[0]
            finish()
        _result["steps"] += 1
        if _result["steps"] >= _steps:
            _stop(sys._getframe(1))
        _stage(f"step {_result['steps'] + 1}")

    register_optimizer_step_post_hook(after)


def _install_agent(backend):
    global _backend
    _backend = backend
    # Each rank's own file, rank<N>.json: the agent expands {rank} (without it, ranks after the
    # first would write FILE.rank<N>, the rule for one name given to every rank).
    snapshot = os.path.join(_dir, "rank{rank}.json")
    if backend == "fsdp":
        _stage("importing torch.distributed.fsdp")
        agent = _agent_module()
        _count_optimizer_steps()
        _installed[0] = agent.install(listen=False, snapshot_out=snapshot)
        return
    _stage("importing deepspeed")
    import deepspeed  # noqa: F401

    if _micro:
        sys.meta_path.insert(0, _PatchOnImport("transformers.training_args",
                                               _patch_training_arguments))
    sys.meta_path.insert(0, _PatchOnImport("accelerate.state", _patch_accelerate_state))
    if os.environ.get("SHARDSCOPE_CHECK_ACCELERATE_CONFIG"):
        _accelerate_config_env(os.environ["SHARDSCOPE_CHECK_ACCELERATE_CONFIG"])

    _patch_deepspeed()
    _installed[0] = _agent_module().install(listen=False, snapshot_out=snapshot, guard="warn")


def main():
    if len(sys.argv) < 2:
        print("usage: python -m shardscope._checkboot script.py [args]", file=sys.stderr)
        return 2
    global _script_path
    script = _script_path = sys.argv[1]
    code = 0
    try:
        _stage("importing torch")
        import torch  # noqa: F401

        _install_agent(os.environ.get("SHARDSCOPE_CHECK_BACKEND", "deepspeed"))
        _stage("running the script (building the model)")
        args = sys.argv[2:]
        profile = os.environ.get("SHARDSCOPE_CHECK_PROFILE") if _rank == 0 else None
        profiler = None
        if profile:  # where rank 0's time goes (bench/bench_check.py --profile)
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        try:
            # As `python script.py args` runs it, and as shardscope-run does (_script: the
            # one way a user's script is started).
            _script.run(script, args, launchers=[__file__])
        except _Done:
            pass
        except SystemExit as e:
            _result["exit"] = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, int) and e.code is not None:
                _result["error"] = str(e.code)
        _result["times"].append(["done", round(time.monotonic() - _t0, 3)])
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile or "")
        if not _result["stopped"]:
            _result["stage"] = f"the script ended by itself after {_result['steps']} steps"
    except BaseException as e:  # noqa: B902 - everything the script raises is reported
        _result["error"] = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-12:])
        code = 1
    finally:
        try:
            # Where each late parameter was registered (the agent's registration hook), for the
            # report's list of them: late parameters DeepSpeed adopted are no violation, so
            # their site is in no ledger row.
            agent = _installed[0] or _agent_module().agent()
            _result["late_sites"] = {name: [site[0], site[1], site[2]] for name, site in
                                     getattr(agent, "late_sites", {}).items()}
        except Exception:  # no agent: nothing to list
            pass
        try:
            _agent_module().finish()
        except Exception as e:  # the report says the snapshot is missing
            _result["error"] = (_result["error"] or "") + f"\nsnapshot: {e}"
        _write_result()
    sys.stdout.flush()
    sys.stderr.flush()
    # Other ranks may still hold this one in a collective: leave without torch's teardown.
    os._exit(code)


if __name__ == "__main__":
    main()
