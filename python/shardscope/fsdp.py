"""Attach the ShardScope inspector to a PyTorch FSDP2 run (``torch.distributed.fsdp.fully_shard``).

Two lines in the training script (every rank runs them)::

    import shardscope.fsdp
    shardscope.fsdp.install(snapshot_out="run.rank{rank}.json")  # before fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)          # the agent finds the root at its first forward
    # or, after fully_shard: shardscope.fsdp.attach(model)

Each rank process serves the same endpoint as ``shardscope.deepspeed`` (one native module,
server and protocol; ``docs/fsdp.md``). What is recorded, in FSDP's names: the module tree
with its FSDP units (the modules ``fully_shard`` was called on, ``reshard_after_forward``,
the mesh), every parameter by its fully qualified name with its global shape, dtype and
this rank's shard (dim 0 padded to the world size), its state on this rank (sharded, being
all-gathered, unsharded); events for each group's unshard (the all-gather, its bytes and
cause: forward, backward, prefetch, or an explicit ``unshard()``) and reshard, the units'
forward/backward scopes and steps (a step begins at the root's forward, ends at
``optimizer.step()``); violations with the line that fixes them; and checkpoints that lose
data (``torch.save`` of DTensor shards, ``load_state_dict`` of full tensors into them).
"""

from __future__ import annotations

import math
import os
import sys
import weakref
from collections.abc import Mapping
from types import FrameType
from typing import Any, Optional, Union

from . import ShardScopeError, UnregisteredAccessError
from . import _allocator, _native
from . import _frames
from . import _fsdpinternals as _fi
from . import _runtime
from . import _torchinternals
from ._agentcore import AgentCore, install_agent
from ._runtime import DEFAULT_HISTORY
from ._modtree import walk_up
from ._torchmodes import METADATA_ONLY, leave_mode

__all__ = ["install", "attach", "finish", "inspect", "agent", "describe", "pause", "resume",
           "paused"]


def _is_state_init_step(frame, depth=8):
    """Whether the optimizer.step() a step hook runs in is the one torch's distributed
    checkpoint makes to create an empty optimizer's state (`_init_optim_state`: zero
    gradients, learning rate 0, no forward) before get_state_dict or set_state_dict, as a
    run that resumes does: not a training step, so not counted in the steps' numbers."""
    while frame is not None and depth:
        if frame.f_code.co_name == "_init_optim_state":
            return "checkpoint" in frame.f_code.co_filename
        frame, depth = frame.f_back, depth - 1
    return False


def _restored_steps(optimizer):
    """The optimizer steps an optimizer's loaded state has taken (the largest "step" of its
    parameters' states: Adam, AdamW and most of torch's keep one); None when it keeps none
    (SGD) or it is 0. A tensor step is read once, here."""
    steps = None
    for state in optimizer.state.values():
        step = state.get("step") if isinstance(state, dict) else None
        if step is None:
            continue
        try:
            n = int(step.item() if hasattr(step, "item") else step)
        except (TypeError, ValueError, RuntimeError):
            continue
        steps = n if steps is None else max(steps, n)
    return steps or None


def _dynamo_skips_frame(fn):
    """Dynamo compiles no frame of fn's code on its own (it still inlines fn into a frame it
    traces, and compiles what fn calls). The agent's wrappers share one code object across
    the classes they wrap: compiled as frames, they would be recompiled for each class (and
    given up past dynamo's recompile limit) and add graph breaks the user's code has not.
    torch._dynamo.eval_frame.skip_code, torch's own tool for its wrappers; without it (a
    torch that moved it), nothing."""
    skip_code = _torchinternals.optional("torch._dynamo.eval_frame", "skip_code")
    if skip_code is not None:
        skip_code(fn.__code__)


def _user_class_name(module):
    """The name of the class the user built: fully_shard replaces a module's class by one it
    makes, FSDP<Class> (a subclass of FSDPModule and Class), which is not the model's name."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return type(module).__name__
    for cls in type(module).__mro__:
        if not issubclass(cls, FSDPModule):
            return cls.__name__
    return type(module).__name__


# A group's status as the state numbers it: the engine's ParamStatus (NOT_AVAILABLE,
# INFLIGHT, AVAILABLE), in FSDP's words.
SHARDED = _native.PARAM_STATUS_NOT_AVAILABLE
GATHERING = _native.PARAM_STATUS_INFLIGHT
UNSHARDED = _native.PARAM_STATUS_AVAILABLE
STATUS_WORDS = ("sharded", "being all-gathered", "unsharded")
_slot = _runtime.AgentSlot("shardscope.fsdp")  # the process's agent: _slot.agent
_MISSING = object()


def _placements(tensor):
    """A DTensor's placements as the state names them (docs/snapshot.md, `placements`):
    "Shard(0)" on a 1-D mesh, "(Replicate(), Shard(0))" on HSDP's; "" for a plain tensor."""
    placements = getattr(tensor, "placements", None)
    if not placements:
        return ""
    words = [f"Shard({p.dim})" if type(p).__name__ == "Shard" else
             "Replicate()" if type(p).__name__ == "Replicate" else repr(p) for p in placements]
    return words[0] if len(words) == 1 else "(" + ", ".join(words) + ")"


def _sharded(tensor, ranks=1):
    """Whether tensor is a DTensor that one of its Shard placements splits over at least
    `ranks` ranks of its mesh (fully_shard's parameters: Shard(0); HSDP's (Replicate(),
    Shard(0)))."""
    mesh = tensor.device_mesh
    return any(p.is_shard() and mesh.size(i) >= ranks for i, p in enumerate(tensor.placements))


def _shard_loss(value):
    """The bytes of a DTensor that lie in the other ranks' shards, not in this rank's: (global
    numel - local numel) x element size, where a Shard placement splits it over more than one
    rank; None for anything else (a plain tensor, a replicated DTensor, a mesh of one rank, a
    number)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(value, DTensor) or not _sharded(value, 2):
        return None
    return (value.numel() - value.to_local().numel()) * value.dtype.itemsize


def _tensors_in(obj, measure, depth=8):
    """(key path, measure(value)) of each value in obj that measure gives a number for (not
    None), in order: obj a state dict, or the dicts, lists and tuples that hold one
    ({"model": model.state_dict(), "step": 3}). Each container is looked in once (one that
    holds itself is no loop), none deeper than depth."""
    found: list = []
    seen: set = set()

    def walk(value, path, left):
        if isinstance(value, Mapping):
            items: Any = value.items()
        elif isinstance(value, (list, tuple)):
            items = enumerate(value)
        else:
            m = measure(value)
            if m is not None:
                found.append((path, m))
            return
        if left <= 0 or id(value) in seen:
            return
        seen.add(id(value))
        for key, item in items:
            walk(item, path + (key, ), left - 1)

    walk(obj, (), depth)
    return found


def agent() -> Optional[_Agent]:
    """The agent of this process, or None before install()."""
    return _slot.agent


def install(listen: Union[str, bool, None] = None, token: Optional[str] = None,
            snapshot_out: Union[str, os.PathLike[str], bool, None] = None, guard: str = "warn",
            model_name: Optional[str] = None, job: Optional[str] = None, history: int = DEFAULT_HISTORY,
            token_file: Optional[str] = None) -> _Agent:
    """Starts the agent in this rank process; call it before fully_shard (or attach(model) after).

    The options are shardscope.deepspeed.install()'s (docs/deepspeed.md): listen, token,
    token_file, snapshot_out ({rank} is replaced), guard ("warn" records and lets torch go on
    to its own error; "error" raises UnregisteredAccessError with the fix line first), job,
    model_name, history.
    """
    agent, _ = install_agent(_slot, _Agent, "shardscope.fsdp.install()", "before fully_shard",
                             _fi.check, guard=guard, token=token, token_file=token_file,
                             listen=listen, snapshot_out=snapshot_out, history=history, job=job,
                             model_name=model_name)
    return agent


def attach(model: Any, **options: Any) -> _Agent:
    """Shows `model` (the root module fully_shard was called on) from now on; installs the
    agent with `options` first if install() was not called."""
    if _slot.agent is None:
        install(**options)
    elif options and not os.environ.get("SHARDSCOPE_CHECK"):  # check's options stand
        raise ShardScopeError("attach(model, ...) takes install()'s options only when install() "
                              "was not called; the agent already runs")
    _slot.agent.attach(model)
    return _slot.agent


finish, inspect, pause, resume, paused = _slot.api(install)  # _runtime.AgentSlot


def describe() -> dict:
    """The state as FSDP names it, for this rank: units and parameters (docs/fsdp.md)."""
    if _slot.agent is None or _slot.agent.root is None:
        return {"units": [], "params": []}
    return _slot.agent.describe()


class _Group:
    """What the agent knows of one FSDPParamGroup. Its status, the cause of its all-gather and
    whether its backward scope is open are kept by the native path (FsdpPath), which observes
    FSDP's group methods."""

    __slots__ = ("group", "unit", "unit_path", "modules", "params", "fsdp_params", "world", "path",
                 "index")
    group: Any  # the FSDPParamGroup
    unit: int  # the module id of its FSDP unit
    unit_path: str
    modules: list
    params: list
    fsdp_params: list
    world: int
    path: Any
    index: Optional[int]

    def __init__(self, path):
        self.params = []  # [(pid, bytes all-gathered)]
        self.path = path  # the agent's FsdpPath
        self.index = None  # the group's number there (add_group)

    @property
    def status(self):
        """SHARDED, GATHERING or UNSHARDED on this rank."""
        return self.path.status(self.index)


class _Agent(AgentCore):
    """The observer FSDP2's wrapped methods call (see _fsdpinternals and fsdppath.h)."""

    NOT_BUILT = ("(model not sharded yet: shown once fully_shard's root runs its first forward "
                 "or attach(model))")
    DIALECT = "fsdp"

    def __init__(self, options, token, guard, model_name, version):
        import torch

        super().__init__(options, token, guard, model_name, version)
        self.root: Any = None  # the root module, once known
        self.groups = {}  # id(FSDPParamGroup) -> _Group
        self.mids = {}  # id(module) -> module id
        self.paths = {}  # module id -> dotted path
        self.pids = {}  # id(sharded DTensor parameter) -> (pid, group record, FSDPParam)
        self.known = set()  # ids of every parameter object FSDP manages (sharded and unsharded)
        self.names = {}  # pid -> fully qualified name
        self.late = {}  # id(param) -> pid, parameters created after fully_shard
        self.next_pid = 0
        # FSDP's group methods observed natively (python/shardscope/fsdppath.h): the groups'
        # statuses, the open scopes, each all-gather's cause, and `inside`, the depth of FSDP's
        # own code (its reads of the shards are not the user's)
        self.hot = _native.FsdpPath(self.native, self, _fi.pre_backward_state())
        self.reported = set()  # violations said and flushed (on_shard_read)
        self.in_root_forward = False
        self.in_step = False
        self.step = 0
        self.optimizer_steps = 0  # also while paused: a step's number is optimizer steps + 1
        self.state_init_step = False  # the optimizer.step() now running is torch's own (below)
        self.late_dirty = True
        self.mode = None
        self.derived = {}  # id -> (DTensor, pids entry): views of sharded parameters (_derived)
        self.candidate = None  # weakref to the last module fully_shard was called on
        self.checked = set()
        # torch < 2.13 does not check for a parameter shared by two groups: the agent does, at
        # fully_shard (on_init). id(original parameter) -> (weakref to it, the FSDPState that
        # manages it, its module, its name there); pairs found, recorded when the root is known:
        # (first state, module, name, second state).
        self.torch_checks_tied = _fi.has_tied_check()
        self.orig_params = {}
        self.tied_found = []
        # Each fully_shard call so far: (weakref to its FSDPState, the user's line), for a call
        # on a module inside one already sharded (_check_shard_order); said once.
        self.shard_calls = []
        self.order_said = False
        self.loss = None  # the tensor the script's loss.backward() ran on in this step
        self.unfinished_said = False  # a backward FSDP2 never finished was reported
        self.root_state = None  # the root's FSDPState, once _check_backward_finished looked
        self.unit_recs = {}  # id(module of an FSDP unit) -> its group's record (_watch_forward)
        self.forward_classes = {}  # FSDP unit class -> (its own forward or _MISSING, the wrapper)
        self.to_local_restore = None  # puts DTensor.to_local and zero_grad back (_watch_to_local)
        self.mode_class = None  # the read watching's TorchFunctionMode (_enter_mode)
        # puts torch.save and nn.Module.load_state_dict back (_watch_checkpoints)
        self.checkpoint_restore: Optional[Any] = None
        self.checkpoint_check_failed = False  # said once, then the checks are off
        self.uninstall = _fi.install(self)
        self.unwatch_backward = _runtime.watch_backward(self._keep_loss)
        self._watch_to_local()
        self._watch_checkpoints()
        from torch.nn.modules.module import register_module_parameter_registration_hook
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)

        me = weakref.ref(self)

        def on_param_registered(module, name, param):
            a = me()
            if a is not None:
                a.late_dirty = True

        def on_step_pre(optimizer, args, kwargs):
            a = me()
            if a is not None:
                a.hot.inside += 1  # the optimizer computes on the shards, legally
                # and its hundreds of ops a step pay nothing for the read watching
                # (docs/performance.md, section 15)
                a._leave_mode()
                a.state_init_step = _is_state_init_step(sys._getframe(1))
                if a.root is not None and not a.unfinished_said and not a.is_paused:
                    a._check_backward_finished()  # a backward the watcher did not see

        def on_step_post(optimizer, args, kwargs):
            a = me()
            if a is not None:
                if not a.state_init_step:
                    a.optimizer_steps += 1
                a.state_init_step = False
                try:
                    a.end_step()  # inside: the loss's conversion is not the user's read
                    a.poll_reduces()  # not waited for: the CPU may run ahead of the GPU
                    if a.allocator is not None:
                        a.allocator()
                finally:
                    a.hot.inside = max(0, a.hot.inside - 1)
                    if not a.hot.inside and a.root is not None and not a.in_root_forward \
                            and not a.is_paused:
                        a._enter_mode()

        self.handles = [register_module_parameter_registration_hook(on_param_registered),
                        _frames.watch_registrations(),  # where late parameters were registered
                        register_optimizer_step_pre_hook(on_step_pre),
                        register_optimizer_step_post_hook(on_step_post)]
        self.late_sites = {}  # late parameter's name -> its site, for shardscope-check
        del torch
        self.arm()

    # ------------------------------------------------------------------ lifecycle
    def _close(self, reason):
        self.hot.closed = True
        if reason == "training finished" and self.root is None and self.candidate is None:
            # the empty inspector would otherwise be all the user sees of a run without FSDP2
            print(f"shardscope: rank {self.rank}: the script ended without fully_shard being "
                  f"called in this process, so the inspector and the snapshot have no model to "
                  f"show. If FSDP2 was meant to run: Accelerate uses FSDP2 only with "
                  f"FullyShardedDataParallelPlugin(fsdp_version=2) (its default is FSDP1) and "
                  f"only on GPUs; FSDP1 (the FullyShardedDataParallel wrapper) is not observed.",
                  file=sys.stderr)
        if self.root is None and self.candidate is not None and self.candidate() is not None:
            # A run that ended before the root's first forward (torch refused it there): the
            # last module fully_shard was called on names the model in the snapshot, as the
            # root of a bottom-up wrapping.
            self.native.set_model_name(self.model_name or _user_class_name(self.candidate()))
        self.poll_reduces(wait=True)  # the last step's, before the snapshot
        self._leave_mode()
        for h in self.handles:
            h.remove()
        self.unwatch_backward()
        self._unwatch_to_local()
        self._unwatch_checkpoints()
        if not self.is_paused:
            self.uninstall()
            self._unwatch_forwards()

    def _pause(self):
        if self.in_step or self.in_root_forward or self.hot.any_in_backward():
            raise ShardScopeError("pause() between training steps (after optimizer.step(), before "
                                  "the next forward), not inside one")
        self._leave_mode()
        self.uninstall()
        self.unwatch_backward()
        self._unwatch_to_local()
        self._unwatch_checkpoints()
        self._unwatch_forwards()

    def _unpause(self):
        if self.in_root_forward:
            raise ShardScopeError("resume() between training steps, not inside one")
        self.uninstall = _fi.install(self)
        self.unwatch_backward = _runtime.watch_backward(self._keep_loss)
        self._watch_to_local()
        self._watch_checkpoints()
        for cls in list(self.forward_classes):
            self._watch_forward(cls)

    def _resumed(self):
        changed: list = []
        for rec in self.groups.values():
            now = _fi.group_status(rec.group)
            if now != rec.status:
                self.hot.set_status(rec.index, now)
                changed.extend((pid, now) for pid, _ in rec.params)
        if changed:
            self.native.set_statuses(changed)
        if self.root is not None:
            self._enter_mode()

    # ------------------------------------------------------------------ the model
    def module_id(self, module):
        mid = self.mids.get(id(module))
        if mid is None:
            mid = self.native.ensure_module(f"<unnamed {type(module).__name__}>", type(module).__name__)
            self.mids[id(module)] = mid
            self.hot.set_module(module, mid)
        return mid

    def attach(self, model):
        import torch.nn as nn

        if self.root is model:
            return
        if self.root is not None:
            raise ShardScopeError(
                f"shardscope.fsdp is attached to {type(self.root).__name__} already; one root "
                f"module a process is inspected")
        if not isinstance(model, nn.Module):
            raise ShardScopeError(f"attach(model) needs the root nn.Module fully_shard was called "
                                  f"on, not {type(model).__name__}")
        try:
            from torch.distributed.fsdp import FullyShardedDataParallel
        except ImportError:
            FullyShardedDataParallel = ()
        if FullyShardedDataParallel and isinstance(model, FullyShardedDataParallel):
            raise ShardScopeError(
                "this model is wrapped by FSDP1 (FullyShardedDataParallel); shardscope.fsdp "
                "inspects FSDP2: torch.distributed.fsdp.fully_shard(model) instead of "
                "FullyShardedDataParallel(model)")
        state = _fi.state_of(model)
        if state is None:
            raise ShardScopeError(
                f"{type(model).__name__} is not sharded by FSDP2: call "
                f"torch.distributed.fsdp.fully_shard(model) (after fully_shard on its blocks), "
                f"then attach(model), or install() before fully_shard")
        self.root = model
        self.hot.attached = True
        self.allocator = _allocator.sampler(self.native, _allocator.device_of(model.parameters()))
        self.publish()
        if not self.in_root_forward:
            self._enter_mode()

    @staticmethod
    def _unit_settings(state):
        """A unit's reshard_after_forward as fully_shard took it ("True", "False" or the size of
        the mesh it reshards to) and its mesh ("dp=2"; HSDP "replicate=2, shard=2"): the
        module's fsdp_unit in the state (docs/snapshot.md)."""
        groups = _fi.groups(state)
        if not groups:
            return "", ""
        g = groups[0]
        mesh_info = g.mesh_info
        post = getattr(g, "post_forward_mesh_info", _MISSING)
        if post is _MISSING:
            reshard = str(bool(g._reshard_after_forward))
        elif post is None:
            reshard = "False"
        else:
            size = getattr(post, "shard_mesh_size", None)
            reshard = "True" if size in (None, getattr(mesh_info, "shard_mesh_size", None)) else str(size)
        mesh = getattr(mesh_info, "mesh", None)
        text = ""
        if mesh is not None:
            names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
            text = ", ".join(f"{n}={s}" for n, s in zip(names, mesh.shape, strict=False))
        return reshard, text

    def publish(self):
        root = self.root
        self.native.set_model_name(self.model_name or _user_class_name(root))
        names: dict = {}
        for name, p in root.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), name)
        states = []
        for path, module in root.named_modules():
            state = _fi.state_of(module)
            if state is not None and state not in states:
                states.append(state)
            mid = self.native.ensure_module(path, type(module).__name__)
            self.mids[id(module)] = mid
            self.hot.set_module(module, mid)
            self.paths[mid] = path
        for state in states:
            if "FSDPState" not in self.checked:
                _fi.check_attributes("FSDPState", state)
                self.checked.add("FSDPState")
            # The modules of one fully_shard call form one unit group, headed by the first.
            units = [self.mids[id(m)] for m in state._modules if id(m) in self.mids]
            reshard, mesh = self._unit_settings(state)
            for mid in units:
                self.native.set_unit(mid, units[0], reshard, mesh)
            for g in _fi.groups(state):
                self._publish_group(g, names)
        self.late_dirty = True

    def _publish_group(self, g, names):
        if "FSDPParamGroup" not in self.checked:
            _fi.check_attributes("FSDPParamGroup", g)
            self.checked.add("FSDPParamGroup")
        rec = self.groups.get(id(g))
        if rec is None:
            rec = self.groups[id(g)] = _Group(self.hot)
        rec.group = g
        rec.modules = [self.module_id(m) for m in g.modules]
        for m in g.modules:
            self.unit_recs[id(m)] = rec
            self._watch_forward(type(m))
        rec.unit = rec.modules[0]
        rec.unit_path = self.paths.get(rec.unit, "")
        rec.fsdp_params = list(g.fsdp_params)
        mesh_info = g.mesh_info
        rec.world = int(getattr(mesh_info, "shard_mesh_size", self.world_size))
        status = _fi.group_status(g)
        rec.params = []
        for fp in g.fsdp_params:
            if "FSDPParam" not in self.checked:
                _fi.check_attributes("FSDPParam", fp)
                self.checked.add("FSDPParam")
            key = id(fp.sharded_param)
            old = self.pids.get(key)
            pid = old[0] if old else self._new_pid()
            name = names.get(key) or names.get(id(getattr(fp, "_unsharded_param", None))) \
                or getattr(fp, "_param_fqn", None) or f"<parameter {pid}>"
            shape = [int(s) for s in fp._orig_size]
            numel = math.prod(shape)
            partition = math.prod(int(s) for s in fp.padded_sharded_param_size)
            padded = partition * rec.world
            orig = getattr(fp, "orig_dtype", None) or fp.sharded_param.dtype
            elem = (getattr(fp, "param_dtype", None) or orig).itemsize  # what the all-gather moves
            self.native.set_param(id=pid, name=name, owner=rec.unit, shape=shape,
                                  dtype=str(orig).replace("torch.", ""), numel=numel,
                                  partition_numel=partition, padded_numel=padded,
                                  persistent=False, partitioned=True, late=False,
                                  status=status, element_size=orig.itemsize,
                                  placements=_placements(fp.sharded_param))
            rec.params.append((pid, padded * elem))
            self.names[pid] = name
            self.pids[key] = (pid, rec, fp)
            self.known.add(key)
            if hasattr(fp, "_unsharded_param"):
                self.known.add(id(fp._unsharded_param))
        rec.index = self.hot.add_group(g, rec.params, rec.unit, status)

    def _new_pid(self):
        self.next_pid += 1
        return self.next_pid - 1

    def _group(self, g):
        if self.root is None:
            return None
        rec = self.groups.get(id(g))
        if rec is None and any(fp is not None for fp in getattr(g, "fsdp_params", ())):
            # A group the agent has not met (sharded after attach): published now.
            names = {id(p): n for n, p in self.root.named_parameters(remove_duplicate=False)}
            self._publish_group(g, names)
            rec = self.groups.get(id(g))
        return rec

    def describe(self):
        units, params = [], []
        for rec in self.groups.values():
            fps = rec.fsdp_params
            reduce_scatters, reduce_bytes = self.hot.reduce_counts(rec.index)
            units.append({"unit": rec.unit_path, "modules": [self.paths.get(m, "") for m in rec.modules],
                          "status": STATUS_WORDS[rec.status], "shard_world": rec.world,
                          "params": len(fps), "reduce_scatters": reduce_scatters,
                          "reduce_scatter_bytes": reduce_bytes})
            for (pid, _), fp in zip(rec.params, fps, strict=True):
                sp = fp.sharded_param
                shape = [int(s) for s in fp._orig_size]
                rows = shape[0] if shape else 1
                chunk = int(fp.padded_sharded_param_size[0]) if len(fp.padded_sharded_param_size) else 1
                row = math.prod(shape[1:]) if len(shape) > 1 else 1
                shards = []
                # Every rank of the world: HSDP's rank r holds shard r mod the shard mesh's
                # size (a (replicate, shard) mesh in rank order, as init_device_mesh makes it).
                for r in range(max(self.world_size, rec.world)):
                    k = r % rec.world
                    begin = min(k * chunk, rows)
                    end = min((k + 1) * chunk, rows)
                    shards.append({"rank": r, "offset": begin * row, "length": (end - begin) * row,
                                   "padding": (chunk - (end - begin)) * row})
                params.append({"id": pid, "fqn": self.names.get(pid, ""),
                               "unit": rec.unit_path, "shape": shape,
                               "dtype": str(sp.dtype).replace("torch.", ""),
                               "placements": _placements(sp),
                               "shards": shards, "status": STATUS_WORDS[rec.status]})
        return {"units": units, "params": params, "late": sorted(self.late.values())}

    # ------------------------------------------------------------------ steps
    def begin_step(self):
        if self.late_dirty:
            self._scan_late()
        self.in_step = True
        self.step = self.optimizer_steps + 1
        self.native.step_begin(self.step)

    def _keep_loss(self, tensor):
        """torch.Tensor.backward's watcher (_runtime.watch_backward): the tensor the script
        called backward on inside a step is the loss the step ends with. The read watching
        is off for the backward pass (FSDP's hooks and autograd's: nothing to watch) and on
        again after it, here, in the script's thread state: autograd runs the pass on a copy
        of it, where a mode left or entered is back as it was once the pass returns. What
        the backward began under (compiled autograd) and whether it raised are kept for
        _check_backward_finished."""
        if self.in_step:
            self.loss = tensor
        compiled = _torchinternals.compiled_autograd_on()
        handling = sys.exc_info()[1]  # a backward called inside the script's except block
        watching = self.mode is not None
        if watching:
            self._leave_mode()

        def after():
            if self.root is not None and not self.unfinished_said and not self.is_paused:
                e = sys.exc_info()[1]  # in the watcher's finally: what the backward raises
                error = None
                if e is not None and e is not handling:
                    error = _runtime.raised_line(e)
                try:  # runs where the backward's own result or exception is on its way out
                    self._check_backward_finished(error, compiled)
                except Exception as failed:
                    self.unfinished_said = True
                    print(f"shardscope: rank {self.rank}: the check that FSDP2 finished the "
                          f"backward failed ({type(failed).__name__}: {failed}); the training "
                          f"goes on unobserved by it", file=sys.stderr, flush=True)
            if watching:
                self._after_backward()
        return after

    def _after_backward(self):
        if self.root is not None and not self.closed and not self.in_root_forward \
                and not self.is_paused:
            self._enter_mode()

    def _check_backward_finished(self, error=None, compiled=False):
        """After each backward the script calls (error: what it raised, "ValueError: ...";
        compiled: it began under compiled autograd), and at each optimizer.step(): FSDP2 ends
        a backward in a callback its root's pre-backward queues on autograd's engine
        (FSDPState._root_post_backward_final_callback), which reshards the root's groups,
        reduce-scatters their gradients and sets every state back to IDLE before backward
        returns. A root state still in PRE_BACKWARD never had it run: its parameters stay
        unsharded, gradients unreduced, and FSDP's forward hooks unshard every group and
        return early from then on (each rank trains its own copy, with no error); the state
        keeps the callback marked queued, so no later backward queues it again. Two causes
        seen: an exception inside backward that the script caught and went on from (a batch
        skipped after an out-of-memory error), and torch 2.13's compiled autograd, which drops
        the callback (torch 2.11 raises instead). Recorded once (backward_unfinished, its words
        in engine/state/violationtext.cpp) and said on stderr."""
        state = self.root_state
        if state is None:
            state = self.root_state = _fi.state_of(self.root)
        if state is None or state._training_state is not _fi.pre_backward_state():
            return
        self.unfinished_said = True
        # the script's loss.backward() line; its optimizer.step() line when called from on_step_pre
        # (a backward the watcher did not see: docs/fsdp.md, "A backward FSDP2 never finishes")
        frame = _frames.user_frame(sys._getframe(1))
        message, fix = self.native.backward_unfinished(
            self.module_id(self.root), raised=error or "", compiled_autograd=compiled,
            location=_frames.location(frame) if frame is not None else None)
        self.flush()
        print(f"shardscope: rank {self.rank}: {message}\n  fix: {fix}", file=sys.stderr, flush=True)

    def end_step(self):
        if self.in_step:
            self.in_step = False
            loss, self.loss = self.loss, None
            self.native.step_end(loss)  # one number: agent::lossNumber; None: NaN

    def _scan_late(self):
        """Parameters under the root that no FSDP group manages: created after fully_shard."""
        self.late_dirty = False
        if self.root is None:
            return
        for fp_key in list(self.pids):
            fp = self.pids[fp_key][2]
            if hasattr(fp, "_unsharded_param"):
                self.known.add(id(fp._unsharded_param))
        for path, module in self.root.named_modules():
            for local, p in module._parameters.items():
                if p is None or id(p) in self.known or id(p) in self.late:
                    continue
                name = f"{path}.{local}" if path else local
                unit = self._unit_of(path)
                owner = self.native.ensure_module(path, type(module).__name__)
                del owner
                pid = self._new_pid()
                numel = p.numel()
                self.native.set_param(id=pid, name=name, owner=self.mids.get(id(unit), 0),
                                      shape=list(p.shape), dtype=str(p.dtype).replace("torch.", ""),
                                      numel=numel, partition_numel=numel, padded_numel=numel,
                                      persistent=False, partitioned=False, late=True,
                                      status=UNSHARDED, element_size=p.element_size())
                site = _frames.site(p)
                if site is not None:
                    self.late_sites[name] = site
                self.native.late_parameter(pid, location=site)
                self.late[id(p)] = pid

    def _unit_of(self, path):
        """The innermost FSDP unit at or above the module at `path`."""
        parts = path.split(".") if path else []
        for n in range(len(parts), -1, -1):
            m = self.root.get_submodule(".".join(parts[:n]))
            if _fi.state_of(m) is not None:
                return m
        return self.root

    # ------------------------------------------------------------------ read detection
    def _watch_forward(self, cls):
        """Wraps the forward of an FSDP unit's class (the class fully_shard made for it,
        FSDP<Module>): a unit's forward entered while its group is not unsharded was called
        without FSDP's pre-forward (`self.blocks[1].forward(h)` inside the root's forward).
        Only then are its reads watched, until it returns (_bypassed_forward); called
        through the module, a dict lookup and a compare. While dynamo traces it (the unit
        compiled, `block.compile()` before fully_shard as torchtitan does, or the model), the
        wrapper is the unit's own forward: the check calls into the native path, which dynamo
        cannot trace, and would make it fall back to eager for the whole frame (or fail
        `fullgraph=True`). A compiled forward called directly is then not recorded."""
        entry = self.forward_classes.get(cls)
        if entry is not None and cls.__dict__.get("forward") is entry[1]:
            return
        previous = cls.__dict__.get("forward", _MISSING) if entry is None else entry[0]
        original = cls.forward if previous is _MISSING else previous
        import torch
        units, agent, hot = self.unit_recs, self, self.hot
        is_compiling = torch.compiler.is_compiling

        def forward(module, *args, **kwargs):
            if is_compiling():
                return original(module, *args, **kwargs)
            rec = units.get(id(module))
            if rec is None or rec.status == UNSHARDED or agent.mode is not None or hot.inside:
                return original(module, *args, **kwargs)
            return agent._bypassed_forward(original, module, args, kwargs)

        _dynamo_skips_frame(forward)

        forward.__name__ = getattr(original, "__name__", "forward")
        forward.__qualname__ = getattr(original, "__qualname__", "forward")
        forward.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(cls, "forward", forward)
        self.forward_classes[cls] = (previous, forward)

    def _unwatch_forwards(self):
        for cls, (previous, wrapper) in self.forward_classes.items():
            if cls.__dict__.get("forward") is not wrapper:
                continue  # replaced since: left alone
            if previous is _MISSING:
                delattr(cls, "forward")
            else:
                setattr(cls, "forward", previous)

    def _bypassed_forward(self, original, module, args, kwargs):
        """A unit's forward running on its shards: its reads are watched (the direct-forward
        violation, the unit as accessor) while it runs."""
        self._enter_mode()
        mode = self.mode
        try:
            return original(module, *args, **kwargs)
        finally:
            if self.mode is mode:  # entered here (the wrapper calls this while none is)
                self._leave_mode()

    def _watch_to_local(self):
        """DTensor.to_local() on a sharded FSDP parameter, called by the user's code while the
        reads are watched (outside the root's forward, the backward pass and the optimizer's
        step, or in a unit's forward called directly), computes silently on this rank's
        shard: a sharded read (FSDP's and torch's own calls are not the user's)."""
        if self.to_local_restore is not None:
            return
        import torch
        from torch.distributed.tensor import DTensor

        previous = DTensor.__dict__["to_local"]
        agent, hot = self, self.hot
        is_compiling = torch.compiler.is_compiling

        def to_local(tensor, *args, **kwargs):
            if is_compiling():  # dynamo's trace: the call as without the agent
                return previous(tensor, *args, **kwargs)
            entry = agent.pids.get(id(tensor))
            if (entry is not None and agent.mode is not None and not hot.inside
                    and entry[2].sharded_param is tensor and entry[1].status != UNSHARDED
                    and _frames.is_user(sys._getframe(1))):
                agent.on_shard_read(tensor, entry)
            return previous(tensor, *args, **kwargs)

        to_local.__name__, to_local.__qualname__ = previous.__name__, previous.__qualname__
        to_local.__doc__, to_local.__wrapped__ = previous.__doc__, previous  # type: ignore[attr-defined]
        DTensor.to_local = to_local

        # Optimizer.zero_grad reads and writes every parameter's .grad, each a
        # __torch_function__ call while the read watching is on (~800 a step on a 402-parameter
        # model, 1.5 ms a step under cProfile: docs/performance.md, section 15). Those are
        # the optimizer's, not the user's reads: the watching is off while it runs, as it is
        # for optimizer.step() (the step hooks).
        from torch.optim import Optimizer

        previous_zero_grad = Optimizer.__dict__["zero_grad"]

        def zero_grad(optimizer, *args, **kwargs):
            if agent.mode is None or is_compiling():
                return previous_zero_grad(optimizer, *args, **kwargs)
            agent._leave_mode()
            try:
                return previous_zero_grad(optimizer, *args, **kwargs)
            finally:
                if not agent.closed and not agent.is_paused and agent.root is not None \
                        and not agent.in_root_forward and not hot.inside:
                    agent._enter_mode()

        zero_grad.__name__ = previous_zero_grad.__name__
        zero_grad.__qualname__ = previous_zero_grad.__qualname__
        zero_grad.__doc__, zero_grad.__wrapped__ = previous_zero_grad.__doc__, previous_zero_grad  # type: ignore[attr-defined]
        Optimizer.zero_grad = zero_grad

        # A resumed run: FSDP2 keeps no step count, but an optimizer's restored state does
        # (Adam's and AdamW's "step"), so the steps go on from the checkpoint's, as the
        # script's own numbering and DeepSpeed's global step do. Once per load.
        previous_load = Optimizer.__dict__["load_state_dict"]

        def load_state_dict(optimizer, *args, **kwargs):
            result = previous_load(optimizer, *args, **kwargs)
            if not agent.closed and not agent.in_step and not is_compiling():
                steps = _restored_steps(optimizer)
                if steps is not None:
                    agent.optimizer_steps = steps
            return result

        load_state_dict.__name__ = previous_load.__name__
        load_state_dict.__qualname__ = previous_load.__qualname__
        load_state_dict.__doc__, load_state_dict.__wrapped__ = previous_load.__doc__, previous_load  # type: ignore[attr-defined]
        Optimizer.load_state_dict = load_state_dict

        def restore():
            if DTensor.__dict__.get("to_local") is to_local:
                DTensor.to_local = previous
            if Optimizer.__dict__.get("zero_grad") is zero_grad:
                Optimizer.zero_grad = previous_zero_grad
            if Optimizer.__dict__.get("load_state_dict") is load_state_dict:
                Optimizer.load_state_dict = previous_load

        self.to_local_restore = restore

    def _unwatch_to_local(self):
        if self.to_local_restore is not None:
            restore, self.to_local_restore = self.to_local_restore, None
            restore()

    # ------------------------------------------------------------------ checkpoints
    def _watch_checkpoints(self):
        """torch.save and nn.Module.load_state_dict, wrapped while the agent observes (not
        paused, not closed), for the two ways a checkpoint of a sharded model goes wrong
        (docs/fsdp.md, "Checkpoints that lose data"): torch.save of DTensor shards
        (partitioned_save, _check_save) and load_state_dict of plain full tensors into them
        (partitioned_load, _check_load). Each is recorded and said before torch's own function
        runs, unchanged, with the same arguments: its result or exception is the script's.
        Nothing runs on a training step; a save or load costs a walk of its state dict.

        load_state_dict is wrapped on nn.Module rather than hooked by a load-state-dict pre-hook
        on the sharded modules: pretrained weights are loaded right after fully_shard, before
        the root's first forward (where the agent learns the root), so a pre-hook would have
        to go on every module fully_shard is called on and come off each at pause(); torch
        runs a module's pre-hooks once per submodule inside its recursion, where the wrapper
        sees one call, the one the script made, with its line; and the wrapper is what
        Optimizer.load_state_dict's and DTensor.to_local's are (_watch_to_local), put back the
        same way."""
        if self.checkpoint_restore is not None:
            return
        import torch
        import torch.nn as nn

        agent = self

        def checking():
            """fully_shard was called, and the wrapper is still the agent's to run (another
            wrapper put over it keeps it in its chain after pause() or finish())."""
            return (agent.root is not None or agent.candidate is not None) and not (
                agent.closed or agent.is_paused or agent.checkpoint_check_failed)

        previous_save = torch.save

        def save(obj, *args, **kwargs):
            if checking():
                agent._checked(agent._check_save, obj, sys._getframe(1))
            return previous_save(obj, *args, **kwargs)

        previous_load = nn.Module.__dict__["load_state_dict"]

        def load_state_dict(module, *args, **kwargs):
            if not checking():
                return previous_load(module, *args, **kwargs)
            state_dict = args[0] if args else kwargs.get("state_dict")
            if not agent._checked(agent._check_load, module, state_dict, sys._getframe(1)):
                return previous_load(module, *args, **kwargs)
            # torch's copy_ of the plain tensors into the shards is that load's, recorded
            # above: not a read of a shard by the script (the read watching's mode sees it)
            agent.hot.inside += 1
            try:
                return previous_load(module, *args, **kwargs)
            finally:
                agent.hot.inside -= 1

        wrapper: Any
        for wrapper, previous in ((save, previous_save), (load_state_dict, previous_load)):
            wrapper.__name__, wrapper.__qualname__ = previous.__name__, previous.__qualname__
            wrapper.__doc__, wrapper.__wrapped__ = previous.__doc__, previous
        setattr(torch, "save", save)
        setattr(nn.Module, "load_state_dict", load_state_dict)

        def restore():
            if torch.save is save:
                setattr(torch, "save", previous_save)
            if nn.Module.__dict__.get("load_state_dict") is load_state_dict:
                setattr(nn.Module, "load_state_dict", previous_load)

        self.checkpoint_restore = restore

    def _unwatch_checkpoints(self):
        if self.checkpoint_restore is not None:
            restore, self.checkpoint_restore = self.checkpoint_restore, None
            restore()

    def _checked(self, check, *args):
        """check(*args); a check that fails says so once and is not made again: the script's
        save or load goes on as without the agent. The checks read tensors' attributes and
        sizes, and to_local() of state_dict()'s DTensors, which are not the parameters: nothing
        the read watching records, so they run with it as it is (also on the threads torch's
        asynchronous checkpoint saves from, where it is not entered)."""
        try:
            return check(*args)
        except Exception as failed:
            self.checkpoint_check_failed = True
            print(f"shardscope: rank {self.rank}: the checkpoint check failed "
                  f"({type(failed).__name__}: {failed}); saves and loads go on unobserved by it",
                  file=sys.stderr, flush=True)
            return False

    @staticmethod
    def _in_distributed_checkpoint(frame):
        """Whether torch's distributed checkpoint (DCP) is on the stack at or above frame: it
        torch.save's each rank's plain local tensors itself, the right way."""
        return _frames.called_by(frame, "torch.distributed.checkpoint")

    def _checkpoint_root(self):
        """The root (the candidate attached as the root, as a read before the first forward
        does: _mixed), or None."""
        if self.root is None and self.candidate is not None and self.candidate() is not None:
            self.hot.inside += 1
            try:
                self.attach(self.candidate())
            finally:
                self.hot.inside -= 1
        return self.root

    def _check_save(self, obj, caller):
        """torch.save(obj, f) where obj holds DTensors that a Shard placement splits over more
        than one rank (model.state_dict() of a sharded model, alone or in a dict or list):
        each rank's file holds its own shards alone. Recorded (partitioned_save, on the root,
        at the script's line; the first such key, how many, the bytes in the other ranks'
        shards) and said once per line. Not recorded: plain tensors (get_model_state_dict with
        full_state_dict=True, or each rank's to_local() shards on purpose), nor torch's
        distributed checkpoint's own torch.save calls."""
        found = _tensors_in(obj, _shard_loss)
        if not found or self._in_distributed_checkpoint(caller):
            return False
        root = self._checkpoint_root()
        if root is None:
            return False
        by_name = {name: pid for pid, name in self.names.items()}
        named = next((path for path, _ in found if path and path[-1] in by_name), None)
        path = named or found[0][0]
        param = path[-1] if named else ".".join(str(k) for k in path)
        self.record_checkpoint("partitioned_save", self.module_id(root), "torch.save", caller,
                               param=param, param_id=by_name.get(param), params=len(found),
                               bytes=sum(b for _, b in found))
        return True

    def _check_load(self, module, state_dict, caller):
        """module.load_state_dict(state_dict) where state_dict gives plain tensors of a
        parameter's full shape for parameters fully_shard holds as DTensor shards: torch
        cannot copy them into the shards (docs/fsdp.md). Recorded (partitioned_load, on the
        module, at the script's line; the first such parameter, how many, the bytes given) and
        said once per line, before torch's load runs; DTensors (a sharded state dict, or
        set_model_state_dict's, which loads through this method) are not recorded."""
        import torch
        from torch.distributed.tensor import DTensor

        if not isinstance(state_dict, Mapping):
            return False
        found = []
        for name, p in module.named_parameters():
            if isinstance(p, DTensor) and _sharded(p):
                given = state_dict.get(name)
                if isinstance(given, torch.Tensor) and not isinstance(given, DTensor) \
                        and given.shape == p.shape:
                    found.append((name, p, given.numel() * given.element_size()))
        if not found or not any(_fi.state_of(m) is not None for m in module.modules()):
            return False  # no FSDP2 module holds them: tensor parallelism's DTensors
        if self._in_distributed_checkpoint(caller):
            return False
        self._checkpoint_root()
        owner = self.module_id(module)
        path = self.paths.get(owner, "")
        name, p, _ = found[0]
        entry = self.pids.get(id(p))
        self.record_checkpoint("partitioned_load", owner, "", caller,
                               param=f"{path}.{name}" if path else name,
                               param_id=entry[0] if entry else None, params=len(found),
                               bytes=sum(b for _, _, b in found))
        return True

    def _enter_mode(self):
        if self.mode is not None or self.closed:
            return
        if self.mode_class is None:
            self.mode_class = self._shard_reads_class()
        self.mode = self.mode_class()
        self.mode.__enter__()

    def _shard_reads_class(self):
        """The read watching: a TorchFunctionMode, made once (entered and left several times a
        step: after backward, after the optimizer's step and zero_grad). Under dynamo's trace
        (a compiled loss, say) it lets every op through: looking parameters up by id() there
        would guard the compiled code on each tensor's identity, a recompile every step."""
        import torch
        from torch.distributed.tensor import DTensor
        from torch.overrides import TorchFunctionMode

        agent, hot = self, self.hot
        is_compiling = torch.compiler.is_compiling

        class ShardReads(TorchFunctionMode):

            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if is_compiling() or hot.inside or func in METADATA_ONLY:
                    return func(*args, **kwargs)
                hit, plain = agent._mixed(args, kwargs)
                if hit is not None and plain:
                    agent.on_shard_read(*hit)
                r = func(*args, **kwargs)
                if hit is not None and not plain and isinstance(r, DTensor):
                    agent._derived(r, hit[1])  # model.w.t(), then mixed: still model.w's read
                return r

        return ShardReads

    def _leave_mode(self):
        if self.mode is not None:
            mode, self.mode = self.mode, None
            leave_mode(mode)

    def _mixed(self, args, kwargs):
        """(param, its record) when a sharded FSDP parameter meets a plain tensor in one op."""
        import torch
        from torch.distributed.tensor import DTensor

        if self.root is None:
            if self.candidate is None or self.candidate() is None or not self._mixes(args, kwargs):
                return None, False
            self.hot.inside += 1
            try:
                self.attach(self.candidate())
            finally:
                self.hot.inside -= 1
        hit = None
        plain = False
        for value in (*args, *kwargs.values()):
            for v in (value if isinstance(value, (list, tuple)) else (value, )):
                entry = self.pids.get(id(v))
                if entry is not None and entry[2].sharded_param is v and entry[1].status != UNSHARDED:
                    hit = (v, entry)
                    continue
                derived = self.derived.get(id(v))
                if derived is not None and derived[0] is v:
                    hit = (derived[1][2].sharded_param, derived[1])
                elif isinstance(v, torch.Tensor) and not isinstance(v, DTensor):
                    plain = True
        return hit, plain

    def _derived(self, tensor, entry):
        """A DTensor computed from a sharded parameter outside forward (a view, a slice): a
        plain tensor meeting it later is that parameter's read. The last 64 are kept."""
        self.derived[id(tensor)] = (tensor, entry)
        if len(self.derived) > 64:
            self.derived.pop(next(iter(self.derived)))

    @staticmethod
    def _mixes(args, kwargs):
        """Whether an op mixes a DTensor parameter with a plain tensor (before attach)."""
        import torch
        from torch.distributed.tensor import DTensor

        d = t = False
        for value in (*args, *kwargs.values()):
            for v in (value if isinstance(value, (list, tuple)) else (value, )):
                if isinstance(v, DTensor):
                    d = d or isinstance(v, torch.nn.Parameter)
                elif isinstance(v, torch.Tensor):
                    t = True
        return d and t

    def _bypassed_unit(self):
        """The innermost FSDP unit whose method is running without FSDP's pre-forward: its
        forward (or another method) called directly. None: a read in the training loop."""
        import torch.nn as nn

        frame: Optional[FrameType] = sys._getframe(2)
        while frame is not None:
            obj = frame.f_locals.get("self")
            if isinstance(obj, nn.Module) and id(obj) in self.mids and _fi.state_of(obj) is not None:
                return obj
            frame = frame.f_back
        return None

    def on_shard_read(self, param, entry):
        import torch

        pid, rec, fp = entry
        self.hot.inside += 1
        try:
            unit = self._bypassed_unit()
            accessor = self.mids[id(unit)] if unit is not None else None
            use = "grad" if param.requires_grad and torch.is_grad_enabled() else "read"
            action = "error" if self.guard == "error" else "recorded"
            # Where in the user's code, as the DeepSpeed agent finds it (only here, on a read
            # that is a violation, never per access).
            frame = _frames.user_frame(sys._getframe(1))
            location = _frames.location(frame) if frame is not None else None
            message, fix = self.native.unregistered_access(accessor, pid, action, use,
                                                           location=location)
            # Said and flushed once per violation and place; a read the user repeats only
            # counts from then on (the DeepSpeed agent's rule, issue #30 defect 7).
            key = (accessor, pid, action, use, location[:2] if location else None)
            first = key not in self.reported
            if first:
                self.reported.add(key)
                self.flush()  # torch's error follows: the diagnosis first
        finally:
            self.hot.inside -= 1
        if self.guard == "error":
            raise UnregisteredAccessError(f"shardscope: {message}", fix)
        if first:
            print(f"shardscope: rank {self.rank}: {message}\n  fix: {fix}", file=sys.stderr,
                  flush=True)

    # ------------------------------------------------------------------ FSDP's methods
    # unshard, _to_unsharded, _to_sharded(_post_forward), pre/post_forward, pre/post_backward,
    # _prefetch_unshard, foreach_reduce and foreach_all_gather are observed natively (FsdpPath,
    # python/shardscope/fsdppath.cpp: native_hook); the methods below, once a step or rarer, in
    # Python.
    def native_hook(self, owner, name, original):
        """_fsdpinternals.install's question: FsdpPath's replacement for this method (owner: its
        class) or function (owner: its module), or None."""
        if owner in ("FSDPParamGroup", "_fsdp_param_group"):
            return self.hot.hook(name, original)
        return None

    def _reduce_size(self, unsharded_grads, group, reduce_dtype):
        """(bytes, on the CPU) of a group's gradient reduce-scatter, as FsdpPath's foreach_reduce
        hook asks for it when its parameters, process group or reduce dtype change: every
        gradient's dim 0 padded to the shard world, in the reduce dtype (None: the gradients'
        own)."""
        import torch

        world = group.size() if group is not None else 1
        if not isinstance(reduce_dtype, torch.dtype):
            reduce_dtype = unsharded_grads[0].dtype
        numel = 0
        for grad in unsharded_grads:
            shape = grad.shape
            rows = shape[0] if len(shape) else 1
            numel += -(-rows // world) * world * (grad.numel() // rows if rows else 0)
        return numel * reduce_dtype.itemsize, unsharded_grads[0].device.type == "cpu"

    def _pending_reduce(self, event, unit, nbytes, n, group=0, seq=0):
        """A CUDA reduce-scatter issued (FsdpPath): its end (and its collective's, group and
        seq) when its event is seen complete."""
        self.reduces.append((event, unit, None, nbytes, n, group, seq))
        self.hot.pending_reduces = True

    def poll_reduces(self, wait=False):
        super().poll_reduces(wait)
        if not self.reduces:
            self.hot.pending_reduces = False

    def on_root_pre_forward(self, fn, state, module, *args, **kwargs):
        r = fn(state, module, *args, **kwargs)
        if (self.root is not None and not self.closed and not self.in_root_forward
                and _fi.iter_forward_root(state) is state):
            self.in_root_forward = True
            self.hot.clear_scopes()
            self.derived.clear()
            self._leave_mode()  # FSDP unshards what the forward reads: nothing to watch
            if not self.in_step:
                self.begin_step()
        return r

    def on_force_complete_incomplete_states(self, fn, state, *args, **kwargs):
        self.hot.inside += 1
        try:
            return fn(state, *args, **kwargs)
        finally:
            self.hot.inside -= 1
            if self.in_root_forward and not self.closed:
                self.in_root_forward = False
                self._enter_mode()

    def on_init(self, fn, state, modules, *args, **kwargs):
        if not self.closed:
            self._check_shard_order(state, modules)
        if not self.torch_checks_tied and not self.closed:
            # fully_shard creates the group after init: what it will manage is read now
            for p, m, name in self._managed_params(modules):
                prev = self.orig_params.get(id(p))
                if prev is None or prev[0]() is not p:
                    self.orig_params[id(p)] = (weakref.ref(p), state, m, name)
                elif prev[1] is not state:
                    self.tied_found.append((prev[1], prev[2], prev[3], state))
        r = fn(state, modules, *args, **kwargs)
        if not self.closed and self.root is None and len(modules) == 1:
            # fully_shard is called bottom-up: the last module is the root, until FSDP's own
            # lazy init (the root's first forward) says which. Until then a read that mixes
            # a sharded parameter with a plain tensor (model.forward(x) called directly
            # before any model(x)) is attributed to this candidate.
            self.candidate = weakref.ref(modules[0])
            # Not named after it: bottom-up, the first candidates are blocks (a torchtitan-style
            # job listed as "Block"). The model keeps its provisional name until the root is
            # known; a job's ranks are one job whatever each calls its model meanwhile
            # (wire::checkOneJob).
            self._enter_mode()
        return r

    def _check_shard_order(self, state, modules):
        """fully_shard(modules) on a module inside one fully_shard was called on before
        (parents before children: a loop over model.modules() on T5, whose blocks hold a
        ModuleList of layers): its parameters are DTensors of the parent's group already, which
        fully_shard takes for tensor-parallel ones and fails on (torch 2.13: `TypeError:
        Invariant encountered` from _init_sharding_spec_tp with fully_shard's default mesh; a
        mixed-tensor error at the first forward with a named one), naming neither module.
        Recorded (shard_order, with both calls' lines and the children-first fix) and said
        before fully_shard goes on to torch's own error, unchanged. A fully_shard call costs
        the user's frame and a walk of the modules' own parameters."""
        from torch.distributed.tensor import DTensor

        frame = _frames.user_frame(sys._getframe(1))  # the script's fully_shard line
        location = _frames.location(frame) if frame is not None else None
        found = None
        if not self.order_said:
            sharded = None  # id(sharded DTensor) -> (FSDPState), built at the first DTensor met
            for top in modules:
                stack = [top]
                while stack and found is None:
                    m = stack.pop()
                    if m is not top and _fi.state_of(m) is not None:
                        continue  # sharded before it: children first, as fully_shard expects
                    for local, p in m._parameters.items():
                        if not isinstance(p, DTensor):
                            continue  # a DTensor of no FSDP group: tensor parallelism's
                        if sharded is None:
                            sharded = {id(fp.sharded_param): call
                                       for call in self.shard_calls if call[0]() is not None
                                       for g in _fi.groups(call[0]()) for fp in g.fsdp_params}
                        call = sharded.get(id(p))
                        if call is not None:
                            found = (call, top, m, local)
                            break
                    stack.extend(c for c in m._modules.values() if c is not None)
        self.shard_calls.append((weakref.ref(state), location))
        if found is not None:
            self.order_said = True
            self._record_shard_order(*found, location)

    def _record_shard_order(self, parent_call, child, holder, local, location):
        """shard_order: names the modules by their paths in the model that holds them (found
        through gc's referrers: FSDP2 fails before any root is known), then records, flushes
        and says it."""
        parent = parent_call[0]()._modules[0]
        top, _ = walk_up(parent)  # child and holder are in parent's subtree, so in top's
        paths = {}
        self.native.set_model_name(self.model_name or type(top).__name__)
        for path, m in top.named_modules():
            mid = self.native.ensure_module(path, type(m).__name__)
            self.mids[id(m)] = mid
            self.hot.set_module(m, mid)
            self.paths[mid] = path
            paths[id(m)] = path
        holder_path = paths.get(id(holder), "")
        message, fix = self.native.shard_order(
            self.module_id(parent), self.module_id(child),
            f"{holder_path}.{local}" if holder_path else local,
            parent_location=parent_call[1], location=location)
        self.flush()  # torch's error follows: the diagnosis first
        print(f"shardscope: rank {self.rank}: {message}\n  fix: {fix}", file=sys.stderr, flush=True)

    def on_root_post_backward_final_callback(self, fn, state, *args, **kwargs):
        self.hot.inside += 1
        try:
            return fn(state, *args, **kwargs)
        finally:
            self.hot.inside -= 1
            self.poll_reduces()

    def on_lazy_init(self, fn, state):
        first = state._is_root is None
        r = fn(state)
        if first and state._is_root and self.root is None and not self.closed:
            self.attach(state._modules[0])
            self._enter_mode()
            if self.tied_found:
                self._record_tied_found()
        return r

    def on_register_pre_backward_hook(self, fn, state, *args, **kwargs):
        # torch < 2.13: every state's post-forward calls it; the root's while it is still the
        # iteration's root (torch >= 2.13 calls _force_complete_incomplete_states there)
        r = fn(state, *args, **kwargs)
        if (self.in_root_forward and not self.closed
                and _fi.iter_forward_root(state) is state):
            self.in_root_forward = False
            self._enter_mode()
        return r

    @staticmethod
    def _managed_params(modules):
        """(parameter, module, local name) of what fully_shard(modules) will manage: the plain
        parameters of the modules' subtrees, less those of modules already sharded."""
        import torch.nn as nn
        from torch.distributed.tensor import DTensor

        out, seen = [], set()
        for top in modules:
            stack = [top]
            while stack:
                m = stack.pop()
                if m is not top and _fi.state_of(m) is not None:
                    continue
                for name, p in m._parameters.items():
                    if isinstance(p, nn.Parameter) and not isinstance(p, DTensor) \
                            and id(p) not in seen:
                        seen.add(id(p))
                        out.append((p, m, name))
                stack.extend(m._modules.values())
        return out

    def _record_tied_found(self):
        """torch < 2.13: a parameter tied into two groups trains as two copies, with no error;
        recorded (and flushed) when the root's first forward begins."""
        seconds: dict = {}  # (first, module, name) -> the other states, in the order found
        for first, module, name, second in self.tied_found:
            others = seconds.setdefault((first, module, name), [])
            if second not in others:
                others.append(second)
        for (first, module, name), others in seconds.items():
            fp1 = next((fp for g in _fi.groups(first) for fp in g.fsdp_params
                        if fp._module_info.module is module and fp._module_info.param_name == name),
                       None)
            entry = self.pids.get(id(fp1.sharded_param)) if fp1 is not None else None
            if entry is None:
                continue
            message, fix = self.native.tied_across_groups(
                entry[0], self.module_id(first._modules[0]), self.module_id(others[0]._modules[0]),
                refused_by_torch=False, more=[self.module_id(o._modules[0]) for o in others[1:]])
            print(f"shardscope: rank {self.rank}: {message}\n  fix: {fix}", file=sys.stderr,
                  flush=True)
        self.tied_found.clear()
        self.flush()

    def on_validate_no_duplicate_params(self, fn, state):
        if not self.closed:
            if self.root is None:
                self.attach(state._modules[0])
            self._check_tied(state)
        return fn(state)

    def _check_tied(self, state):
        """A parameter tied into two or more groups: recorded once, with one fix naming every
        group (T5's shared embedding in the root, encoder and decoder units: a fix per pair
        would name the root twice), and flushed before torch raises (torch >= 2.13, which
        checks it: FSDPState._validate_no_duplicate_params)."""
        seen: dict = {}  # uid -> (first group, its FSDPParam, the other groups in the order found)
        for s in _fi.all_states(state):
            for g in _fi.groups(s):
                for fp in g.fsdp_params:
                    uid = fp._orig_param_uid
                    if uid not in seen:
                        seen[uid] = (g, fp, [])
                    elif g is not seen[uid][0] and g not in seen[uid][2]:
                        seen[uid][2].append(g)
        found = False
        for g1, fp1, others in seen.values():
            entry = self.pids.get(id(fp1.sharded_param)) if others else None
            if entry is None:
                continue
            message, fix = self.native.tied_across_groups(
                entry[0], self.module_id(g1.modules[0]), self.module_id(others[0].modules[0]),
                more=[self.module_id(g.modules[0]) for g in others[1:]])
            print(f"shardscope: rank {self.rank}: {message}\n  fix: {fix}", file=sys.stderr,
                  flush=True)
            found = True
        if found:
            self.flush()
