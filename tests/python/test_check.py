"""shardscope-check's own logic: its options, which library a script uses, and the report
it prints, from a job's snapshot as the ranks would have written it."""

from __future__ import annotations

import argparse
import types

import pytest

from shardscope import check


@pytest.mark.parametrize("argv,message", [
    (["-n", "0", "t.py"], "0 is outside the accepted 1..64"),
    (["-n", "two", "t.py"], "invalid int value: 'two' (accepted: 1..64)"),
    (["--timeout", "nan", "t.py"], "'nan' is not a number of seconds"),
    (["--timeout", "inf", "t.py"], "'inf' is not a number of seconds"),
    (["--timeout", "0", "t.py"], "'0' is not a number of seconds"),
    (["--steps", "1001", "t.py"], "1001 is outside the accepted 1..1000"),
    (["--backend", "fsdp1", "t.py"], "invalid choice: 'fsdp1'"),
])
def test_a_wrong_option_says_the_accepted_range(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        check._parser().parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_the_scripts_own_arguments_stay_its_own():
    args = check._parser().parse_args(["-n", "3", "train.py", "--steps", "9", "-n", "1"])
    assert (args.nproc, args.steps, args.script, args.args) == (3, 3, "train.py",
                                                                 ["--steps", "9", "-n", "1"])


@pytest.mark.parametrize("text,accelerate,backend", [
    ("import deepspeed\nengine, *_ = deepspeed.initialize(model=m)\n", None, "deepspeed"),
    ("from torch.distributed.fsdp import fully_shard\nfully_shard(m)\n", None, "fsdp"),
    ("plugin = DeepSpeedPlugin(zero_stage=3)\n", None, "deepspeed"),
    ("args = TrainingArguments(deepspeed='ds.json')\n", None, "deepspeed"),
    ("from accelerate import Accelerator\nacc = Accelerator()\n", True, "deepspeed"),
    ("from accelerate import Accelerator\nacc = Accelerator()\n", None, None),
])
def test_which_library_a_script_uses(tmp_path, text, accelerate, backend):
    script = tmp_path / "train.py"
    script.write_text(text)
    assert check.detect_backend(str(script), accelerate) == backend


def test_a_local_module_the_script_imports_counts(tmp_path):
    (tmp_path / "setup_model.py").write_text("from torch.distributed.fsdp import fully_shard\n")
    script = tmp_path / "train.py"
    script.write_text("import setup_model\nsetup_model.run()\n")
    assert check.detect_backend(str(script)) == "fsdp"


def test_a_script_of_no_sharding_library_could_not_run(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\nprint(torch.ones(1))\n")
    with pytest.raises(check.CouldNotRun, match="no supported sharding backend found"):
        check.detect_backend(str(script))
    with pytest.raises(check.CouldNotRun, match="cannot read the script"):
        check.detect_backend(str(tmp_path / "missing.py"))


def _violation(rank, step, severity="error", **kw):
    v = {"kind": "unregistered_access", "accessor": "decoder", "param": "embed.weight",
         "owner": "embed", "action": "read", "rank": rank, "step": step, "severity": severity,
         "location": {"file": "/work/train.py", "line": 42, "function": "forward",
                      "chain": ["/work/train.py:90 in main"]},
         "message": "decoder reads embed.weight, which is partitioned",
         "fix": "deepspeed.zero.register_external_parameter(decoder, embed.weight)"}
    v.update(kw)
    return v


def test_problems_merge_the_ledger_rows_with_their_ranks_steps_and_worst_severity():
    doc = {"violations": [_violation(0, 1, "cost"), _violation(1, 2, "error"),
                          _violation(0, 3, "cost"), _violation(1, 1, "info", kind="late_parameter",
                                                               param="w_g")]}
    problems = check.problems_of(doc, [0, 0, 0, 1])
    assert len(problems) == 2
    first = problems[0]
    assert (first["ranks"], first["first_step"], first["last_step"], first["count"],
            first["severity"]) == ({0, 1}, 1, 3, 3, "error")
    assert problems[1]["kind"] == "late_parameter"
    assert check._by_severity(problems) == "1 error, 1 info"


def test_the_report_names_the_line_the_fix_and_the_counts():
    doc = {"violations": [_violation(0, 1), _violation(1, 1)], "params": [], "engine": {}}
    problems = check.problems_of(doc, [0, 0])
    args = argparse.Namespace(script="train.py", nproc=2, snapshot="out.json")
    text = check.report_text(problems, doc, None, [{"steps": 3}, {"steps": 3}], args, 12.4)
    lines = text.splitlines()
    assert lines[0] == "shardscope-check train.py: 2 CPU ranks, 3 steps, 12 s"
    assert "1. unregistered_access: embed.weight read by decoder (ranks 0,1, step 1) [error]" in lines
    assert "   at /work/train.py:42 in forward" in lines
    assert "      from /work/train.py:90 in main" in lines
    assert "   fix: deepspeed.zero.register_external_parameter(decoder, embed.weight)" in lines
    assert lines[-1] == ("1 problem found (1 error); snapshot: out.json "
                         "(open with `shardscope out.json`)")


def test_a_clean_run_says_so():
    args = argparse.Namespace(script="t.py", nproc=2, snapshot="s.json")
    text = check.report_text([], {"violations": [], "params": [], "engine": {}}, None,
                             [{"steps": 3}], args, 5)
    assert text.endswith("no problems found; snapshot: s.json (open with `shardscope s.json`)")


@pytest.mark.parametrize("loc,expected", [
    (None, "(source location not known)"),
    ({"file": ""}, "(source location not known)"),
    ({"file": "/abs/x.py", "line": 3}, "/abs/x.py:3"),
    ({"file": "/abs/x.py", "line": 3, "function": "f"}, "/abs/x.py:3 in f"),
])
def test_where(loc, expected):
    assert check._where(loc) == expected


@pytest.mark.parametrize("n,text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"),
                                    (3 * 1024 ** 3, "3.0 GiB"), (5 * 1024 ** 5, "5120.0 TiB")])
def test_sizes(n, text):
    assert check._size(n) == text


@pytest.mark.parametrize("bucket,peak,at", [
    (0, 12000, "b"),        # no prefetch: the largest module's own parameters
    (10 ** 6, 16000, "a"),  # a prefetches b: both live at a
])
def test_the_gathered_peak_prediction_walks_the_first_steps_module_order(bucket, peak, at):
    # (module, [(numel, element size, persistent, identity)]); the tied embedding (identity 1,
    # in a and head) is one shard, the persistent norm whole on every rank
    order = [("a", [(1000, 4, False, 1)]), ("b", [(3000, 4, False, 2)]),
             ("head", [(1000, 4, False, 1)]), ("norm", [(10, 4, True, 3)])]
    prediction = check.predict_peak(order, {"prefetch_bucket_size": bucket}, 4)
    assert (prediction["gathered_peak_bytes"], prediction["at_module"]) == (peak, at)
    assert prediction["persistent_bytes"] == 40
    assert prediction["shard_bytes"] == (250 + 750) * 4
    assert prediction["total_bytes"] == peak + 40 + 4000


def test_outputs_that_cannot_be_written_are_refused_before_the_run(tmp_path):
    args = types.SimpleNamespace(snapshot=str(tmp_path / "no" / "dir" / "s.json"), sarif=None,
                                 junit=None)
    with pytest.raises(Exception) as e:
        check.check_outputs(args)
    assert "s.json" in str(e.value)


def test_every_violation_kind_has_a_sarif_rule():
    """SARIF names a rule for each kind the engine records (base/names.h, through the native
    module): a kind added without one made --sarif raise KeyError after the run."""
    from shardscope import _native

    assert sorted(check._RULES) == sorted(_native.violation_kinds())
