"""What every ShardScope agent (shardscope.deepspeed, and any other framework's) checks and
decides the same way before it starts serving: its options, the per-rank names of its
endpoint and snapshot file, and the native signal path. The rules themselves live in C++
(wire/endpoint.h endpointOfRank, wire/snapshot.h outputOfRank, wire/atomicfile.h checkOutputFile), shared
with shardscope-train; this module turns them into an agent's errors and messages.
"""

import os
import sys
from typing import Any, Callable, Optional, Tuple

from . import ShardScopeError, _native

# The inspector's own limit and default (server/inspector.h kMaxHistoryEvents,
# InspectorOptions::historyEvents), as the native module exports them.
MAX_HISTORY = _native.MAX_HISTORY
DEFAULT_HISTORY = _native.DEFAULT_HISTORY


def rank_and_world() -> Tuple[int, int]:
    """This process's rank and the job's world size: torch.distributed's once initialized,
    else torchrun's RANK and WORLD_SIZE, else a job of one."""
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ShardScopeError(f"RANK={os.environ.get('RANK')!r} and WORLD_SIZE="
                              f"{os.environ.get('WORLD_SIZE')!r} must be whole numbers (as "
                              f"torchrun sets them)") from None


class Options:
    """An agent's checked options: endpoint (this rank's), snapshot_out (this rank's file),
    history, job, listen (bool)."""

    def __init__(self, listen: bool, endpoint: str, snapshot_out: str, history: int,
                 job: str) -> None:
        self.listen = listen
        self.endpoint = endpoint
        self.snapshot_out = snapshot_out
        self.history = history
        self.job = job


def check_options(api: str, rank: int, world_size: int, listen: Any = None,
                  snapshot_out: Any = None, history: Any = DEFAULT_HISTORY, job: Any = None) -> Options:
    """Checks an agent's install() options and decides this rank's endpoint and snapshot
    file; raises ShardScopeError saying what to pass instead. api names the call in the
    messages ("shardscope.deepspeed.install()")."""

    if isinstance(history, bool) or not isinstance(history, int) or not 0 <= history <= MAX_HISTORY:
        raise ShardScopeError(f"{api}: history={history!r}: give the number of recent events a "
                              f"late client receives, a whole number from 0 to {MAX_HISTORY} "
                              f"(default {DEFAULT_HISTORY})")
    if job is not None and (not isinstance(job, str) or not job):
        raise ShardScopeError(f"{api}: job={job!r}: give the job's name as a non-empty string "
                              f"shared by all its ranks, or leave it out (TORCHELASTIC_RUN_ID, "
                              f"else MASTER_ADDR:MASTER_PORT)")
    if listen is not None and listen is not False and not isinstance(listen, str):
        raise ShardScopeError(f"{api}: listen={listen!r}: use None (a private Unix socket), "
                              f"'unix:PATH', 'tcp:HOST:PORT' or False (serve nothing)")
    endpoint = ""
    if isinstance(listen, str):
        try:
            endpoint = _native.endpoint_of_rank(listen, rank)
        except RuntimeError as e:
            raise ShardScopeError(f"{api}: listen={e}") from None
        if world_size > 1 and rank == 0 and _native.endpoint_of_rank(listen, 1) != listen:
            print(f"shardscope: listen={listen!r} in a job of {world_size} ranks: rank N "
                  f"listens on {_rank_rule(listen)}", file=sys.stderr)
    out = ""
    if snapshot_out is not None and snapshot_out is not False:
        try:
            snapshot_out = os.fspath(snapshot_out)
        except TypeError:
            raise ShardScopeError(f"{api}: snapshot_out={snapshot_out!r}: give a file name "
                                  f"(a str or a path)") from None
        if not isinstance(snapshot_out, str) or not snapshot_out:
            raise ShardScopeError(f"{api}: snapshot_out={snapshot_out!r}: give a file name")
        out = _native.output_of_rank(snapshot_out, rank, world_size)
        if world_size > 1 and "{rank}" not in snapshot_out and rank == 0:
            print(f"shardscope: snapshot_out={snapshot_out!r} has no {{rank}} in a job of "
                  f"{world_size} ranks: rank 0 writes {snapshot_out}, rank N writes "
                  f"{snapshot_out}.rank<N>", file=sys.stderr)
        problem = _native.check_output_file(out)
        if problem:
            raise ShardScopeError(f"{api}: snapshot_out={snapshot_out!r}: {problem}")
    return Options(listen is not False, endpoint, out, history, job or "")


def installed_again(agent: Any, api: str, when: str) -> Any:
    """install() called a second time in one process. Under shardscope-check, which installed
    the agent before the script, the script's own call is that agent (its options are the
    check's); otherwise it is an error that says so."""
    if os.environ.get("SHARDSCOPE_CHECK"):
        return agent
    raise ShardScopeError(f"{api} was already called in this process (rank {agent.rank}); call "
                          f"it once per process, {when}")


def _rank_rule(listen: str) -> str:
    if listen.startswith("unix:"):
        return f"{listen}.rank<N> (rank 0 on {listen})"
    return "PORT+N (rank 0 on PORT; port 0: each its own)"


def finish_on_sigterm(native_agent: Any) -> bool:
    """SIGTERM finishes the agent's inspector (the snapshot written) from a native thread and
    then ends the process as it would have without the agent (exit 143), even while the main
    thread is blocked in native code (a rendezvous, a collective), where a Python handler
    never runs. Left alone when the script handles SIGTERM itself."""
    import signal

    try:
        if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
            return False  # the script's own handler; atexit still finishes on its exit
    except Exception:
        return False
    native_agent.finish_on_sigterm()
    return True


def raised_line(exc: BaseException) -> str:
    """What a backward raised, as backward_unfinished's `raised` names it: "ValueError: its
    message's first line" (at most 200 characters of it)."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"


def finish_reason() -> str:
    """The Goodbye's reason (docs/protocol.md) for an agent finishing now: "training failed:
    ..." while an exception propagates (finish() from a script's `finally`, also around the
    model's build) or after one ended the script (atexit), else "training finished"."""
    exc = sys.exc_info()[1]
    if exc is None:
        exc = getattr(sys, "last_value", None)  # uncaught: set before atexit runs
    if exc is None or (isinstance(exc, SystemExit) and exc.code in (None, 0)):
        return "training finished"
    what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return f"training failed: {what}"[:500]


# ---- the loss a step ends with: one pass-through wrapper of torch.Tensor.backward and one of
# torch.autograd.backward for every agent. The script names its loss only where it calls
# loss.backward() or torch.autograd.backward(loss) (FSDP2, and DeepSpeed's plain loss.backward()
# from 0.18.3): each agent's watcher keeps the tensor for its step's end, where the native side
# turns it into one number (agent::lossNumber, python/shardscope/hotpath.h). The wrappers are
# torch's own backward for everything else: they call each watcher with the tensor, then
# torch's backward, whose exceptions pass unchanged. A backward inside a watched one
# (Tensor.backward calls torch.autograd.backward) or inside the autograd engine (a reentrant
# activation checkpoint's) is not the script's and is not watched. They are in place only
# while some agent watches (install, resume) and torch's own again once none does (pause,
# finish). torch.autograd.grad is not watched: a loss differentiated only by it is not named.
_backward_watchers: list = []
_torch_backward = None  # (torch.Tensor.backward, torch.autograd.backward) as found, while wrapped
_backward_depth = [0]  # watched backwards running (the training thread's: one at a time)


def _watched(tensor: Any, call: Callable[[], Any]) -> Any:
    """call() (torch's backward), with the watchers told of tensor first (None: no one loss)."""
    from . import _torchinternals

    if _backward_depth[0] or _torchinternals.current_graph_task_id()() != -1:
        return call()
    after = [a for a in (w(tensor) for w in tuple(_backward_watchers)) if a is not None]
    _backward_depth[0] += 1
    try:
        return call()
    finally:
        _backward_depth[0] -= 1
        for a in reversed(after):
            a()


def watch_backward(watcher: Callable[[Any], Optional[Callable[[], None]]]) -> Callable[[], None]:
    """Calls watcher(tensor) before every tensor.backward(...) and torch.autograd.backward(...)
    from now on; a callable it returns runs once torch's backward has returned or raised, in
    the caller's thread state (torch's autograd engine runs the backward pass on a copy of the
    thread's state: a torch function mode entered or left inside it is back as it was
    afterwards). Returns the function that stops watching (idempotent)."""
    import functools
    import torch
    import torch.autograd

    global _torch_backward
    if _torch_backward is None:
        tensor_backward, autograd_backward = torch.Tensor.backward, torch.autograd.backward

        @functools.wraps(tensor_backward)
        def backward(self, *args, **kwargs):
            return _watched(self, lambda: tensor_backward(self, *args, **kwargs))

        @functools.wraps(autograd_backward)
        def backward_of(tensors, *args, **kwargs):
            loss = tensors if isinstance(tensors, torch.Tensor) else \
                tensors[0] if isinstance(tensors, (list, tuple)) and len(tensors) == 1 else None
            return _watched(loss, lambda: autograd_backward(tensors, *args, **kwargs))

        backward.__shardscope_original__ = tensor_backward  # type: ignore[attr-defined]
        backward_of.__shardscope_original__ = autograd_backward  # type: ignore[attr-defined]
        _torch_backward = (tensor_backward, autograd_backward)
        torch.Tensor.backward = backward
        torch.autograd.backward = backward_of
    _backward_watchers.append(watcher)

    def unwatch():
        global _torch_backward
        for i, w in enumerate(_backward_watchers):
            if w is watcher:
                del _backward_watchers[i]
                break
        if not _backward_watchers and _torch_backward is not None:
            import torch
            import torch.autograd

            tensor_backward, autograd_backward = _torch_backward
            # each put back unless wrapped again since (then left alone)
            if getattr(torch.Tensor.backward, "__shardscope_original__", None) is tensor_backward:
                torch.Tensor.backward = tensor_backward
            if getattr(torch.autograd.backward, "__shardscope_original__", None) is autograd_backward:
                torch.autograd.backward = autograd_backward
            _torch_backward = None

    return unwatch


class AgentSlot:
    """The one agent of a process for an agent module (shardscope.deepspeed, shardscope.fsdp),
    and the module-level calls every agent module offers the same way: finish(), inspect(),
    pause(), resume() and paused(), made by api(). The agent itself (its close(reason),
    pause(), resume()) is the module's own."""

    def __init__(self, package: str) -> None:
        self.package = package  # "shardscope.fsdp": how the messages name the module
        self.agent: Any = None  # the agent (an AgentCore) once installed

    def _running(self, call: str) -> Any:
        if self.agent is None:
            raise ShardScopeError(f"call {self.package}.install() before {call}()")
        return self.agent

    def api(self, install: Callable[..., Any]) -> Tuple[Callable[..., Any], ...]:
        """(finish, inspect, pause, resume, paused) for the module whose install() this is."""
        import contextlib

        slot, package = self, self.package

        def finish():
            if slot.agent is not None:
                a, slot.agent = slot.agent, None
                a.close(finish_reason())

        @contextlib.contextmanager
        def inspect(**options):
            a = install(**options)
            try:
                yield a
            finally:
                finish()

        def pause():
            slot._running("pause").pause()

        def resume():
            slot._running("resume").resume()

        @contextlib.contextmanager
        def paused():
            pause()
            try:
                yield
            finally:
                resume()

        finish.__doc__ = ("Writes snapshot_out (if given), says goodbye to clients (the reason: "
                          "finish_reason()) and stops observing; also at exit and on SIGTERM.")
        inspect.__doc__ = "``with inspect(...):`` install() on entry, finish() on exit (also when it raises)."
        pause.__doc__ = (f"Stops observing until resume(), between training steps: the framework "
                         f"runs its own code again, so paused steps cost nothing. Clients stay "
                         f"attached; step numbers go on counting (docs/{package.split('.')[-1]}.md).")
        resume.__doc__ = "Observes again after pause(); every parameter's status is brought up to date."
        paused.__doc__ = "``with paused():`` pause() on entry, resume() on exit (also when it raises)."
        for f in (finish, inspect, pause, resume, paused):
            f.__module__ = package
            f.__qualname__ = f.__name__
        return finish, inspect, pause, resume, paused
