"""Attach the ShardScope inspector to a real DeepSpeed ZeRO-3 run.

Add two lines to the training script (every rank runs them)::

    import shardscope.deepspeed
    shardscope.deepspeed.install(snapshot_out="run.json")   # before the model is built

    with deepspeed.zero.Init(config_dict_or_path=config):
        model = MyModel()
    engine, *_ = deepspeed.initialize(model=model, ...)      # the agent attaches itself here

``install()`` must come before the model is built so that model-building code, ``zero.Init``
and ``weight_norm`` are seen; ``deepspeed.initialize`` then hands the agent the engine (or call
``attach(engine)`` yourself). Each rank process serves its own endpoint (a 0600 Unix socket
in ``$XDG_RUNTIME_DIR/shardscope/`` and a discovery file naming the job, the rank and the
world size), which ``shardscope --attach`` and ``shardscope-capture`` attach to as to
``shardscope-train``. ``with shardscope.deepspeed.inspect(...):`` does both and ``finish()``.

What is recorded, with DeepSpeed's names: the module tree, every parameter (``ds_id``, name,
owner, shape, dtype, numel, partition numel, padding, persistence), its ``ds_status`` on
this rank, active sub-modules, external registrations (manual or automatic), steps; events
for module forward/backward scopes, fetches (module fetch, prefetch, GatheredParameters,
automatic registration) and releases, registrations, GatheredParameters broadcasts, trace
invalidation; and violations with the line that fixes them (see docs/deepspeed.md).
"""

from __future__ import annotations

import contextlib
import gc
import linecache
import os
import re
import sys
from types import FrameType
from typing import Any, Optional, Union

from . import ShardScopeError, UnregisteredAccessError
from . import _allocator, _native
from . import _dsinternals as _ds
from . import _runtime
from ._agentcore import AgentCore, install_agent
from ._runtime import DEFAULT_HISTORY
from . import _frames
from ._modtree import walk_up
from ._torchmodes import METADATA_ONLY, enter_below, leave_mode

__all__ = ["install", "attach", "finish", "inspect", "agent", "pause", "resume", "paused"]

# What a client attaching before the model exists is told, in the model's name.
_slot = _runtime.AgentSlot("shardscope.deepspeed")  # the process's agent: _slot.agent


def agent() -> Optional[_Agent]:
    """The agent of this process, or None before install()."""
    return _slot.agent


def install(listen: Union[str, bool, None] = None, token: Optional[str] = None,
            snapshot_out: Union[str, os.PathLike[str], bool, None] = None, guard: str = "warn",
            model_name: Optional[str] = None, job: Optional[str] = None, history: int = DEFAULT_HISTORY,
            token_file: Optional[str] = None) -> _Agent:
    """Starts the agent in this rank process; call it before the model is built.

    listen: None for the default private Unix socket, "unix:PATH", "tcp:HOST:PORT", or False
        to serve nothing (snapshot_out only). A non-loopback TCP host needs a token.
    token, token_file: the token clients must present, or a file only you can read (chmod
        600) holding it; default: $SHARDSCOPE_TOKEN, or the file named by
        $SHARDSCOPE_TOKEN_FILE. A token passed here is not visible in the process list.
    snapshot_out: a snapshot file written at finish(), and as soon as a violation is recorded
        that is about to end the run (so the run that crashes still leaves its diagnosis).
    guard: "warn" records unregistered accesses and lets DeepSpeed go on (its silent
        automatic registration, or its own error); "error" raises UnregisteredAccessError
        with the fix line at the first one.
    job: the job's name shared by all its ranks (default: TORCHELASTIC_RUN_ID, else
        MASTER_ADDR:MASTER_PORT).
    """
    agent, new = install_agent(
        _slot, _Agent, "shardscope.deepspeed.install()", "before the model is built",
        _ds.check_version, guard=guard, token=token, token_file=token_file, listen=listen,
        snapshot_out=snapshot_out, history=history, job=job, model_name=model_name)
    built = _built_already() if new else ""
    if built:
        import warnings

        warnings.warn(f"shardscope.deepspeed.install() came after {built}: what happened while "
                      f"the model was built (reads of partitioned parameters, weight_norm's late "
                      f"parameters) was not seen. Call install() first, before the model is "
                      f"built (before zero.Init, from_pretrained or the Trainer)"
                      + ("; for this run, shardscope.deepspeed.attach(engine) shows the engine "
                         "from now on" if "deepspeed.initialize" in built else ""),
                      stacklevel=2)
    return agent


def _built_already() -> str:
    """What install() is late for: '' when nothing is built yet, else what exists (a
    DeepSpeedEngine, or parameters zero.Init partitioned). One walk of gc's objects, once."""
    try:
        import torch
        from deepspeed.runtime.engine import DeepSpeedEngine
    except ImportError:
        return ""
    engines = partitioned = 0
    Parameter = torch.nn.Parameter
    for o in gc.get_objects():
        t = type(o)  # not isinstance: that reads __class__, which some objects warn about
        if issubclass(t, DeepSpeedEngine):
            engines += 1
        elif issubclass(t, Parameter) and "ds_id" in o.__dict__:
            partitioned += 1
    if engines:
        return f"deepspeed.initialize ({engines} DeepSpeedEngine already exist{'s' if engines == 1 else ''})"
    if partitioned:
        return f"zero.Init partitioned {partitioned} parameters"
    return ""


def attach(engine: Any) -> _Agent:
    """Attaches to a DeepSpeedEngine (deepspeed.initialize does this by itself)."""
    if _slot.agent is None:
        raise ShardScopeError("call shardscope.deepspeed.install() before attach(engine), and "
                              "before the model is built")
    _slot.agent.attach(engine)
    return _slot.agent


finish, inspect, pause, resume, paused = _slot.api(install)  # _runtime.AgentSlot









# Tensor methods that read a gathered parameter's metadata, not its values: no read of the
# values for a read in DeepSpeedEngine.forward DeepSpeed gathered ([Note: attribute reads];
# shardscope-check's own module-order hook asks element_size() and numel()). Outside
# forward they still count: there they answer for DeepSpeed's empty placeholder (size 0).
_SHAPE_METHODS = frozenset(("size", "dim", "ndimension", "numel", "nelement", "element_size",
                            "stride", "storage_offset", "is_contiguous", "is_floating_point",
                            "is_complex", "get_device"))






class _Paused:
    """`with suspects.paused():` (a plain class: a generator-based context manager costs
    microseconds, and status changes run it on the training step's path)."""

    __slots__ = ("suspects", )

    def __init__(self, suspects):
        self.suspects = suspects

    def __enter__(self):
        self.suspects.pause += 1

    def __exit__(self, *exc):
        self.suspects.pause -= 1
        return False


class _Suspects:
    """Parameters read while partitioned outside what DeepSpeed coordinates: outside any
    module, or in a module called outside DeepSpeedEngine.forward. Reading the Parameter
    object is legal (handing it to GatheredParameters, say); using its data is the bug. A
    torch function mode, active only while there is a suspect, sees the first op that uses
    one, records the violation and writes the snapshot, then lets the op run (and raise
    DeepSpeed's own error) or raises ours under guard="error".

    [Note: attribute reads] Inside DeepSpeedEngine.forward a module that reads another's
    partitioned parameter by attribute (ZeROOrderedDict.__getitem__) gets it registered and
    gathered by DeepSpeed at once, before anything says what the read is for: every T5 block
    reads `self.wo.weight.dtype`, which touches no values. Such a read is pending (pend) until
    the same mode sees an op use the parameter outside a module holding it (a read of the
    values: recorded then, severity cost, or raised under guard="error"), or until DeepSpeed
    releases it, the reader's scope has ended or the agent stops with none seen (attributes
    only: recorded with use "attribute", severity info, never raised). Attribute getters
    (.dtype, .shape, .device, .requires_grad) reach the mode as METADATA_ONLY and are no
    use, here as for the suspects outside forward; so are the methods that answer from the
    gathered parameter's metadata (size(), numel(), element_size(): _SHAPE_METHODS)."""

    def __init__(self, agent):
        self.agent = agent
        self.params = {}  # id(param) -> (param, accessor module or None)
        # id(param) -> (param, accessor, owner module, (code, line, location) of the read)
        self.pending = {}
        self.mode = None
        self.pause = 0  # the agent's own work on parameters is not a read by the user
        self._paused = _Paused(self)

    def paused(self):
        return self._paused

    def add(self, param, accessor):
        self.params[id(param)] = (param, accessor)
        self._watch()

    def pend(self, param, accessor, owner):
        """A read in DeepSpeedEngine.forward DeepSpeed is about to register and gather: what
        it touches is decided later (the note above). Where it happened is taken now."""
        frame = _frames.user_frame(sys._getframe(1))
        seen = (frame.f_code, frame.f_lineno, _frames.location(frame)) if frame is not None else None
        self.pending[id(param)] = (param, accessor, owner, seen)
        self._watch()

    def _watch(self):
        if self.mode is None:
            from torch.overrides import TorchFunctionMode

            suspects = self

            class SuspectReads(TorchFunctionMode):

                def __torch_function__(self, func, types, args=(), kwargs=None):
                    kwargs = kwargs or {}
                    if not suspects.pause and func not in METADATA_ONLY:
                        if suspects.params:
                            hit = suspects.find(args, kwargs)
                            if hit is not None:
                                suspects.used(hit)
                        if suspects.pending and not suspects.agent.auto and \
                                getattr(func, "__name__", "") not in _SHAPE_METHODS:
                            suspects.values_read(args, kwargs)
                    return func(*args, **kwargs)

            self.mode = SuspectReads()
            enter_below(self.mode)
        self.agent.hot.slow = True  # scopes and gathers must close or discard suspects

    def find(self, args, kwargs):
        for value in (*args, *kwargs.values()):
            if isinstance(value, (list, tuple)):
                for v in value:
                    if id(v) in self.params and self.params[id(v)][0] is v:
                        return self.params[id(v)]
            elif id(value) in self.params and self.params[id(value)][0] is value:
                return self.params[id(value)]
        return None

    def used(self, hit):
        torch = sys.modules["torch"]  # its function mode called this: no import per use
        param, accessor = hit
        self.params.pop(id(param), None)
        if self.agent.ds.is_not_available(param):
            needs_grad = param.requires_grad and torch.is_grad_enabled()
            with self.paused():
                self.agent.record_access(accessor, param, automatic=False, needs_grad=needs_grad)

    def values_read(self, args, kwargs):
        """An op uses a pending parameter: by a module that does not hold it, its values are
        read (the owner's own forward using it is DeepSpeed's business)."""
        top = self.agent.hot.top()
        for value in (*args, *kwargs.values()):
            for v in (value if isinstance(value, (list, tuple)) else (value, )):
                entry = self.pending.get(id(v))
                if entry is None or entry[0] is not v:
                    continue
                if top is not None and _holds(top, v):
                    continue
                del self.pending[id(v)]
                param, accessor, _, seen = entry
                with self.paused():
                    self.agent.record_access(accessor, param, automatic=True, seen=seen)

    def settle(self, params=None, left=False):
        """Pending reads that no op used for their values (params: these, released; left: those
        whose reader's scope has ended; neither: all) are recorded as attribute reads."""
        if not self.pending:
            return
        if params is not None:
            done = [self.pending.pop(id(p)) for p in params
                    if id(p) in self.pending and self.pending[id(p)][0] is p]
        elif left:
            done = [e for e in self.pending.values() if not self.agent.hot.on_stack(e[1])]
            for e in done:
                del self.pending[id(e[0])]
        else:
            done, self.pending = list(self.pending.values()), {}
        with self.paused():
            for param, accessor, _, seen in done:
                self.agent.record_access(accessor, param, automatic=True, attribute=True,
                                         seen=seen)

    def discard(self, params):
        for p in params:
            self.params.pop(id(p), None)

    def close(self, final=True):
        """Pending attribute reads are settled (final: all of them, else those whose reader has
        left; a module scope beginning asks for the second). Leaves the mode once nothing is
        suspect or pending (never from inside the mode's callback).
        torch runs what a mode dispatched with that mode off its stack: a close there (the
        scopes of a loss.backward() that went through the mode) does not find it, and torch
        puts it back when the call returns. It is then kept, and left at the next close
        outside such a call (HotPath asks at every scope while slow); forgetting it there
        left it on the script's stack for good, after finish() too."""
        self.params.clear()
        self.settle(left=not final)
        if self.mode is not None and not self.pending and leave_mode(self.mode):
            self.mode = None
        self.agent.hot.slow = self.mode is not None


class _Agent(AgentCore):
    """The observer DeepSpeed's patched internals call (see _dsinternals)."""

    NOT_BUILT = "(model not built yet: shown once zero.Init or deepspeed.initialize has run)"

    def __init__(self, options, token, guard, model_name, version):

        super().__init__(options, token, guard, model_name, version)
        self.module_key = _ds.module_key_attribute(version)
        # The per-event path (ds_status assignments, module scopes) runs in C++: hotpath.h.
        self.PHASES = dict(_native.PHASES)
        self.PHASE_NAMES = {number: name for name, number in self.PHASES.items()}
        self.hot = _native.HotPath(self.native, self, *_ds.status_members(), _ds.native_names())
        self.engine: Any = None  # the DeepSpeedEngine, once attached
        self.root: Any = None
        self.built = []  # modules built under zero.Init, in build order
        self.converted = {}  # ds_id -> param, every parameter DeepSpeed converted
        self.said_deepcompile = False
        self.late = {}  # id(param) -> provisional id, late parameters not yet adopted
        self.next_late_id = 1 << 20
        self.adopted = set()  # ds_ids of late parameters deepspeed.initialize converted
        self.paths = {}  # our module id -> dotted path
        self.published = set()  # ds_ids the native state lists
        self.suspects = _Suspects(self)
        self.reported = set()  # violations said and flushed (record_access)
        # (accessor, param, action, use, user's code object, line) -> the step it was last
        # recorded in: a repeat there in the same step changes nothing (record_access).
        self.recorded_at = {}
        self.reduce_buckets = {}  # (dtype, ids of a bucket's parameters) -> _reduce_bucket's
        self.reduce_params = {}  # id(param) -> _reduce_param's (the parameter first)
        self.status_at_pause = {}  # while paused: ds_id -> ds_status at pause()
        self.built_violations = False  # a violation named modules while the model was built
        self.unfinished_said = False  # a backward_unfinished recorded (on_backward_raised)
        self.gathered_scopes = []  # open GatheredParameters: (ids of its parameters, modifier_rank)
        try:
            self.ds = _ds.install(self)  # DeepSpeed's patches (pause, resume, uninstall)
        except BaseException:
            self.native.finish()
            raise
        self.sites = _frames.watch_registrations()  # where late parameters were registered
        self.late_sites = {}  # late parameter's name -> "file:line", for shardscope-check
        self.arm()

    # ------------------------------------------------------------------ lifecycle
    @property
    def gathered(self):
        """Depth of GatheredParameters scopes being entered or exited (kept by HotPath)."""
        return self.hot.gathered

    @gathered.setter
    def gathered(self, depth):
        self.hot.gathered = depth

    @property
    def auto(self):
        """Depth of DeepSpeed's automatic registration (kept by HotPath)."""
        return self.hot.auto

    @auto.setter
    def auto(self, depth):
        self.hot.auto = depth

    def _close(self, reason):
        if reason == "training finished" and self.engine is None and self.root is None \
                and not self.converted:
            self.on_nothing_partitioned()
        self.poll_reduces(wait=True)  # the last step's, before the snapshot
        self.sites.remove()
        self.suspects.close()
        self.flush_active()
        try:
            if not self.is_paused:
                self.ds.pause()  # parameters of their own class again, not only the patches out
            self.ds.uninstall()
        finally:
            self.hot.set_engine(None)  # and the last step's loss

    def _pause(self):
        if self.engine is None:
            raise ShardScopeError("pause() is for the training loop: call it after "
                                  "deepspeed.initialize, so that the model is seen being built")
        if self.hot.depth or self.in_step or self.gathered or self.auto:
            raise ShardScopeError("pause() between training steps (after engine.step() and "
                                  "before the next forward), not inside one")
        self.suspects.close()
        self.flush_active()
        self.gathered_scopes.clear()  # a scope closed while paused is not seen closing
        self.status_at_pause = {ds_id: p.__dict__.get("ds_status")
                                for ds_id, p in self.converted.items()}
        self.ds.pause()

    def _unpause(self):
        if self.hot.depth:
            raise ShardScopeError("resume() between training steps, not inside one")
        self.ds.resume()

    def _resumed(self):
        before, self.status_at_pause = self.status_at_pause, {}
        changed = []
        for ds_id, param in self.converted.items():
            status = param.__dict__.get("ds_status")
            if status is not before.get(ds_id) and ds_id in self.published and status is not None:
                changed.append((ds_id, _ds.status_number(status)))
                self.hot.mark_dirty(ds_id)
        if changed:
            self.native.set_statuses(changed)
        self.flush_active()

    def _before_flush(self):
        if self.suspects.pending and not self.suspects.pause:
            self.suspects.settle(left=True)
        self.flush_active()

    # ------------------------------------------------------------------ names
    def module_id(self, module):
        mid = module.__dict__.get("_shardscope_id")
        if mid is None:
            _, path = self._locate(module)
            mid = self._ensure_module(module, path)
        return mid

    def _ensure_module(self, module, path):
        mid = self.native.ensure_module(path, type(module).__name__)
        module.__dict__["_shardscope_id"] = mid
        self.paths[mid] = path
        return mid

    def _locate(self, module):
        """(root, dotted path) of a module: from the attached model when it is in it, else
        from the modules being built (only for what model-building code touches before the
        model has names: slow)."""
        if self.root is not None:
            for path, m in self.root.named_modules():
                if m is module:
                    return self.root, path
        parts = []
        current = module
        for _ in range(64):
            top, rel = walk_up(current)
            if rel:
                parts.append(rel)
            pending = _pending_attribute(top)
            if pending is None:
                return top, ".".join(reversed(parts))
            parts.append(pending[0])
            current = pending[1]
        return current, ".".join(reversed(parts))

    def param_id(self, param):
        ds_id = param.__dict__.get("ds_id")
        if ds_id is not None:
            if ds_id not in self.published:
                self._publish_param(param, None, None)
            return ds_id
        return self.late.get(id(param))

    def _param_name(self, param, owner, local):
        if owner is None:
            seen = param.__dict__.get("_shardscope_seen_as")
            if seen is not None:
                owner, local = seen
        if owner is None:
            return None, f"<ds_id {param.__dict__.get('ds_id')}>"
        mid = self.module_id(owner)
        path = self.paths.get(mid, "")
        return mid, (f"{path}.{local}" if path else local)

    def _publish_param(self, param, owner, local, late=False, replaces=""):
        with self.suspects.paused():
            return self._publish_param_paused(param, owner, local, late, replaces)

    def _publish_param_paused(self, param, owner, local, late, replaces):
        mid, name = self._param_name(param, owner, local)
        late = late or param.__dict__.get("ds_id") in self.adopted
        d = param.__dict__
        if late and "_shardscope_site" in d:
            self.late_sites[name] = d["_shardscope_site"]
        ds_id = d.get("ds_id")
        shape = list(d.get("ds_shape", param.shape))
        numel = int(d.get("ds_numel", param.numel()))
        ds_tensor = d.get("ds_tensor")
        partition = int(ds_tensor.ds_numel) if ds_tensor is not None and hasattr(
            ds_tensor, "ds_numel") else numel
        persistent = bool(d.get("ds_persist", False))
        partitioned = ds_id is not None and not persistent
        pid = ds_id if ds_id is not None else self.late.setdefault(id(param), self._new_late_id())
        status = (_ds.status_number(d["ds_status"]) if "ds_status" in d
                  else _native.PARAM_STATUS_AVAILABLE)
        # What a gather of it moves: the padded tensor (docs/protocol.md, fetch events' u0).
        # Its partition's world: its own group's (ZeRO++ hpZ, DeepSpeed >= 0.19.3), else the job's.
        world = int(d.get("ds_zero_partition_world_size", self.world_size))
        d["_shardscope_nbytes"] = (partition * world if partitioned else numel) * param.element_size()
        d["_shardscope_owner"] = mid if mid is not None else 0  # a GatheredParameters' module
        self.native.set_param(id=pid, name=name, owner=mid if mid is not None else 0, shape=shape,
                              dtype=str(param.dtype).replace("torch.", ""), numel=numel,
                              partition_numel=partition if partitioned else numel,
                              padded_numel=partition * world if partitioned else numel,
                              persistent=persistent, partitioned=partitioned, late=late,
                              status=status, replaces=replaces,
                              element_size=param.element_size())
        if ds_id is not None:  # after set_param: the hot path may count its hpZ partition
            self.published.add(ds_id)
            self.hot.publish(ds_id, d["_shardscope_nbytes"], param, _ds.has_hpz_group(param))
        return pid

    def _new_late_id(self):
        self.next_late_id += 1
        return self.next_late_id - 1

    def publish(self, root, late_scan):
        """The module tree under root, every parameter in it, and (late_scan) the late ones."""
        self.root = root
        self.native.set_model_name(self.model_name or type(root).__name__)
        ds_model = any("ds_id" in p.__dict__ for p in root.parameters())
        # A parameter tied into several modules (T5's shared.weight is also each stack's
        # embed_tokens.weight and lm_head.weight) keeps its first name, named_parameters()'s:
        # the one the user's code calls it by.
        done = set()
        moved = {}  # our module id while the model was built -> its id in the model
        for path, module in root.named_modules():
            before = module.__dict__.get("_shardscope_id")
            mid = self._ensure_module(module, path)
            if before is not None and before != mid:
                moved[before] = mid
            key = module.__dict__.get(self.module_key)  # what ds_active_sub_modules holds
            if key is not None:
                self.hot.map_module(key, mid)
            for local, param in module._parameters.items():
                if param is None or id(param) in done:
                    continue
                done.add(id(param))
                if "ds_id" in param.__dict__ or not ds_model:
                    late = param.__dict__.get("ds_id") in self.adopted
                    self._publish_param(param, module, local, late=late,
                                        replaces=_replaced_by(module, local, path) if late else "")
                    continue
                known = id(param) in self.late
                pid = self._publish_param(param, module, local, late=True,
                                          replaces=_replaced_by(module, local, path))
                if late_scan and not known:
                    self.native.late_parameter(pid, location=_frames.site(param))
        for ds_id, param in list(self.converted.items()):
            seen = param.__dict__.get("_shardscope_seen_as")
            if seen is not None and seen[1] not in seen[0]._parameters:
                # Removed from its module (weight_norm's old weight): its name stays known.
                self._publish_param(param, seen[0], seen[1])
                self.native.remove_param(ds_id)
                self.published.discard(ds_id)
                self.hot.unpublish(ds_id)
        # Parameters no module holds any more: replaced after zero.Init converted them (the
        # tied copies of T5's shared.weight, once Transformers ties the weights).
        held = {p.__dict__["ds_id"] for p in root.parameters() if "ds_id" in p.__dict__}
        for ds_id in sorted(self.published - held):
            self.native.remove_param(ds_id)
            self.published.discard(ds_id)
            self.hot.unpublish(ds_id)
        if moved or self.built_violations:
            # What was recorded while the model was built, now with the final dotted names.
            self.native.complete_build_names(moved)

    # ------------------------------------------------------------------ violations
    def record_access(self, accessor, param, automatic, needs_grad=False, attribute=False,
                      seen=None):
        """Records an unregistered access, hands it to clients and snapshot_out now, and
        raises under guard="error". automatic: DeepSpeed registers it itself (and gathered
        it). needs_grad: autograd records the read (its fix is not GatheredParameters).
        attribute: it read attributes only (.dtype), no values: severity info, never raised.
        seen: (code, line, location) of a read in forward decided later (_Suspects.pend),
        while the parameter was NOT_AVAILABLE; None: the caller's frame, now."""
        mid = self.module_id(accessor) if accessor is not None else None
        pid = self.param_id(param)
        if pid is None:
            return
        # Model-building code: a read there initialises or changes it.
        use = ("write" if self.engine is None else "attribute" if attribute else
               "grad" if needs_grad else "read")
        raises = self.guard == "error" and not attribute
        action = ("error" if raises else "auto_registered" if automatic else "recorded")
        # Only here, when a violation is recorded (never per access): where in the user's code.
        here = sys._getframe(1)
        if seen is not None:
            frame = None
            code, line, location = seen
        else:
            frame = _frames.user_frame(here)
            code, line = (frame.f_code, frame.f_lineno) if frame is not None else (None, None)
            location = None
        building_now = self.engine is None and self.root is None
        # A read the user repeats at one place (a loop outside forward): after the first record
        # there in a step, the native state keeps one row per place and step, so a repeat
        # changes nothing; it is known by the user's frame's (code, line), without the chain
        # of callers, the native call or its words (issue #26: 13 us a use before).
        repeat = None
        if code is not None and not building_now and not raises:
            repeat = (mid, pid, action, use, code, line)
            step = self.native.step
            if self.recorded_at.get(repeat) == step:
                return
        if frame is not None:
            location = _frames.location(frame)
        building = param_code = ""
        if building_now:
            building, param_code = _building(here, frame, param)
            self.built_violations = True
        message, fix = self.native.unregistered_access(
            mid, pid, action, use, location=location, building=building, param_code=param_code,
            status_at_read=_native.PARAM_STATUS_NOT_AVAILABLE if seen is not None else None)
        if repeat is not None:
            self.recorded_at[repeat] = step
        # Said and flushed once per violation and place: a read the user repeats (a loop outside
        # forward) only counts from then on, so it stays cheap (issue #30, defect 7: each
        # rewrote the snapshot, milliseconds per read); finish() writes the final counts.
        key = (mid, pid, action, use, location[:2] if location else None)
        if key in self.reported:
            if raises:
                raise UnregisteredAccessError(f"shardscope: {message}", fix)
            return
        self.reported.add(key)
        if not automatic or raises:
            self.flush()  # the run is about to fail: its diagnosis first
        if not automatic and not raises:
            # DeepSpeed's own error follows: say which read it was, and the fix, above it.
            print(f"shardscope: rank {self.rank}: {message}\n  fix: {fix}", file=sys.stderr,
                  flush=True)
        if raises:
            raise UnregisteredAccessError(f"shardscope: {message}", fix)

    def on_param_read(self, module, key, param, in_engine_forward):
        accessor = self.hot.top()
        if accessor is not None and in_engine_forward:
            # DeepSpeed registers it on the running module and gathers it, silently; whether
            # the read touches its values or only attributes (T5's `self.wo.weight.dtype`) is
            # decided by what uses it next ([Note: attribute reads], _Suspects).
            self.suspects.pend(param, accessor, module)
        elif not self.suspects.pause:
            self.suspects.add(param, accessor)

    # ------------------------------------------------------------------ DeepSpeed's events
    def on_param_converted(self, param):
        ds_id = param.__dict__["ds_id"]
        self.converted[ds_id] = param
        if id(param) not in self.late:
            # Partitioned in time: where it was registered is not needed (_frames.watch_registrations
            # keeps it for the late ones; a late one adopted now keeps it).
            param.__dict__.pop("_shardscope_site", None)

    def on_deepcompile(self):
        if self.said_deepcompile:
            return
        self.said_deepcompile = True
        print("shardscope: DeepCompile (\"compile\": {\"deepcompile\": true}) gathers and "
              "releases ZeRO-3's parameters inside the compiled graph and takes DeepSpeed's module "
              "hooks out: from engine.compile() on, the inspector shows no module scopes and no "
              "unregistered accesses, and only the gathers DeepSpeed still makes in Python. To "
              "inspect the sharding, run a few steps with engine.compile() without DeepCompile, "
              "or without compile.", file=sys.stderr)

    def on_nothing_partitioned(self):
        """The script ran to its end and DeepSpeed partitioned nothing here: the empty
        inspector would otherwise be all the user sees of a run that did not use ZeRO-3."""
        print(f"shardscope: rank {self.rank}: the script ended without DeepSpeed partitioning "
              f"a model in this process (neither zero.Init nor a ZeRO-3 deepspeed.initialize "
              f"ran), so the inspector and the snapshot have no model to show. If DeepSpeed "
              f"was meant to run: Accelerate ignores its DeepSpeed plugin under "
              f"Accelerator(cpu=True) or ACCELERATE_USE_CPU=true (check that "
              f"accelerator.distributed_type is DistributedType.DEEPSPEED), and a Trainer "
              f"uses DeepSpeed only with TrainingArguments(deepspeed=<a ZeRO-3 config>).",
              file=sys.stderr)

    def on_unobservable_class(self, cls):
        print(f"shardscope: parameters of class {cls.__module__}.{cls.__qualname__} cannot be "
              f"observed (their class takes no ds_status descriptor); their fetches and "
              f"releases are not recorded", file=sys.stderr)

    def on_module_built(self, module):
        self.built.append(module)

    def on_init_exit(self, failed):
        if not self.built:
            return
        roots = _roots(self.built)
        if len(roots) == 1:
            # Also when the build failed (issue #30, defect 11): what was built is shown, and
            # the process names its model as its peers do (one job, not two).
            try:
                with self.suspects.paused():
                    self.publish(roots[0], late_scan=True)
            except Exception as e:
                if not failed:
                    raise
                print(f"shardscope: the model that failed to build cannot be shown: {e}",
                      file=sys.stderr)
        self.built.clear()

    def own_ds_ids(self, module):
        """The ds_ids of a module's own and registered parameters: its fetches of these are
        `forward`/`backward`, of others `prefetch` (HotPath asks once per module, again after
        a registration changes them)."""
        return [p.__dict__["ds_id"] for p in self.ds.iter_params(module) if "ds_id" in p.__dict__]

    def suspects_close(self):
        """A module scope begins: reads after it are DeepSpeed's (HotPath, while suspects exist)."""
        if self.suspects.params or self.suspects.mode is not None:
            self.suspects.close(final=False)

    def suspects_released(self, param):
        """DeepSpeed released param: a pending read no op used for its values read attributes
        only (HotPath, while suspects exist)."""
        if self.suspects.pending:
            self.suspects.settle((param, ))

    def suspects_available(self, param):
        """param was gathered: using it is no longer the bug (HotPath, while suspects exist)."""
        if self.suspects.params:
            self.suspects.discard((param, ))

    def flush_active(self):
        """ds_active_sub_modules of the parameters whose status changed, sent (HotPath)."""
        self.hot.flush_active()

    @contextlib.contextmanager
    def automatic_registration(self):
        self.auto += 1
        try:
            yield
        finally:
            self.auto -= 1

    def on_register_external(self, module, param):
        self.hot.forget_own(self.module_id(module))
        pid = self.param_id(param)
        if pid is not None:
            automatic = self.auto > 0 or sys._getframe(2).f_code.co_name == "_post_forward_module_hook"
            self.native.register_external(self.module_id(module), pid, automatic)

    def on_unregister_external(self, module, param):
        self.hot.forget_own(self.module_id(module))
        pid = self.param_id(param)
        if pid is not None:
            self.native.unregister_external(self.module_id(module), pid)

    def on_trace_invalidated(self, expected):
        entry = self.hot.top_entry()
        if entry is None:
            return
        got, phase = entry
        self.native.trace_invalidated(self.module_id(expected) if expected is not None else None,
                                      self.module_id(got), self.PHASE_NAMES[phase])

    def on_gathered_enter(self, params):
        self.suspects.discard(params)
        self.gathered += 1

    def on_gathered_entered(self, params):
        self.gathered -= 1

    def on_gathered_exit(self, params, src_rank):
        if src_rank is not None:
            with self.suspects.paused():
                for p in params:
                    pid = self.param_id(p)
                    if pid is not None:
                        # u0 as fetch events carry it: the padded tensor's bytes
                        nbytes = p.__dict__.get("_shardscope_nbytes", p.numel() * p.element_size())
                        self.native.broadcast(pid, int(src_rank), int(nbytes))
        self.gathered += 1

    def on_gathered_exited(self, params):
        self.gathered -= 1

    def gathered_collectives(self, params, kind):
        """A GatheredParameters scope is about to gather its parameters ("all_gather": those
        NOT_AVAILABLE, one collective per process group, as DeepSpeed issues them) or to
        broadcast them from modifier_rank at its exit ("broadcast": one for the scope's
        broadcasts): collective_begin for each, reason gathered_parameters, with the
        parameters' padded bytes and the module when they are all one module's (else the
        root). Returns [(group, seq)] for end_collectives."""
        if self.closed or self.is_paused or not params:
            return ()
        by_group: dict = {}
        for p in params:
            d = p.__dict__
            if "ds_id" not in d or (kind == "all_gather" and not self.ds.is_not_available(p)):
                continue
            if int(d.get("ds_zero_partition_world_size", self.world_size)) <= 1:
                continue
            pg = d.get("ds_process_group")
            by_group.setdefault(id(pg), (pg, []))[1].append(p)
        begun = []
        for pg, ps in by_group.values():
            nbytes, owners = 0, set()
            for p in ps:
                d = p.__dict__
                if "_shardscope_nbytes" in d:
                    nbytes += d["_shardscope_nbytes"]
                    owners.add(d.get("_shardscope_owner", 0))
                else:  # not published yet (while the model is built)
                    _, numel, itemsize, owner, _ = self._reduce_param(p)
                    nbytes += numel * itemsize
                    owners.add(owner)
            module = owners.pop() if len(owners) == 1 else 0
            group = self.group_number(pg)
            begun.append((group, self.native.collective_begin(kind, group, module,
                                                              "gathered_parameters", nbytes,
                                                              len(ps))))
        return begun

    def end_collectives(self, begun):
        """collective_end for what gathered_collectives began (DeepSpeed's call returned, or
        raised: not waiting any more)."""
        for group, seq in begun:
            self.native.collective_end(group, seq)

    def on_gathered_scope(self, params, src_rank, opened):
        """A GatheredParameters scope opened (its gathers done) or about to close: the
        parameters a change inside it keeps (modifier_rank: broadcast from that rank) or
        discards (none), for on_load_state_dict. Scopes nest; each is one entry."""
        entry = (frozenset(map(id, params)), src_rank)
        if opened:
            self.gathered_scopes.append(entry)
        elif entry in self.gathered_scopes:
            self.gathered_scopes.remove(entry)

    @property
    def in_step(self):
        return self.hot.in_step

    def on_engine_forward(self, engine):
        """A forward while no engine is attached (the native forward hook handles every other):
        attach to this one, then begin the step as the hook would."""
        if self.engine is None:
            self.attach(engine)
        if self.hot.in_step:
            self.hot.close_scopes()
        else:
            self.hot.in_step = True
            self.hot.begin_step(int(getattr(engine, "global_steps", -1)) + 1)

    def on_late_adopted(self, module, params):
        for param in params:
            if "ds_id" not in param.__dict__:
                continue
            provisional = self.late.pop(id(param), None)
            seen = _owner_of(module, param)
            if seen is None:
                continue
            owner, local, path = seen
            replaces = _replaced_by(owner, local, path)
            if provisional is not None:
                self.native.remove_param(provisional)
            self.adopted.add(param.__dict__["ds_id"])
            pid = self._publish_param(param, owner, local, late=True, replaces=replaces)
            self.native.parameter_adopted(pid)

    def on_initialize(self, engine):
        self.attach(engine)

    def on_backward_raised(self, engine, error):
        """engine.backward(loss) raised (the native hook), or a plain loss.backward() inside a
        step (DeepSpeed >= 0.18.3, the backward watcher); the exception goes on to the script
        unchanged whatever happens here. ZeRO-3 reduce-scatters and averages the gradients in
        the backward's epilogue: when the pass is left by an exception after gradients were
        bucketed (stage 3's IPG buckets), they stay there, and a script that catches it and
        goes on (a batch skipped after an out-of-memory error) fails in DeepSpeed later, at
        the next backward (AssertionError, the same parameters bucketed twice) or step
        (TypeError, no averaged gradients), far from the cause. Recorded once
        (backward_unfinished, its words in engine/state/violationtext.cpp), at the script's
        backward line, and said on stderr. Nothing bucketed (the pass failed before any
        gradient), the guard's own error, or a run being stopped (KeyboardInterrupt,
        SystemExit): nothing to say."""
        if (self.closed or self.unfinished_said or not isinstance(error, Exception)
                or isinstance(error, UnregisteredAccessError)):
            return
        try:
            left = _ds.bucketed_params(getattr(engine, "optimizer", None))
            if not left:
                return
            self.unfinished_said = True
            frame = _frames.user_frame(sys._getframe(1))  # the script's backward line
            message, fix = self.native.backward_unfinished(
                self.module_id(engine.module), raised=_runtime.raised_line(error),
                bucketed=len(left),
                location=_frames.location(frame) if frame is not None else None)
            self.flush()
            print(f"shardscope: rank {self.rank}: {message}\n  fix: {fix}", file=sys.stderr,
                  flush=True)
        except Exception as failed:
            self.unfinished_said = True
            print(f"shardscope: rank {self.rank}: the check of what the failed backward left "
                  f"in DeepSpeed failed ({type(failed).__name__}: {failed})", file=sys.stderr,
                  flush=True)

    # ------------------------------------------------------------------ checkpoints
    # [Note: checkpoints] ZeRO-3 keeps every partitioned parameter as a placeholder of size 0
    # between its gathers, so a state dict taken outside DeepSpeed's own save functions holds
    # empty tensors, torch.save writes them with no error, and a full state dict cannot be
    # loaded into the placeholders. The patches (_dsinternals.Patched._checkpoints) hand each
    # call here; what is recorded (partitioned_save, partitioned_load, resume_world_size, words
    # in engine/state/violationtext.cpp) names the user's line and is said once per line on
    # stderr, before the call runs on (a load's own error follows, unchanged). DeepSpeed's own
    # calls (save_checkpoint takes the module's state dict, load_checkpoint loads it, with the
    # partitions beside them) and parameters gathered at the call (GatheredParameters around
    # it, the fix) give nothing. A failure here is said and the call goes on unchanged.
    def _placeholders(self, module):
        """(name, parameter) of module's parameters that are ZeRO-3 placeholders now."""
        out = []
        for name, p in module.named_parameters():
            d = p.__dict__
            if int(d.get("ds_numel", 0) or 0) > 0 and self.ds.is_not_available(p):
                out.append((name, p))
        return out

    def _checkpoint_target(self, module):
        """(the model the call is about, the prefix of its names, the call as written)."""
        engine = self.engine
        if engine is not None and module is engine:
            return engine.module, "module.", "engine"
        return module, "", ""

    def on_state_dict(self, module, result, caller):
        if self.closed:
            return
        try:
            if _frames.called_by(caller, "deepspeed"):
                return
            target, prefix, holder = self._checkpoint_target(module)
            lost = []
            for name, p in self._placeholders(target):
                t = result.get(prefix + name) if hasattr(result, "get") else None
                if t is None or not t.numel():  # absent: renamed by a prefix or a hook
                    lost.append((name, p))
            if lost:
                nbytes = sum(int(p.__dict__["ds_numel"]) * p.element_size() for _, p in lost)
                self._checkpoint("partitioned_save", target, holder and "engine.state_dict()",
                                 lost, nbytes, caller)
        except Exception as failed:
            self._checkpoint_failed("state_dict", failed)

    def on_load_state_dict(self, module, state_dict, caller):
        if self.closed:
            return
        try:
            if _frames.called_by(caller, "deepspeed") or not hasattr(state_dict, "get"):
                return
            target, prefix, holder = self._checkpoint_target(module)
            call = ("engine" if holder else self._code(target)) + ".load_state_dict"

            def given(name):
                t = state_dict.get(prefix + name)
                return t is not None and getattr(t, "numel", None) is not None and t.numel() > 0

            full = [(name, p) for name, p in self._placeholders(target) if given(name)]
            if full:
                nbytes = sum(int(p.__dict__["ds_numel"]) * p.element_size() for _, p in full)
                self._checkpoint("partitioned_load", target, call, full, nbytes, caller)
                return
            # Gathered, but in GatheredParameters scopes without modifier_rank only: ZeRO-3
            # re-partitions them from the shards at the scope's exit, and the load is lost.
            kept = {i for ids, src in self.gathered_scopes if src is not None for i in ids}
            discarded = {i for ids, src in self.gathered_scopes if src is None for i in ids}
            lost = [(name, p) for name, p in target.named_parameters()
                    if id(p) in discarded and id(p) not in kept and "ds_id" in p.__dict__
                    and given(name)]
            if lost:
                nbytes = sum(int(p.__dict__.get("ds_numel", p.numel())) * p.element_size()
                             for _, p in lost)
                self._checkpoint("partitioned_load", target, call, lost, nbytes, caller,
                                 without_modifier=True)
        except Exception as failed:
            self._checkpoint_failed("load_state_dict", failed)

    def on_load_checkpoint(self, engine, arguments, caller):
        """engine.load_checkpoint(load_dir, tag, ...) is about to run: a ZeRO checkpoint saved
        at another data-parallel world size is said before DeepSpeed raises on it, under the
        condition DeepSpeed raises on (optimizer states loaded, not the module alone, not a
        universal checkpoint)."""
        if self.closed:
            return
        try:
            if (_frames.called_by(caller, "deepspeed") or not arguments.get("load_optimizer_states")
                    or arguments.get("load_module_only")):
                return
            universal = getattr(engine, "load_universal_checkpoint", None)
            if callable(universal) and universal():
                return
            folder, saved = _ds.checkpoint_world(arguments.get("load_dir"), arguments.get("tag"))
            world = int(getattr(engine, "seq_dp_world_size", 0) or getattr(engine, "dp_world_size", 0))
            if saved and world and saved != world:
                self._checkpoint("resume_world_size", engine.module, "engine.load_checkpoint", [],
                                 0, caller, checkpoint=folder, saved_world=saved, world=world)
        except Exception as failed:
            self._checkpoint_failed("load_checkpoint", failed)

    def _code(self, module):
        """A module as the fix lines write it: model, model.encoder."""
        path = self.paths.get(self.module_id(module), "")
        return "model" + ("." + path if path else "")

    def _checkpoint(self, kind, target, call, params, nbytes, caller, **more):
        """Records on target's module id, naming the first of params (name, parameter)."""
        mid = self.module_id(target)
        path = self.paths.get(mid, "")
        name, first = params[0] if params else ("", None)
        self.record_checkpoint(kind, mid, call, caller,
                               param=f"{path}.{name}" if path and name else name,
                               param_id=self.param_id(first) if first is not None else None,
                               params=len(params), bytes=nbytes, **more)

    def _checkpoint_failed(self, what, failed):
        print(f"shardscope: rank {self.rank}: the check of {what} failed "
              f"({type(failed).__name__}: {failed}); the call goes on unchanged", file=sys.stderr,
              flush=True)

    def on_reduce_ipg_grads(self, fn, optimizer, *args, **kwargs):
        """Stage 3 reduce-scatters a bucket of gradients: reduce_scatter_begin with what it
        moves (each gradient padded to its partition world, in the communication dtype),
        reduce_scatter_end on return on the CPU, else once its CUDA event is seen complete
        (poll_reduces). A bucket of one module's parameters names that module, else the
        root; of one parameter, that parameter."""
        if self.closed or self.engine is None:
            return fn(optimizer, *args, **kwargs)
        params, dtype = _ds.reduce_bucket(optimizer, args, kwargs)
        if not params:
            return fn(optimizer, *args, **kwargs)
        self.poll_reduces()
        # A bucket's size, module and device are kept per set of parameters and dtype (the
        # buckets repeat step after step: one tuple of ids and one lookup a call), and each
        # parameter's part of them per parameter (reduce_params), so that a bucket not seen
        # before costs a lookup per parameter, not the pass over its ~200 parameters that
        # was most of this agent's Python time a step (300 µs under cProfile,
        # docs/performance.md, sections 10 and 20)
        key = (dtype, tuple(map(id, params)))
        known = self.reduce_buckets.get(key)
        if known is None:
            known = self.reduce_buckets[key] = self._reduce_bucket(params, dtype)
            if len(self.reduce_buckets) > 256:  # not a bucket that repeats: forget the oldest
                self.reduce_buckets.pop(next(iter(self.reduce_buckets)))
        nbytes, module, pid, cuda = known
        n = len(params)
        events = getattr(optimizer, "param_reduce_events", None)
        before = len(events) if events is not None else 0
        group = self.group_number(getattr(optimizer, "dp_process_group", None))
        self.native.reduce_scatter_begin(module, pid, nbytes, n)
        seq = self.native.collective_begin("reduce_scatter", group, module, "backward", nbytes, n)
        try:
            r = fn(optimizer, *args, **kwargs)
        except BaseException:
            self.native.collective_end(group, seq)  # raised: not waiting any more
            raise
        if cuda and events is not None and len(events) > before:
            self.reduces.append((events[-1], module, pid, nbytes, n, group, seq))
        else:
            self.native.reduce_scatter_end(module, pid, nbytes, n)
            self.native.collective_end(group, seq)
        return r

    def _reduce_bucket(self, params, dtype):
        """(bytes, module, parameter id or None, on CUDA) of a gradient bucket: each gradient
        padded to its partition world, in the communication dtype; the module when all are one
        module's, else 0 (the root); the parameter when it is one."""
        nbytes, owners, cuda = 0, set(), False
        cache = self.reduce_params
        for p in params:
            entry = cache.get(id(p))
            if entry is None or entry[0] is not p:
                entry = self._reduce_param(p)
                if "_shardscope_seen_as" in p.__dict__:  # its owner known: kept for good
                    cache[id(p)] = entry
            _, numel, itemsize, owner, on_cuda = entry
            nbytes += numel * (dtype.itemsize if dtype is not None else itemsize)
            owners.add(owner)
            cuda = cuda or on_cuda
        module = owners.pop() if len(owners) == 1 else 0
        pid = self.param_id(params[0]) if len(params) == 1 else None
        return nbytes, module, pid, cuda

    def _reduce_param(self, p):
        """(p, gradient elements padded to its partition world, element size, owner module id
        or 0, on CUDA): a parameter's part of a gradient bucket (_reduce_bucket)."""
        d = p.__dict__
        ds_tensor = d.get("ds_tensor")
        partition = int(getattr(ds_tensor, "ds_numel", 0)) if ds_tensor is not None else 0
        world = int(d.get("ds_zero_partition_world_size", self.world_size))
        numel = partition * world if partition else int(d.get("ds_numel", p.numel()))
        seen = d.get("_shardscope_seen_as")
        owner = self.module_id(seen[0]) if seen is not None else 0
        return p, numel, p.element_size(), owner, p.device.type == "cuda"

    def _after_step(self):
        """After a step's end on a CUDA model (HotPath.after_step): the reduce-scatters seen
        complete end (not waited for: the CPU may run ahead), then the allocator's figures."""
        self.poll_reduces()
        if self.allocator is not None:
            self.allocator()

    def attach(self, engine):
        if self.engine is engine:
            return
        module = getattr(engine, "module", None)
        if module is None:
            raise ShardScopeError("attach(engine) needs the DeepSpeedEngine that "
                                  "deepspeed.initialize returned")
        stage = engine.zero_optimization_stage() if hasattr(engine, "zero_optimization_stage") else 0
        if stage != 3:
            raise ShardScopeError(
                f"this DeepSpeed engine runs ZeRO stage {stage}; shardscope.deepspeed inspects "
                f"ZeRO-3 (set \"zero_optimization\": {{\"stage\": 3}} in the DeepSpeed config)")
        self.engine = engine
        self.hot.set_engine(engine)
        self.allocator = _allocator.sampler(self.native, _allocator.device_of(module.parameters()))
        self.hot.after_step = self._after_step if self.allocator is not None else None
        z = _ds.zero_config(engine)
        if z is not None:
            self.native.set_config(int(getattr(z, "param_persistence_threshold", 0)),
                                   int(getattr(z, "prefetch_bucket_size", 0)),
                                   int(getattr(z, "max_live_parameters", 0)), self.guard)
        # Parameters zero.Init converted before install() (issue #30, defect 5): observed from
        # now on, as if seen converted; what happened to them before is not (install() said so).
        adopted_late = 0
        for param in module.parameters():
            ds_id = param.__dict__.get("ds_id")
            if ds_id is not None and ds_id not in self.converted:
                self.ds.adopt_param(param)
                self.on_param_converted(param)
                adopted_late += 1
        if adopted_late:
            print(f"shardscope: rank {self.rank}: {adopted_late} parameters were partitioned "
                  f"before install(); their fetches and releases are observed from now on, "
                  f"what happened to them before is not", file=sys.stderr)
        self.publish(module, late_scan=False)
        # External registrations made before the agent knew the modules' names.
        for m in module.modules():
            for param in _ds.external_params(m):
                pid = self.param_id(param)
                if pid is not None:
                    self.native.register_external(self.module_id(m), pid, False)








_ASSIGNMENT = re.compile(r"\s*self\.([A-Za-z_][A-Za-z0-9_]*)\s*=")


def _pending_attribute(module):
    """A module whose __init__ is running inside another module's __init__ is about to be
    assigned to it (`self.pos_conv = PositionalConv(...)`): (attribute, parent), read from
    the parent's frame, or None."""
    import torch.nn as nn

    frame: Optional[FrameType] = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "__init__" and
                                     frame.f_locals.get("self") is module):
        frame = frame.f_back
    if frame is None:
        return None
    frame = frame.f_back
    while frame is not None:
        owner = frame.f_locals.get("self") if frame.f_code.co_name == "__init__" else None
        if isinstance(owner, nn.Module) and owner is not module:
            match = _ASSIGNMENT.match(linecache.getline(frame.f_code.co_filename, frame.f_lineno))
            return (match.group(1), owner) if match else None
        frame = frame.f_back
    return None












def _holds(module, param):
    """Whether param is one of module's own parameters: its forward using them is DeepSpeed's
    business, not another module's read."""
    params = module.__dict__.get("_parameters")
    return params is not None and any(p is param for p in dict.values(params))












def _code_name(path):
    """A dotted path as attribute access: "blocks.0.fc1" -> "blocks[0].fc1"."""
    out = ""
    for part in path.split("."):
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out


def _building(here, user, param):
    """While the model is built: (the modules under construction, outermost first, each with
    its class, the attribute it is being assigned to when known and its constructor's
    file:line; the parameter as a constructor's code names it: the user's frame when it is
    a module's __init__, else the innermost constructor running, a library's)."""
    import torch.nn as nn

    import torch

    internal = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep  # torch's own modules
    chain: list = []
    f = here
    while f is not None:
        owner = f.f_locals.get("self") if f.f_code.co_name == "__init__" else None
        if owner is not None and os.path.abspath(f.f_code.co_filename).startswith(internal):
            owner = None  # torch.nn's constructors (Conv1d, ParametrizationList) are not the model's
        if isinstance(owner, nn.Module) and (not chain or chain[-1][0] is not owner):
            chain.append((owner, f))
        f = f.f_back
    chain.reverse()  # outermost first
    parts = []
    for i, (module, f) in enumerate(chain):
        attribute = ""
        if i > 0:
            line = linecache.getline(chain[i - 1][1].f_code.co_filename, chain[i - 1][1].f_lineno)
            match = _ASSIGNMENT.match(line)
            if match:
                attribute = "." + match.group(1) + " "
        where = f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"
        parts.append(f"{attribute}{type(module).__name__} ({where})")
    building = " > ".join(parts)
    # The parameter as the constructor's code names it: from its `self`, else a local.
    code = ""
    frame = user
    if frame is None or frame.f_code.co_name != "__init__" or not isinstance(
            frame.f_locals.get("self"), nn.Module):
        frame = chain[-1][1] if chain else user
    if frame is None:
        return building, "<the parameter>"
    self_ = frame.f_locals.get("self") if frame.f_code.co_name == "__init__" else None
    if isinstance(self_, nn.Module):
        for path, p in self_.named_parameters(remove_duplicate=False):
            if p is param:
                code = "self." + _code_name(path)
                break
    seen = param.__dict__.get("_shardscope_seen_as")  # (module, attribute) it was read as
    if not code and seen is not None and isinstance(self_, nn.Module):
        # Removed from its module already (weight_norm deletes `weight`, then reads it).
        for path, m in self_.named_modules():
            if m is seen[0]:
                code = "self." + _code_name(f"{path}.{seen[1]}" if path else seen[1])
                break
    if not code:
        for name, value in frame.f_locals.items():
            if value is param:
                code = name
                break
            if isinstance(value, nn.Module) and name != "self":
                for path, p in value.named_parameters(remove_duplicate=False):
                    if p is param:
                        code = f"{name}.{_code_name(path)}"
                        break
            if code:
                break
    if not code:
        code = f"<the {type(seen[0]).__name__}'s {seen[1]}>" if seen else "<the parameter>"
    return building, code


def _roots(modules):
    children = set()
    for m in modules:
        for c in m.children():
            children.add(id(c))
    return [m for m in modules if id(m) not in children]


def _owner_of(root, param):
    for path, module in root.named_modules():
        for local, p in module._parameters.items():
            if p is param:
                return module, local, path
    return None


def _replaced_by(module, local, path):
    """The parameter a late one replaced: weight_norm's `weight` for `weight_g`/`weight_v`."""
    for hook in getattr(module, "_forward_pre_hooks", {}).values():
        name = getattr(hook, "name", None)
        if isinstance(name, str) and local.startswith(name) and local != name:
            return f"{path}.{name}" if path else name
    return ""
