"""Issue 54, the DeepSpeed agent's checkpoint watching without ranks: how a ZeRO checkpoint's
world is read from its files, which calls are DeepSpeed's own, and that the agent leaves
torch's and DeepSpeed's methods exactly as they were once it finishes (the real ranks:
tests/deepspeed/tst_deepspeedagent.cpp, checkpointPitfalls)."""

from __future__ import annotations

import json
import sys

import pytest

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


def _patched_objects():
    """Every object the DeepSpeed agent may replace, as the class or module holds it: each
    HOOKS entry resolved as _dsinternals.check_hooks does (a class's own __dict__ entry, so a
    function and not a bound method), torch's Module.state_dict and load_state_dict (the
    checkpoint watching), Tensor.backward and autograd.backward (the step's loss) and
    Parameter's ds_status (absent unless observed)."""
    import torch

    found = {f"{m}.{d}": _dsinternals._resolve(m, d) for m, d, _ in _dsinternals.HOOKS}
    for name in ("state_dict", "load_state_dict"):
        found[f"torch.nn.Module.{name}"] = torch.nn.Module.__dict__[name]
    found["torch.Tensor.backward"] = torch.Tensor.__dict__["backward"]
    found["torch.autograd.backward"] = torch.autograd.backward
    found["torch.nn.Parameter.ds_status"] = torch.nn.Parameter.__dict__.get("ds_status")
    return found


def test_the_deepspeed_agent_leaves_torch_and_deepspeed_as_they_were():
    import torch
    from deepspeed.runtime.engine import DeepSpeedEngine

    import shardscope.deepspeed as ssd

    module, engine = torch.nn.Module.__dict__, DeepSpeedEngine.__dict__
    before = (module["state_dict"], module["load_state_dict"], engine["load_checkpoint"])
    everything = _patched_objects()
    ssd.install(listen=False)
    try:
        patched = (module["state_dict"], module["load_state_dict"], engine["load_checkpoint"])
        for new, old in zip(patched, before, strict=True):
            assert new is not old and new.__wrapped__ is old
            names = (new.__name__, new.__qualname__, new.__doc__)
            assert names == (old.__name__, old.__qualname__, old.__doc__)
        # the scope functions DeepSpeed's hooks call are the agent's while it observes
        during = _patched_objects()
        assert any(during[k] is not everything[k] for k in during if "sub_module_" in k)
        # a model that is not ZeRO-3's: its state dict and load go through unchanged
        lin = torch.nn.Linear(2, 2)
        sd = lin.state_dict()
        assert sorted(sd) == ["bias", "weight"] and sd["weight"].shape == (2, 2)
        assert str(lin.load_state_dict(sd)) == "<All keys matched successfully>"
    finally:
        ssd.finish()
    after = _patched_objects()
    assert sorted(after) == sorted(everything)
    changed = [name for name in everything if after[name] is not everything[name]]
    assert changed == [], f"still the agent's after finish(): {changed}"


_SCRIPT = '''\
import torch


def save_it(obj, directory, how="whole"):
    if how == "pieces":
        torch.save(list(obj.values()), directory + "/pieces.pt")
    else:
        torch.save(obj, directory + "/inner.pt")


def loop(stop):
    model = {"w": torch.ones(2)}
    out = "nowhere/real.pt"
    for step in range(1):
        stop()
        if step % 100 == 0:
            torch.save(model, out)
            for how in ["whole", "pieces"]:
                save_it(model, "nowhere", how)
            torch.save(made_later, out)
'''


def test_save_check_runs_the_loops_saves_into_its_own_folder(tmp_path, monkeypatch):
    import importlib.util

    import torch

    from shardscope import _savecheck

    path = tmp_path / "train.py"
    path.write_text(_SCRIPT)
    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location("train_under_check", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    ran: list = []

    class Done(BaseException):
        pass

    def stop():  # as the check's last step does (_checkboot._stop)
        ran.extend(_savecheck.run_saves(sys._getframe(1), str(path), str(tmp_path / "check")))
        raise Done

    with pytest.raises(Done):
        script.loop(stop)
    lines = _SCRIPT.splitlines()
    # the save function's `if how == "pieces"` branch is not taken for the loop's first item
    save, inner, call, later = (lines.index(text) + 1 for text in (
        "            torch.save(model, out)", "        torch.save(obj, directory + \"/inner.pt\")",
        "                save_it(model, \"nowhere\", how)", "            torch.save(made_later, out)"))
    assert [(e["line"], e["ran"], e["via"]) for e in ran] == [
        (save, True, None), (inner, True, call), (later, False, None)]
    assert ran[2]["error"] == "NameError: name 'made_later' is not defined"
    assert torch.load(tmp_path / "check" / "save-1" / "saved.pt")["w"].tolist() == [1.0, 1.0]
    assert (tmp_path / "check" / "save-2" / "saved.pt").exists()
    assert not (tmp_path / "nowhere").exists()  # nothing where the script writes


def test_the_saves_a_script_has_are_found_in_its_source():
    from shardscope import _savecheck

    source = ("import torch\nimport torch.distributed.checkpoint as dcp\n"
              "torch.save(m.state_dict(), 'a.pt')\nmodel.save_pretrained('out')\n"
              "engine.save_checkpoint('ck', tag='t')\ndcp.save(sd, checkpoint_id='d')\n"
              "torch.load('a.pt')\nsave('x')\n")
    assert [(s.line, s.kind) for s in _savecheck.saves_in(source)] == [
        (3, "torch.save"), (4, "save_pretrained"), (5, "save_checkpoint"), (6, "dcp.save")]
