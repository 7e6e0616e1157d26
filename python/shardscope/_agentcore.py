"""The lifecycle every ShardScope agent shares, whatever framework it observes.

[Note: agent core] An agent (``shardscope.deepspeed``, ``shardscope.fsdp``) is one object per
rank process, in the slot of its module (``_runtime.AgentSlot``). ``install_agent`` makes the
checks every ``install()`` makes the same way (called twice, the guard, the options, the
framework's own check) and starts it; ``AgentCore`` owns what happens to every agent the same
way after that:

- the native agent (``_native.Agent``: the endpoint, the state, the snapshot writer) started
  with this rank's options, and a ``ShardScopeError`` naming the cause when it cannot start;
- ``close(reason)`` once, from ``finish()``, at exit (atexit) or on SIGTERM (the native path
  of ``_runtime.finish_on_sigterm``): the framework's hooks out (``_close``), then the
  snapshot and the clients' Goodbye, also when taking the hooks out raised;
- one pause flag, ``is_paused``: ``pause()`` and ``resume()`` between steps, the framework's
  part in ``_pause``, ``_unpause`` and ``_resumed``;
- ``flush()``: what is recorded reaches the clients and the snapshot now;
- the CUDA collectives issued but not yet seen complete (``reduces``), ended when their event
  has completed (``poll_reduces``; all of them, waited for, at close);
- the process groups' numbers in the collective events (``group_number``: 0 the job's
  default group, others in the order this rank first uses them);
- the stall watchdog ([Note: stall watchdog] below): a collective waited for past
  ``SHARDSCOPE_STALL_SECONDS`` becomes this rank's ``rank_stalled`` record, with the training
  thread's line, flushed at once.

A framework's agent adds its hooks (one file: what it observes and diagnoses), its internals
(one file: every private name it touches, declared and checked at install) and its words in
the one author of violation text (engine/state/violationtext.cpp); nothing else.
"""

from __future__ import annotations

import atexit
import sys
import threading
from typing import Any, Callable, ClassVar, Optional, Tuple, TypeVar

from . import ShardScopeError
from . import _runtime

# install(guard=...): "warn" records and lets the framework go on; "error" raises
# UnregisteredAccessError with the fix line first.
GUARDS = ("warn", "error")


def read_token(token: Optional[str], token_file: Optional[str]) -> str:
    """The token as shardscope-train, shardscope and shardscope-capture resolve it."""
    from . import _native

    try:
        return _native.resolve_token(token or "", token_file or "")
    except RuntimeError as e:
        raise ShardScopeError(f"the ShardScope token: {e}") from None


def backend_name() -> str:
    """torch.distributed's backend once initialized, else "gloo" (what a CPU job will use)."""
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return str(dist.get_backend())
    except Exception:
        pass
    return "gloo"


# [Note: stall watchdog] A daemon thread per agent wakes every WATCH_SECONDS and reads the
# native state's oldest collective still in flight (Agent.oldest_in_flight: a short lock, no
# Python on the training thread). One that has waited past the threshold is this rank's
# rank_stalled record (once per (group, seq)), with where the training thread is (its innermost
# user frames, _frames' rules), flushed to the clients and snapshot_out at once, so that the
# diagnosis survives the job being killed by its own timeout; one line on stderr says it. While
# collectives complete it reads one figure twice a second; paused or finished it records
# nothing; it never raises into the training thread (its own errors end it, said once).
STALL_VARIABLE = "SHARDSCOPE_STALL_SECONDS"
WATCH_SECONDS = 0.5
STACK_FRAMES = 8  # user frames kept with a stall (innermost first)


def stall_threshold(backend: str = "") -> float:
    """The seconds a collective may wait before its rank is said stalled: SHARDSCOPE_STALL_SECONDS,
    else the backend's default (5 on gloo and the CPU, 60 on NCCL, whose first call may build its
    communicator for seconds). Read by the one reader the job's aligner uses
    (sessioncore::stallNsFromEnvironment, through the native module); a bad value is a
    ShardScopeError naming the variable."""
    from . import _native

    try:
        return _native.stall_seconds(backend or backend_name() or "")
    except ValueError as e:
        raise ShardScopeError(str(e)) from None


def thread_locations(frame: Any) -> Tuple[Any, list]:
    """(the innermost user frame's location or None, up to STACK_FRAMES user frames' locations
    from the innermost out) of a thread whose innermost frame is frame."""
    from . import _frames

    stack: list = []
    f = _frames.user_frame(frame)
    while f is not None and len(stack) < STACK_FRAMES:
        loc = _frames.location(f)
        stack.append(loc)
        f = _frames.user_frame(f.f_back)
    return (stack[0] if stack else None), stack


_A = TypeVar("_A", bound="AgentCore")


def install_agent(slot: _runtime.AgentSlot, factory: Callable[..., _A], api: str,
                  when: str, check_framework: Callable[[], str], *, guard: str,
                  token: Optional[str], token_file: Optional[str], listen: Any,
                  snapshot_out: Any, history: Any, job: Any,
                  model_name: Optional[str]) -> Tuple[_A, bool]:
    """install()'s checks, the same for every agent, then factory(options, token, guard,
    model_name, version) in slot. api names the call in messages ("shardscope.fsdp.install()"),
    when says when to call it; check_framework() raises ShardScopeError naming what the
    framework lacks and returns its version. Returns (the agent, whether it is new)."""
    if slot.agent is not None:
        return _runtime.installed_again(slot.agent, api, when), False
    if guard not in GUARDS:
        raise ShardScopeError(f"guard={guard!r}: use one of {', '.join(map(repr, GUARDS))}")
    rank, world_size = _runtime.rank_and_world()
    options = _runtime.check_options(api, rank, world_size, listen=listen,
                                     snapshot_out=snapshot_out, history=history, job=job)
    version = check_framework()
    agent = factory(options, token=read_token(token, token_file), guard=guard,
                    model_name=model_name, version=version)
    slot.agent = agent
    return agent, True


class AgentCore:
    """The part of every agent that is not its framework's (the note above). A subclass sets
    NOT_BUILT (the model's name while there is none yet) and DIALECT (the native state's
    vocabulary, "" for DeepSpeed's), calls AgentCore.__init__ first and arm() last, and
    implements _close, _pause, _unpause and _resumed."""

    NOT_BUILT: ClassVar[str] = "(model not built yet)"
    DIALECT: ClassVar[str] = ""

    def __init__(self, options: _runtime.Options, token: str, guard: str,
                 model_name: Optional[str], version: str) -> None:
        from . import _native

        self.rank, self.world_size = _runtime.rank_and_world()
        self.guard = guard
        self.version = version  # the framework's release (DeepSpeed's, or torch's for FSDP2)
        self.model_name = model_name
        self.snapshot_out = options.snapshot_out  # this rank's file (wire::outputOfRank)
        model = f"{model_name} {self.NOT_BUILT}" if model_name else self.NOT_BUILT
        extra = {"dialect": self.DIALECT} if self.DIALECT else {}
        try:
            self.native = _native.Agent(model=model, rank=self.rank, world_size=self.world_size,
                                        backend=backend_name(), listen=options.listen,
                                        endpoint=options.endpoint, token=token,
                                        snapshot_out=self.snapshot_out, history=options.history,
                                        job=options.job, **extra)
        except RuntimeError as e:
            raise ShardScopeError(f"the ShardScope endpoint could not start: {e}") from None
        self.closed = False
        self.is_paused = False
        # CUDA collectives issued, not yet seen complete: (event, module id, parameter id or
        # None, bytes, tensors); ended by poll_reduces
        self.reduces: list = []
        self.allocator: Optional[Callable[[], None]] = None  # posts an allocator_sample (CUDA)
        self.checkpoint_said: set = set()  # (kind, owner, file, line) said on stderr
        # process group -> its number in collective events (group_number); kept alive here
        self.pg_numbers: dict = {}
        self.pg_objects: list = []
        stall_threshold()  # a bad SHARDSCOPE_STALL_SECONDS: install() raises, naming it
        self.train_thread = threading.get_ident()  # the thread that installed: the training one
        self.stalled: set = set()  # (group, seq) recorded as stalled
        self.waiting: Optional[Tuple[int, int]] = None  # the last one recorded, while in flight
        self.watch_stop = threading.Event()
        self.watchdog: Optional[threading.Thread] = None

    def arm(self) -> None:
        """The agent finishes at exit and on SIGTERM (the snapshot written, no stale file), also
        while this rank is blocked in a rendezvous or a collective (_runtime)."""
        atexit.register(self.close)
        _runtime.finish_on_sigterm(self.native)
        if hasattr(self.native, "oldest_in_flight"):
            self.watchdog = threading.Thread(target=self._watch, name="shardscope-stall-watchdog",
                                             daemon=True)
            self.watchdog.start()

    # ------------------------------------------------------------------ lifecycle
    @property
    def endpoint(self) -> str:
        return self.native.endpoint

    def close(self, reason: Optional[str] = None) -> None:
        """reason: the Goodbye's; None: from how the process ends (_runtime.finish_reason)."""
        if reason is None:
            reason = _runtime.finish_reason()
        if self.closed:
            return
        self.closed = True
        self.watch_stop.set()
        atexit.unregister(self.close)
        try:
            self._close(reason)
        finally:
            try:
                self.native.finish(reason)
            except RuntimeError as e:
                print(f"shardscope: {e}", file=sys.stderr)

    def pause(self) -> None:
        if self.is_paused or self.closed:
            return
        self._pause()
        self.is_paused = True

    def resume(self) -> None:
        if not self.is_paused or self.closed:
            return
        self._unpause()
        self.is_paused = False
        self._resumed()

    def record_checkpoint(self, kind: str, owner: int, call: str, caller: Any,
                          **fields: Any) -> None:
        """A checkpoint violation (partitioned_save, partitioned_load, resume_world_size: its
        words from engine/state/violationtext.cpp) at the script's line above caller, counted in
        the ledger each time; the first time at that line it is flushed and said on stderr
        before the call runs on (torch's or DeepSpeed's error may follow: the diagnosis first).
        fields: Agent.checkpoint's (param, param_id, params, bytes, checkpoint, ...)."""
        from . import _frames

        frame = _frames.user_frame(caller)
        location = _frames.location(frame) if frame is not None else None
        message, fix = self.native.checkpoint(kind, owner, call, location=location, **fields)
        key = (kind, owner) + (tuple(location[:2]) if location else ())
        if key not in self.checkpoint_said:
            self.checkpoint_said.add(key)
            self.flush()
            print(f"shardscope: rank {self.rank}: {message}\n  fix: {fix}", file=sys.stderr,
                  flush=True)

    def flush(self) -> None:
        """Everything recorded reaches the clients and snapshot_out, now."""
        self._before_flush()
        error = self.native.flush()
        if error:
            print(f"shardscope: {error}", file=sys.stderr)

    def poll_reduces(self, wait: bool = False) -> None:
        """reduce_scatter_end (and its collective's end) for the CUDA collectives seen complete
        (wait: all of them, waiting for those still running: close())."""
        while self.reduces:
            event, module, pid, nbytes, n, group, seq = self.reduces[0]
            if not wait and not event.query():
                return
            if wait:
                event.synchronize()
            self.reduces.pop(0)
            self.native.reduce_scatter_end(module, pid, nbytes, n)
            if seq:
                self.native.collective_end(group, seq)

    def group_number(self, group: Any) -> int:
        """The number collective events give the process group: 0 for the job's default
        (world) group (None, torch's WORLD, or a group of every rank), the next number for each
        other group in the order this rank first uses it (ZeRO++ hpZ's secondary group, an
        FSDP2 mesh dimension). The same on every rank of a job that issues the same
        collectives. Computed once per group."""
        key = id(group)
        number = self.pg_numbers.get(key)
        if number is not None:
            return number
        number = 0
        if group is not None:
            try:
                import torch.distributed as dist
                if group is not dist.group.WORLD and dist.get_world_size(group) != self.world_size:
                    number = 1 + sum(1 for n in self.pg_numbers.values() if n)
            except Exception:
                number = 1 + sum(1 for n in self.pg_numbers.values() if n)
        self.pg_numbers[key] = number
        self.pg_objects.append(group)  # its id stays its own
        return number

    # ------------------------------------------------------------------ the stall watchdog
    def _watch(self) -> None:
        """The watchdog thread ([Note: stall watchdog])."""
        try:
            while not self.watch_stop.wait(WATCH_SECONDS):
                if self.closed:
                    return
                if not self.is_paused:
                    self._check_stall()
        except Exception as e:  # never into the training thread; said once, then it stops
            try:
                print(f"shardscope: rank {self.rank}: the stall watchdog stopped "
                      f"({type(e).__name__}: {e})", file=sys.stderr, flush=True)
            except Exception:
                pass

    def _reduce_completed(self, group: int, seq: int) -> bool:
        """Whether (group, seq) is a CUDA reduce-scatter whose event has completed: the training
        thread ends it at its next poll_reduces (the next bucket, the step's end), which an
        evaluation between steps may put off for minutes; not a stall. Read from the watchdog
        (a copy of the list: the training thread pops from it)."""
        for entry in list(self.reduces):
            if entry[5] == group and entry[6] == seq:
                try:
                    return bool(entry[0].query())
                except Exception:
                    return False
        return False

    def _check_stall(self) -> None:
        oldest = self.native.oldest_in_flight()
        if self.waiting is not None and (oldest is None or tuple(oldest[:2]) != self.waiting):
            # The collective recorded as stalled has completed (it was the oldest in flight: it
            # stays so while it waits): a straggler after all. Its collective_end reaches the
            # snapshot now, so that shardscope-check does not take the rank for hung.
            self.waiting = None
            self.native.flush()
        if oldest is None:
            return
        group, seq, kind, module, reason, nbytes, params, waited = oldest
        if waited < stall_threshold() or (group, seq) in self.stalled:
            return
        if kind == "reduce_scatter" and self._reduce_completed(group, seq):
            return  # a CUDA reduce-scatter that has completed: ended at the next poll_reduces
        self.stalled.add((group, seq))
        self.waiting = (group, seq)
        frame = sys._current_frames().get(self.train_thread)
        where, stack = thread_locations(frame) if frame is not None else (None, [])
        self.native.collective_stalled(group, seq, waited, where, stack)
        error = self.native.flush()  # the native flush only: the hot path's own is the training thread's
        if error:
            print(f"shardscope: {error}", file=sys.stderr)
        line = f" at {where[0]}:{where[1]}" if where else ""
        print(f"shardscope: rank {self.rank}: rank_stalled: {kind} #{seq} (group {group}, "
              f"{reason}) waited {waited:.1f} s{line}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ the framework's part
    def _close(self, reason: str) -> None:
        """Takes the framework's hooks out for good (the native agent finishes after it)."""
        raise NotImplementedError

    def _pause(self) -> None:
        """Raises ShardScopeError when not between steps; else takes the hooks out."""
        raise NotImplementedError

    def _unpause(self) -> None:
        """Raises ShardScopeError when not between steps; else puts the hooks back."""
        raise NotImplementedError

    def _resumed(self) -> None:
        """After resume (is_paused false again): what changed while paused brought up to date."""

    def _before_flush(self) -> None:
        """What is still pending in the agent is recorded before the native flush."""
