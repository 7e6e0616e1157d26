"""The agents' and the launcher's decisions that need no rank: options, per-rank names,
placements, restored steps, finish reasons, and which frames are the user's."""

from __future__ import annotations

import os
import sys
import types

import pytest

from shardscope import ShardScopeError, _frames, _native, _runtime


# ---------------------------------------------------------------- options and per-rank names
@pytest.mark.parametrize("history", [-1, True, 1.5, "10", (1 << 24) + 1])
def test_history_outside_the_inspectors_limit_is_refused(history):
    with pytest.raises(ShardScopeError, match=r"x\(\): history=.*whole number from 0 to 16777216"):
        _runtime.check_options("x()", 0, 1, listen=False, history=history)


@pytest.mark.parametrize("history", [0, 65536, 1 << 24])
def test_history_inside_the_limit_is_kept(history):
    assert _runtime.check_options("x()", 0, 1, listen=False, history=history).history == history


@pytest.mark.parametrize("job,error", [("", "non-empty string"), (3, "non-empty string"),
                                       ("run-7", None)])
def test_job_name(job, error):
    if error:
        with pytest.raises(ShardScopeError, match=error):
            _runtime.check_options("x()", 0, 1, listen=False, job=job)
    else:
        assert _runtime.check_options("x()", 0, 1, listen=False, job=job).job == job


@pytest.mark.parametrize("listen", [3, b"tcp:1", ["unix:/x"]])
def test_listen_of_the_wrong_type(listen):
    with pytest.raises(ShardScopeError, match="use None .*'unix:PATH', 'tcp:HOST:PORT' or False"):
        _runtime.check_options("x()", 0, 1, listen=listen)


@pytest.mark.parametrize("listen,rank,expected", [
    ("tcp:127.0.0.1:7000", 0, "tcp:127.0.0.1:7000"),
    ("tcp:127.0.0.1:7000", 3, "tcp:127.0.0.1:7003"),
    ("tcp:127.0.0.1:0", 5, "tcp:127.0.0.1:0"),
    ("unix:/tmp/s.sock", 0, "unix:/tmp/s.sock"),
    ("unix:/tmp/s.sock", 2, "unix:/tmp/s.sock.rank2"),
])
def test_each_rank_listens_on_its_own_endpoint(listen, rank, expected, capsys):
    assert _runtime.check_options("x()", rank, 4, listen=listen).endpoint == expected


def test_listen_false_serves_nothing():
    options = _runtime.check_options("x()", 0, 1, listen=False)
    assert (options.listen, options.endpoint) == (False, "")


def test_a_bad_listen_address_is_refused_at_install_saying_what_to_give(monkeypatch):
    from shardscope import _agentcore

    class Bare(_agentcore.AgentCore):  # an agent of no framework: the core alone
        def _close(self, reason):
            pass

    monkeypatch.delenv("RANK", raising=False)
    slot = _runtime.AgentSlot("shardscope.test")
    with pytest.raises(ShardScopeError, match='the ShardScope endpoint could not start: .*'
                                              'unknown endpoint "http:host"; use unix:PATH or '
                                              'tcp:HOST:PORT'):
        _agentcore.install_agent(slot, Bare, "x()", "first", lambda: "1", guard="warn",
                                 token=None, token_file=None, listen="http:host",
                                 snapshot_out=None, history=16, job=None, model_name=None)
    assert slot.agent is None


def test_the_core_alone_writes_the_snapshot_at_close(monkeypatch, tmp_path):
    import json

    from shardscope import _agentcore

    class Bare(_agentcore.AgentCore):
        NOT_BUILT = "(nothing yet)"

        def _close(self, reason):
            pass

    monkeypatch.delenv("RANK", raising=False)
    slot = _runtime.AgentSlot("shardscope.test")
    agent, new = _agentcore.install_agent(
        slot, Bare, "x()", "first", lambda: "1.0", guard="warn", token=None, token_file=None,
        listen=False, snapshot_out=str(tmp_path / "run.json"), history=16, job="j",
        model_name="Toy")
    assert new and agent.version == "1.0" and agent.endpoint == ""
    agent.close("training finished")
    doc = json.load(open(tmp_path / "run.json"))
    assert doc["engine"]["model"] == "Toy (nothing yet)"


@pytest.mark.parametrize("pattern,rank,world,expected", [
    ("run.json", 0, 1, "run.json"),
    ("run.rank{rank}.json", 1, 2, "run.rank1.json"),
    ("run.json", 0, 2, "run.json"),
    ("run.json", 3, 4, "run.json.rank3"),
])
def test_each_rank_writes_its_own_snapshot(tmp_path, pattern, rank, world, expected, capsys):
    options = _runtime.check_options("x()", rank, world, listen=False,
                                     snapshot_out=str(tmp_path / pattern))
    assert options.snapshot_out == str(tmp_path / expected)
    if world > 1 and "{rank}" not in pattern and rank == 0:
        assert "has no {rank} in a job of" in capsys.readouterr().err


def test_a_snapshot_in_a_missing_directory_is_refused_before_the_run(tmp_path):
    with pytest.raises(ShardScopeError, match="snapshot_out="):
        _runtime.check_options("x()", 0, 1, listen=False,
                               snapshot_out=str(tmp_path / "no" / "such" / "dir" / "run.json"))


def test_rank_and_world_from_torchruns_variables(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert _runtime.rank_and_world() == (3, 8)
    monkeypatch.setenv("RANK", "three")
    with pytest.raises(ShardScopeError, match="must be whole numbers"):
        _runtime.rank_and_world()


# ---------------------------------------------------------------- the Goodbye's reason
def test_finish_reason(monkeypatch):
    monkeypatch.delattr(sys, "last_value", raising=False)
    assert _runtime.finish_reason() == "training finished"
    try:
        raise RuntimeError("NCCL timeout\nsecond line")
    except RuntimeError:
        assert _runtime.finish_reason() == "training failed: RuntimeError: NCCL timeout\nsecond line"
    try:
        raise SystemExit(0)
    except SystemExit:
        assert _runtime.finish_reason() == "training finished"
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        assert _runtime.finish_reason() == "training failed: KeyboardInterrupt"
    try:
        raise ValueError("x" * 1000)
    except ValueError:
        assert len(_runtime.finish_reason()) == 500


def test_raised_line_is_the_first_line_at_most_200_characters():
    assert _runtime.raised_line(ValueError("bad\nmore")) == "ValueError: bad"
    assert _runtime.raised_line(KeyError()) == "KeyError: "
    assert len(_runtime.raised_line(ValueError("y" * 300))) == len("ValueError: ") + 200


# ---------------------------------------------------------------- the user's frames
def test_library_and_shardscope_files_are_not_the_users():
    import torch

    assert not _frames.is_user_file(torch.__file__)
    assert not _frames.is_user_file(_runtime.__file__)
    assert not _frames.is_user_file(os.__file__)  # the standard library's wrappers
    assert not _frames.is_user_file("<string>")
    assert not _frames.is_user_file("/opt/env/lib/python3.11/site-packages/deepspeed/runtime/engine.py")
    assert not _frames.is_user_file("/opt/env/lib/python3.11/site-packages/shardscope/fsdp.py")
    assert _frames.is_user_file("/home/me/train.py")
    assert _frames.is_user_file("/opt/env/lib/python3.11/site-packages/mylib/model.py")


def test_location_names_the_users_frame_and_the_chain_above():
    def inner():
        return _frames.location(_frames.user_frame(sys._getframe(0)))

    def outer():
        return inner()

    file, line, function, chain = outer()
    assert file == __file__
    assert function.endswith("inner")
    assert chain and chain[0].startswith(f"{__file__}:") and chain[0].endswith(" in outer")
    assert len(chain) <= _frames.CHAIN


# ---------------------------------------------------------------- FSDP2's decisions
def test_placements_as_the_state_names_them():
    from shardscope import fsdp

    from torch.distributed.tensor import Replicate, Shard

    assert fsdp._placements(types.SimpleNamespace(placements=(Shard(0),))) == "Shard(0)"
    assert fsdp._placements(types.SimpleNamespace(placements=(Replicate(), Shard(0)))) \
        == "(Replicate(), Shard(0))"
    assert fsdp._placements(object()) == ""


def test_restored_steps_of_a_loaded_optimizer():
    import torch

    from shardscope import fsdp

    def optimizer(*steps):
        return types.SimpleNamespace(state={i: ({"step": s} if s is not None else {})
                                            for i, s in enumerate(steps)})

    assert fsdp._restored_steps(optimizer()) is None  # nothing loaded
    assert fsdp._restored_steps(optimizer(None, None)) is None  # SGD: no step kept
    assert fsdp._restored_steps(optimizer(0)) is None
    assert fsdp._restored_steps(optimizer(torch.tensor(12.0), 7, "bad")) == 12


def test_the_optimizer_step_dcp_makes_is_not_a_training_step():
    from shardscope import fsdp

    def _init_optim_state():
        return fsdp._is_state_init_step(sys._getframe(0))

    code = compile("def _init_optim_state(f):\n    return f(__import__('sys')._getframe(0))\n",
                   "/x/torch/distributed/checkpoint/state_dict.py", "exec")
    scope: dict = {}
    exec(code, scope)
    assert scope["_init_optim_state"](fsdp._is_state_init_step)
    assert not _init_optim_state()  # the user's own function of that name


# ---------------------------------------------------------------- shared constants
def test_guards_have_one_home():
    from shardscope import _agentcore, run

    assert run._parser()._option_string_actions["--guard"].choices == list(_agentcore.GUARDS)


def test_severities_come_from_the_native_rule():
    assert _native.severities()[0] == "error"
