"""Issue 54, the DeepSpeed agent's checkpoint watching without ranks: how a ZeRO checkpoint's
world is read from its files, which calls are DeepSpeed's own, and that the agent leaves
torch's and DeepSpeed's methods exactly as they were once it finishes (the real ranks:
tests/deepspeed/tst_deepspeedagent.cpp, checkpointPitfalls)."""

from __future__ import annotations

import json
import sys

from shardscope import _dsinternals, _frames


def _checkpoint(folder, ranks, prefix=""):
    folder.mkdir(parents=True)
    for r in range(ranks):
        (folder / f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt").write_bytes(b"")
        (folder / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt").write_bytes(b"")


def test_a_checkpoints_world_is_its_data_parallel_partition_files(tmp_path):
    _checkpoint(tmp_path / "global_step5", 3)
    (tmp_path / "latest").write_text("global_step5\n")
    assert _dsinternals.checkpoint_world(str(tmp_path), None) == (str(tmp_path / "global_step5"), 3)
    _checkpoint(tmp_path / "bf16", 4, prefix="bf16_")
    assert _dsinternals.checkpoint_world(str(tmp_path), "bf16")[1] == 4


def test_a_checkpoint_that_cannot_be_read_has_no_world(tmp_path):
    assert _dsinternals.checkpoint_world(str(tmp_path), None) == ("", 0)  # no `latest`
    assert _dsinternals.checkpoint_world(str(tmp_path / "missing"), "t") == ("", 0)
    (tmp_path / "empty").mkdir()
    assert _dsinternals.checkpoint_world(str(tmp_path), "empty") == (str(tmp_path / "empty"), 0)


def test_a_call_is_a_packages_when_its_code_is_between_the_caller_and_the_user():
    seen = []

    def default(obj):  # called by json's pure-Python encoder (indent=...)
        seen.append((_frames.called_by(sys._getframe(1), "json"),
                     _frames.called_by(sys._getframe(1), "shardscope_not_imported")))
        return str(obj)

    json.dumps({"x": object()}, indent=1, default=default)
    assert seen == [(True, False)]
    assert not _frames.called_by(sys._getframe(0), "json")  # the test's own frame is the user's


def test_the_deepspeed_agent_leaves_torch_and_deepspeed_as_they_were():
    import torch
    from deepspeed.runtime.engine import DeepSpeedEngine

    import shardscope.deepspeed as ssd

    module, engine = torch.nn.Module.__dict__, DeepSpeedEngine.__dict__
    before = (module["state_dict"], module["load_state_dict"], engine["load_checkpoint"])
    ssd.install(listen=False)
    try:
        patched = (module["state_dict"], module["load_state_dict"], engine["load_checkpoint"])
        for new, old in zip(patched, before, strict=True):
            assert new is not old and new.__wrapped__ is old
            names = (new.__name__, new.__qualname__, new.__doc__)
            assert names == (old.__name__, old.__qualname__, old.__doc__)
        # a model that is not ZeRO-3's: its state dict and load go through unchanged
        lin = torch.nn.Linear(2, 2)
        sd = lin.state_dict()
        assert sorted(sd) == ["bias", "weight"] and sd["weight"].shape == (2, 2)
        assert str(lin.load_state_dict(sd)) == "<All keys matched successfully>"
    finally:
        ssd.finish()
    assert (module["state_dict"], module["load_state_dict"], engine["load_checkpoint"]) == before
