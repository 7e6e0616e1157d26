"""Every private name of torch, FSDP2 and DeepSpeed an agent touches is declared in its
internals file and checked at install: a release that lacks one is refused with its name."""

from __future__ import annotations

import ast
import os
import re
import types

import pytest

from shardscope import ShardScopeError, _dsinternals, _fsdpinternals, _torchinternals

PACKAGE = os.path.dirname(_torchinternals.__file__)


def test_this_torch_and_deepspeed_have_every_declared_name():
    assert _torchinternals.missing() == []
    assert _fsdpinternals.check()  # the torch version
    assert _dsinternals.check_hooks() == []


def test_a_torch_without_a_required_name_is_refused_with_it(monkeypatch):
    monkeypatch.setattr(_torchinternals, "REQUIRED", _torchinternals.REQUIRED + (
        ("torch._C", "_shardscope_renamed", "a name a later torch renamed"),))
    assert _torchinternals.missing() == ["torch._C._shardscope_renamed"]
    with pytest.raises(ShardScopeError, match=r"torch\._C\._shardscope_renamed does not exist"):
        _fsdpinternals.check()
    problems = _dsinternals.check_hooks()
    assert problems == ["torch._C._shardscope_renamed does not exist"]


def test_an_fsdp2_without_a_hooked_method_is_refused_with_it(monkeypatch):
    monkeypatch.setattr(_fsdpinternals, "HOOKS", _fsdpinternals.HOOKS + (
        ("_fsdp_param_group", "FSDPParamGroup", "_renamed_unshard"),))
    with pytest.raises(ShardScopeError) as e:
        _fsdpinternals.check()
    assert "_fsdp_param_group.FSDPParamGroup._renamed_unshard does not exist" in str(e.value)
    assert "tested on torch" in str(e.value)


def test_a_constructor_that_no_longer_sets_an_attribute_is_refused(monkeypatch):
    # FSDPState._state_ctx: read in the root's hooks, declared and checked at install
    monkeypatch.setattr(_fsdpinternals, "CONSTRUCTED_ATTRIBUTES", (
        ("_fsdp_state", "FSDPStateContext.__init__", ("self.all_states", "self.renamed_root")),))
    with pytest.raises(ShardScopeError, match="FSDPStateContext.__init__ setting self.renamed_root"):
        _fsdpinternals.check()


def test_a_deepspeed_without_a_hook_is_refused_with_it(monkeypatch):
    monkeypatch.setattr(_dsinternals, "HOOKS", _dsinternals.HOOKS + (
        ("deepspeed.runtime.zero.partition_parameters", "Init._renamed_hook", ("self",)),))
    with pytest.raises(ShardScopeError) as e:
        _dsinternals.check_version()
    assert "Init._renamed_hook does not exist" in str(e.value)
    assert "tested on DeepSpeed 0.19.8, 0.16.9" in str(e.value)


def test_a_deepspeed_hook_with_other_parameters_is_refused(monkeypatch):
    monkeypatch.setattr(_dsinternals, "HOOKS", (
        ("deepspeed.runtime.zero.partition_parameters", "Init._zero_init_param",
         ("self", "param", "extra")),))
    assert _dsinternals.check_hooks() == [
        "deepspeed.runtime.zero.partition_parameters.Init._zero_init_param takes (self, param), "
        "not (self, param, extra)"]


def test_an_object_missing_a_read_attribute_is_refused():
    group = types.SimpleNamespace(fsdp_params=[], modules=[])
    with pytest.raises(ShardScopeError, match="cannot read FSDPParamGroup._all_gather_result"):
        _fsdpinternals.check_attributes("FSDPParamGroup", group)


def _private_reads(path):
    """Attribute reads `x._name` and getattr(x, "_name") (not self's, not a dunder) in a file."""
    tree = ast.parse(open(path).read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                and not node.attr.startswith("__"):
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "a", "agent", "cls", "_fi", "_ds",
                                                            "_runtime", "_native", "_frames", "sys",
                                                            "os", "_allocator", "_torchinternals",
                                                            "_agentcore", "hot"):
                continue
            names.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) \
                and node.args[1].value.startswith("_") and not node.args[1].value.startswith("__"):
            names.add(node.args[1].value)
    return names


def _declared():
    text = "\n".join(open(os.path.join(PACKAGE, f)).read()
                     for f in ("_fsdpinternals.py", "_dsinternals.py", "_torchinternals.py"))
    return set(re.findall(r"\b_[A-Za-z][A-Za-z0-9_]*", text))


def test_every_private_name_the_agents_read_is_declared():
    # The agents' own objects' private names (the agent's, the hot path's, the suspects',
    # shardscope's own _shardscope_* keys) are theirs; the rest are a framework's.
    own = {"_shardscope_module", "_paused", "_group", "_Group", "_slot", "_Agent", "_native",
           # Accelerate's, patched by the check where present (_checkboot._patch_accelerate_state)
           "_prepare_backend"}
    for agent in ("fsdp.py", "deepspeed.py", "_checkboot.py"):
        undeclared = {n for n in _private_reads(os.path.join(PACKAGE, agent))
                      if n not in own and not n.startswith("_shardscope")} - _declared()
        assert not undeclared, f"{agent} reads private names no internals file declares: {undeclared}"
