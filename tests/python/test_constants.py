"""The numbers C++ and Python share have one source, the native module, and the package reads
them from there (issue #50: status numbers were copied by hand in four places)."""

from __future__ import annotations

import ast
import os

from shardscope import _dsinternals, _native, _runtime, fsdp

PACKAGE = os.path.dirname(_native.__file__)


def test_status_numbers_are_the_engines():
    assert _native.PARAM_STATUSES == {"NOT_AVAILABLE": _native.PARAM_STATUS_NOT_AVAILABLE,
                                      "INFLIGHT": _native.PARAM_STATUS_INFLIGHT,
                                      "AVAILABLE": _native.PARAM_STATUS_AVAILABLE}
    assert _dsinternals.STATUS_NAMES is _native.PARAM_STATUSES
    assert (fsdp.SHARDED, fsdp.GATHERING, fsdp.UNSHARDED) == (
        _native.PARAM_STATUS_NOT_AVAILABLE, _native.PARAM_STATUS_INFLIGHT,
        _native.PARAM_STATUS_AVAILABLE)
    assert _dsinternals.status_number(object()) == _native.PARAM_STATUS_NOT_AVAILABLE


def test_history_limits_are_the_inspectors():
    assert _runtime.MAX_HISTORY == _native.MAX_HISTORY == 1 << 24
    assert _runtime.DEFAULT_HISTORY == _native.DEFAULT_HISTORY
    import inspect

    from shardscope import deepspeed

    for install in (deepspeed.install, fsdp.install):
        assert inspect.signature(install).parameters["history"].default == _native.DEFAULT_HISTORY


def test_no_number_is_copied_by_hand():
    """No module of the package binds a status name to a literal or repeats the history
    limits: they come from _native."""
    for name in os.listdir(PACKAGE):
        if not name.endswith(".py"):
            continue
        tree = ast.parse(open(os.path.join(PACKAGE, name)).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                assert not {"NOT_AVAILABLE", "INFLIGHT", "AVAILABLE"} <= keys, name
            if isinstance(node, ast.Constant) and isinstance(node.value, int) \
                    and not isinstance(node.value, bool):
                assert node.value not in (1 << 24, 65536), f"{name}:{node.lineno}"
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.LShift) \
                    and isinstance(node.right, ast.Constant) and node.right.value == 24:
                raise AssertionError(f"{name}:{node.lineno}: 1 << 24")


def test_the_stub_declares_every_export():
    stub = ast.parse(open(os.path.join(PACKAGE, "_native.pyi")).read())
    declared = set()
    for node in stub.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            declared.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            declared.add(node.target.id)
        elif isinstance(node, ast.Assign):
            declared.update(t.id for t in node.targets if isinstance(t, ast.Name))
    exported = {n for n in dir(_native) if not n.startswith("_")}
    assert exported <= declared, exported - declared
