"""The one agent core both agents are built on (python/shardscope/_agentcore.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from shardscope import ShardScopeError, _agentcore, _runtime


def test_both_agents_are_agent_cores():
    from shardscope import deepspeed, fsdp

    assert issubclass(deepspeed._Agent, _agentcore.AgentCore)
    assert issubclass(fsdp._Agent, _agentcore.AgentCore)
    # each keeps only its framework's part of the lifecycle
    for agent in (deepspeed._Agent, fsdp._Agent):
        for name in ("close", "pause", "resume", "flush", "poll_reduces", "arm", "endpoint"):
            if name != "poll_reduces" or agent is deepspeed._Agent:
                assert name not in agent.__dict__, f"{agent.__module__} redefines {name}"
        for name in ("_close", "_pause", "_unpause", "_resumed"):
            assert name in agent.__dict__, f"{agent.__module__} lacks {name}"


def test_neither_agent_imports_the_other():
    code = ("import sys, shardscope.fsdp; assert 'shardscope.deepspeed' not in sys.modules, 'fsdp'; "
            "import shardscope.deepspeed as d; print('ok')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    source = open(_agentcore.__file__.replace("_agentcore.py", "fsdp.py")).read()
    assert "from .deepspeed" not in source and "from . import deepspeed" not in source


class _Native:
    """What AgentCore asks of the native agent, recorded."""

    def __init__(self, flush_error=""):
        self.calls = []
        self.flush_error = flush_error
        self.endpoint = "unix:/tmp/x"

    def finish(self, reason=None):
        self.calls.append(("finish", reason))

    def flush(self):
        self.calls.append(("flush",))
        return self.flush_error

    def reduce_scatter_end(self, module, pid, nbytes, n):
        self.calls.append(("reduce_scatter_end", module, pid, nbytes, n))

    def finish_on_sigterm(self):
        self.calls.append(("finish_on_sigterm",))

    def collective_end(self, group, seq):
        self.calls.append(("collective_end", group, seq))

    # the watchdog's view: the oldest collective in flight (None: none), and its record
    oldest = None

    def oldest_in_flight(self):
        return self.oldest

    def collective_stalled(self, group, seq, waited, location, stack):
        self.calls.append(("collective_stalled", group, seq, waited, location, stack))


@pytest.fixture(autouse=True)
def _stall_after_two_seconds(monkeypatch):
    """The watchdog's threshold in these tests (each case may set its own)."""
    monkeypatch.setenv(_agentcore.STALL_VARIABLE, "2")


class _Agent(_agentcore.AgentCore):
    """A framework of no hooks: what the core does on its own."""

    def __init__(self, native, fail_close=False):  # no native agent started: a stand-in
        self.native = native
        self.closed = False
        self.is_paused = False
        self.reduces = []
        self.allocator = None
        self.rank = 0
        self.train_thread = threading.get_ident()
        self.stalled = set()
        self.waiting = None
        self.watch_stop = threading.Event()
        self.log = []
        self.fail_close = fail_close
        self.in_step = False

    def _close(self, reason):
        self.log.append(("close", reason))
        if self.fail_close:
            raise RuntimeError("the framework's uninstall raised")

    def _pause(self):
        if self.in_step:
            raise ShardScopeError("pause() between training steps")
        self.log.append("pause")

    def _unpause(self):
        self.log.append("unpause")

    def _resumed(self):
        assert not self.is_paused
        self.log.append("resumed")

    def _before_flush(self):
        self.log.append("before_flush")


def test_close_runs_once_and_finishes_the_native_agent_even_when_the_hooks_raise():
    a = _Agent(_Native(), fail_close=True)
    with pytest.raises(RuntimeError):
        a.close("training finished")
    assert a.native.calls == [("finish", "training finished")]
    a.close("again")
    assert a.log == [("close", "training finished")]
    assert a.native.calls == [("finish", "training finished")]


def test_close_reason_from_the_exception_being_handled():
    a = _Agent(_Native())
    try:
        raise ValueError("bad batch")
    except ValueError:
        a.close()
    assert a.native.calls == [("finish", "training failed: ValueError: bad batch")]


def test_one_pause_flag():
    a = _Agent(_Native())
    a.resume()  # not paused: nothing
    assert a.log == []
    a.pause()
    a.pause()
    assert a.is_paused and a.log == ["pause"]
    a.resume()
    assert not a.is_paused and a.log == ["pause", "unpause", "resumed"]
    a.in_step = True
    with pytest.raises(ShardScopeError):
        a.pause()
    assert not a.is_paused  # refused: still observing
    a.close("done")
    a.in_step = False
    a.pause()  # closed: nothing
    assert not a.is_paused


def test_flush_says_the_native_error(capsys):
    a = _Agent(_Native(flush_error="snapshot_out: disk full"))
    a.flush()
    assert a.log == ["before_flush"]
    assert "shardscope: snapshot_out: disk full" in capsys.readouterr().err


class _Event:
    def __init__(self, done):
        self.done = done
        self.waited = False

    def query(self):
        return self.done

    def synchronize(self):
        self.waited = True
        self.done = True


def test_poll_reduces_ends_completed_collectives_in_order_and_waits_at_close():
    a = _Agent(_Native())
    first, second, third = _Event(True), _Event(False), _Event(True)
    a.reduces = [(first, 1, 7, 100, 2, 0, 5), (second, 2, None, 200, 3, 0, 6),
                 (third, 3, None, 300, 4, 1, 0)]
    a.poll_reduces()
    # the second has not completed: the third, issued after it, waits behind it; each ends
    # its collective (seq 0: none)
    assert a.native.calls == [("reduce_scatter_end", 1, 7, 100, 2), ("collective_end", 0, 5)]
    a.poll_reduces(wait=True)
    assert second.waited
    assert a.native.calls[2:] == [("reduce_scatter_end", 2, None, 200, 3), ("collective_end", 0, 6),
                                  ("reduce_scatter_end", 3, None, 300, 4)]
    assert a.reduces == []


def _waiting_here(a):
    """The watchdog's look at this thread, from another one (as the training thread is seen)."""
    done = []
    t = threading.Thread(target=lambda: done.append(a._check_stall()))
    t.start()
    t.join()


def test_watchdog_records_a_stall_once_with_the_training_threads_line(capsys):
    a = _Agent(_Native())
    a.native.oldest = (0, 16, "all_gather", 3, "forward", 4096, 2, 1.5)
    _waiting_here(a)  # under the threshold (2 s here): nothing
    assert a.native.calls == []
    a.native.oldest = (0, 16, "all_gather", 3, "forward", 4096, 2, 2.5)
    line = sys._getframe().f_lineno + 1
    _waiting_here(a)
    _waiting_here(a)  # the same collective: once
    stalled = [c for c in a.native.calls if c[0] == "collective_stalled"]
    assert len(stalled) == 1
    _, group, seq, waited, where, stack = stalled[0]
    assert (group, seq, waited) == (0, 16, 2.5)
    # the training thread's innermost user frame (_waiting_here's join), then this test's line
    assert where[0] == __file__ and where[2] == "_waiting_here"
    assert stack[0] == where and len(stack) <= _agentcore.STACK_FRAMES
    assert stack[1][:3] == (__file__, line,
                            "test_watchdog_records_a_stall_once_with_the_training_threads_line")
    assert ("flush",) in a.native.calls  # written at once: the job may be killed next
    err = capsys.readouterr().err
    assert err.count("shardscope: rank 0: rank_stalled: all_gather #16 (group 0, forward)") == 1
    a.native.oldest = (0, 17, "reduce_scatter", 3, "backward", 4096, 2, 3.0)
    flushes = a.native.calls.count(("flush",))
    _waiting_here(a)  # #16 completed (a straggler: flushed again), then #17 waits: its record
    assert sum(c[0] == "collective_stalled" for c in a.native.calls) == 2
    assert a.native.calls.count(("flush",)) == flushes + 2
    a.native.oldest = None
    _waiting_here(a)  # #17 completed: flushed once more, then nothing
    _waiting_here(a)
    assert a.native.calls.count(("flush",)) == flushes + 3


def test_watchdog_leaves_a_completed_cuda_reduce_scatter_alone():
    a = _Agent(_Native())
    a.native.oldest = (0, 7, "reduce_scatter", 3, "backward", 4096, 2, 90.0)
    a.reduces = [(_Event(True), 3, None, 4096, 2, 0, 7)]  # completed, not polled yet
    _waiting_here(a)
    assert a.native.calls == []
    a.reduces = [(_Event(False), 3, None, 4096, 2, 0, 7)]  # still running past the threshold
    _waiting_here(a)
    assert [c[0] for c in a.native.calls] == ["collective_stalled", "flush"]


def test_watchdog_thread_stops_at_close_and_records_nothing_while_paused():
    a = _Agent(_Native())
    a.native.oldest = (0, 1, "all_gather", None, "prefetch", 64, 1, 9.0)
    a.is_paused = True
    a.watch_stop.set()  # the loop's wait returns at once: no thread left behind
    a._watch()
    assert a.native.calls == []
    a.is_paused = False
    a.close("done")
    assert a.watch_stop.is_set()


def test_stall_threshold(monkeypatch):
    monkeypatch.delenv(_agentcore.STALL_VARIABLE, raising=False)
    assert _agentcore.stall_threshold("gloo") == 5.0
    assert _agentcore.stall_threshold("nccl") == 60.0
    monkeypatch.setenv(_agentcore.STALL_VARIABLE, "2.5")
    assert _agentcore.stall_threshold("gloo") == 2.5
    assert _agentcore.stall_threshold("nccl") == 2.5
    for bad in ("0", "-1", "soon", "nan", "inf"):
        monkeypatch.setenv(_agentcore.STALL_VARIABLE, bad)
        with pytest.raises(ShardScopeError, match="SHARDSCOPE_STALL_SECONDS"):
            _agentcore.stall_threshold("gloo")


def test_install_agent_checks_before_starting(monkeypatch):
    slot = _runtime.AgentSlot("shardscope.test")
    started = []

    def factory(options, **kw):
        started.append((options, kw))
        return "agent"

    def framework():
        return "1.0"

    common = dict(token=None, token_file=None, listen=False, snapshot_out=None, history=16,
                  job=None, model_name=None)
    with pytest.raises(ShardScopeError, match="guard='loud': use one of 'warn', 'error'"):
        _agentcore.install_agent(slot, factory, "x.install()", "first", framework, guard="loud",
                                 **common)
    with pytest.raises(ShardScopeError, match="history=-1"):
        _agentcore.install_agent(slot, factory, "x.install()", "first", framework, guard="warn",
                                 **dict(common, history=-1))
    assert started == [] and slot.agent is None

    def refused():
        raise ShardScopeError("this framework lacks a hook")

    with pytest.raises(ShardScopeError, match="lacks a hook"):
        _agentcore.install_agent(slot, factory, "x.install()", "first", refused, guard="warn",
                                 **common)
    assert slot.agent is None
    agent, new = _agentcore.install_agent(slot, factory, "x.install()", "first", framework,
                                          guard="warn", **common)
    assert (agent, new) == ("agent", True) and started[0][1]["version"] == "1.0"
    monkeypatch.delenv("SHARDSCOPE_CHECK", raising=False)
    slot.agent = type("A", (), {"rank": 0})()
    with pytest.raises(ShardScopeError, match="already called in this process"):
        _agentcore.install_agent(slot, factory, "x.install()", "first", framework, guard="warn",
                                 **common)
    monkeypatch.setenv("SHARDSCOPE_CHECK", "1")  # the check installed it: the script's call is it
    assert _agentcore.install_agent(slot, factory, "x.install()", "first", framework,
                                    guard="warn", **common) == (slot.agent, False)


def test_every_callback_the_native_paths_make_exists_on_its_agent():
    """fsdppath.cpp and hotpath.cpp call back into their agent by name
    (observer().attr("poll_reduces")): each name must be one the agent has. Some run only on
    CUDA (the reduce-scatters' poll), where no CPU rank would call them; a rename would break
    the GPU run alone."""
    import re

    from shardscope import deepspeed, fsdp

    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python",
                          "shardscope")
    for cpp, agent in (("fsdppath.cpp", fsdp._Agent), ("hotpath.cpp", deepspeed._Agent)):
        text = open(os.path.join(source, cpp)).read()
        names = set(re.findall(r'(?:observer\(\)|\bo)\.attr\("([A-Za-z_]+)"\)', text))
        assert names, cpp
        missing = {n for n in names if not hasattr(agent, n)}
        assert not missing, f"{cpp} calls {sorted(missing)}, which {agent.__module__}._Agent lacks"


@pytest.mark.parametrize("agent_module,internals,tested", [
    ("fsdp", "_fsdpinternals", "TESTED_TORCH"),
    ("deepspeed", "_dsinternals", "TESTED_VERSIONS"),
])
def test_an_untested_release_warns_at_the_users_install_line(monkeypatch, agent_module,
                                                             internals, tested):
    """The warning names the script's install() line, not the package's own frames (the
    agent core added a frame between install() and the framework's check)."""
    import importlib
    import warnings

    module = importlib.import_module(f"shardscope.{agent_module}")
    monkeypatch.setattr(importlib.import_module(f"shardscope.{internals}"), tested, ("0.0",))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module.install(listen=False)
    try:
        untested = [w for w in caught if "tested on" in str(w.message) or "untested" in str(w.message)]
        assert untested, [str(w.message) for w in caught]
        assert untested[0].filename == __file__, untested[0].filename
    finally:
        module.finish()
