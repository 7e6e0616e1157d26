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
import runpy
import sys
import time
import traceback

_dir = os.environ.get("SHARDSCOPE_CHECK_DIR", ".")
_rank = int(os.environ.get("RANK", "0"))
_steps = int(os.environ.get("SHARDSCOPE_CHECK_STEPS", "3"))
_result = {"rank": _rank, "steps": 0, "model_built": False, "stopped": False, "exit": None,
           "error": None, "module_order": [], "stage": "starting", "times": [],
           "late_sites": {}, "batch": None}
_t0 = time.monotonic()


class _Done(BaseException):
    """Raised out of the K-th step: the script stops there (not an Exception, so the script's
    own `except Exception` does not swallow it)."""


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
            params.append([int(d.get("ds_numel", p.numel())), p.element_size(),
                           bool(d.get("ds_persist", False))])
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
            if path:
                rewritten = os.path.join(_dir, f"ds_config.{_rank}.json")
                with open(rewritten, "w") as f:
                    json.dump(_with_micro_batch(path, _micro), f)
                ns.deepspeed_config = rewritten
        return original(*bound.args, **bound.kwargs)

    initialize.__wrapped__ = original
    deepspeed.initialize = initialize


class _TrainingArgumentsPatch:
    """--micro-batch on a Hugging Face Trainer run: when transformers.training_args is imported,
    TrainingArguments.__post_init__ first sets per_device_train_batch_size = N (the Trainer's
    data loader) and the `deepspeed` config's values to match (HfDeepSpeedConfig's 'auto'
    values are filled from them). Transformers itself is not imported for it."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "transformers.training_args":
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def patched(module):
            exec_module(module)
            cls = module.TrainingArguments
            post_init = cls.__post_init__

            def __post_init__(self):
                self.per_device_train_batch_size = _micro
                if self.deepspeed is not None:
                    self.deepspeed = _with_micro_batch(self.deepspeed, _micro,
                                                       self.gradient_accumulation_steps)
                post_init(self)

            cls.__post_init__ = __post_init__

        spec.loader.exec_module = patched
        return spec


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
                _result["stopped"] = True
                raise _Done()
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

    states, events = [], []  # FSDPState in order of first forward; ("pre"|"post", index)

    def unit(module):
        state = _fi.state_of(module)
        if state is None or not state._fsdp_param_groups:
            return None
        if state not in states:
            states.append(state)
        return states.index(state)

    def pre(module, args):
        i = unit(module)
        if i is not None and ("pre", i) not in events:
            events.append(("pre", i))

    def post(module, args, output):
        i = unit(module)
        if i is not None:
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
            for g in state._fsdp_param_groups:
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

            def targets(name):
                return [states.index(t) for t in getattr(state, name, ()) if t in states]

            units.append({"path": paths.get(id(state._modules[0]), ""), "params": params,
                          "reshard_after_forward": reshard, "post_forward_world": post_world,
                          "forward_prefetch": targets("_states_to_forward_prefetch"),
                          "backward_prefetch": targets("_states_to_backward_prefetch")})
        _result["fsdp_units"] = {"units": units, "events": [list(e) for e in events]}

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
            _result["stopped"] = True
            raise _Done()
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
        sys.meta_path.insert(0, _TrainingArgumentsPatch())

    _patch_deepspeed()
    _installed[0] = _agent_module().install(listen=False, snapshot_out=snapshot, guard="warn")


def main():
    if len(sys.argv) < 2:
        print("usage: python -m shardscope._checkboot script.py [args]", file=sys.stderr)
        return 2
    script = sys.argv[1]
    code = 0
    try:
        _stage("importing torch")
        import torch  # noqa: F401

        _install_agent(os.environ.get("SHARDSCOPE_CHECK_BACKEND", "deepspeed"))
        _stage("running the script (building the model)")
        sys.argv = [script] + sys.argv[2:]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        profile = os.environ.get("SHARDSCOPE_CHECK_PROFILE") if _rank == 0 else None
        profiler = None
        if profile:  # where rank 0's time goes (bench/bench_check.py --profile)
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        try:
            runpy.run_path(script, run_name="__main__")
        except _Done:
            pass
        except SystemExit as e:
            _result["exit"] = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, int) and e.code is not None:
                _result["error"] = str(e.code)
        _result["times"].append(["done", round(time.monotonic() - _t0, 3)])
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)
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
