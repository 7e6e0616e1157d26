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
  has completed (``poll_reduces``; all of them, waited for, at close).

A framework's agent adds its hooks (one file: what it observes and diagnoses), its internals
(one file: every private name it touches, declared and checked at install) and its words in
the one author of violation text (engine/state/violationtext.cpp); nothing else.
"""

from __future__ import annotations

import atexit
import sys
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

    def arm(self) -> None:
        """The agent finishes at exit and on SIGTERM (the snapshot written, no stale file), also
        while this rank is blocked in a rendezvous or a collective (_runtime)."""
        atexit.register(self.close)
        _runtime.finish_on_sigterm(self.native)

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
        """reduce_scatter_end for the CUDA collectives seen complete (wait: all of them, waiting
        for those still running: close())."""
        while self.reduces:
            event, module, pid, nbytes, n = self.reduces[0]
            if not wait and not event.query():
                return
            if wait:
                event.synchronize()
            self.reduces.pop(0)
            self.native.reduce_scatter_end(module, pid, nbytes, n)

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
