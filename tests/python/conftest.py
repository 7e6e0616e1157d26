"""The fast tier: the agents' and the check's pure logic, without launching ranks.

Runs against the package as the build lays it out (build/python, with the native module), or
the directory named by SHARDSCOPE_PYTHON_DIR (CTest passes it):

    PYTHONPATH=build/python .venv/bin/python -m pytest tests/python
"""

from __future__ import annotations

import os
import sys

import pytest

_here = os.path.dirname(os.path.abspath(__file__))
_package_dir = os.environ.get("SHARDSCOPE_PYTHON_DIR") or os.path.join(_here, "..", "..", "build", "python")
if os.path.isdir(_package_dir) and _package_dir not in sys.path:
    sys.path.insert(0, os.path.abspath(_package_dir))


@pytest.fixture(autouse=True)
def _one_process_job(monkeypatch):
    """Each test is a job of one process unless it says otherwise: a RANK or WORLD_SIZE of the
    shell (or of a launcher running the suite) does not leak into the agents' decisions."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SHARDSCOPE_CHECK"):
        monkeypatch.delenv(name, raising=False)
