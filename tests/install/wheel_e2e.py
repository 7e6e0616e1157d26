"""The wheel as a user installs it (docs/install.md), end to end, on real ranks.

scripts/wheel builds and repairs the wheel; a virtual environment of the test's own (not the
build's .venv) gets torch from this machine's disk, DeepSpeed and Transformers at the versions
pinned in python/requirements.txt, then the wheel. From a directory outside the checkout, with no
PYTHONPATH and no build folder on any path, the cases run unedited user scripts
(tests/install/user/) through `torchrun -m shardscope.run` and `shardscope-check`.

    python3 tests/install/wheel_e2e.py BUILD_DIR        (CTest: wheel_install)

The environment is kept in BUILD_DIR/wheel-venv between runs while the pins are unchanged; the
wheel is rebuilt and reinstalled every run.
"""

import glob
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
USER = os.path.join(ROOT, "tests", "install", "user")
BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build"))
# scripts/matrix runs the same cases on another torch release, in an environment of its own.
TORCH = os.environ.get("SHARDSCOPE_E2E_TORCH", "")
VENV = os.path.join(BUILD, f"wheel-venv-torch{TORCH}" if TORCH else "wheel-venv")
# What a user's own environment holds: torch (and what DeepSpeed's setup.py imports), DeepSpeed,
# Transformers. Nothing of ShardScope's test tools.
FIRST = ("torch", "numpy", "setuptools", "wheel", "packaging", "ninja", "psutil", "py-cpuinfo")
THEN = ("deepspeed", "transformers")


def pins():
    out = {}
    with open(os.path.join(ROOT, "python", "requirements.txt")) as f:
        for line in f:
            m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line)
            if m:
                out[m.group(1).lower()] = m.group(0)
    if TORCH:
        out["torch"] = f"torch=={TORCH}"
    return out


def run(cmd, timeout=600, **kw):
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout, **kw)
    sys.stderr.write(f"[{time.monotonic() - t0:6.1f} s] {' '.join(cmd)[:160]} -> {p.returncode}\n")
    return p


def user_env(**extra):
    """The environment a user's shell has: no PYTHONPATH, the venv's bin first, CPU DeepSpeed."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "SHARDSCOPE_", "VIRTUAL_ENV"))}
    env["PATH"] = os.path.join(VENV, "bin") + os.pathsep + env.get("PATH", "")
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               TORCH_EXTENSIONS_DIR=os.path.join(VENV, "torch-extensions"),
               XDG_RUNTIME_DIR=tempfile.mkdtemp(prefix="ss-xdg-"))
    env.update(extra)
    return env


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data)


def violations(snapshot):
    return snapshot.get("state", snapshot).get("violations", [])


class Wheel(unittest.TestCase):
    wheel = None

    @classmethod
    def setUpClass(cls):
        p = run([os.path.join(ROOT, "scripts", "wheel")], timeout=1800)
        if p.returncode != 0:
            raise AssertionError(f"scripts/wheel failed:\n{p.stderr[-4000:]}")
        cls.wheel = p.stdout.strip().splitlines()[-1]
        pinned = pins()
        want = hashlib.sha256(json.dumps([pinned.get(n) for n in FIRST + THEN]).encode()).hexdigest()
        stamp = os.path.join(VENV, ".installed")
        have = ""
        if os.path.exists(stamp):
            with open(stamp) as f:
                have = f.read()
        if have != want:
            shutil.rmtree(VENV, ignore_errors=True)
            run(["/usr/bin/python3", "-m", "venv", VENV], check=True)
            pip = [os.path.join(VENV, "bin", "python"), "-m", "pip", "install", "-q",
                   "--disable-pip-version-check"]
            p = run(pip + [pinned[n] for n in FIRST], timeout=1800)
            assert p.returncode == 0, p.stderr[-4000:]
            p = run(pip + ["--no-build-isolation"] + [pinned[n] for n in THEN],
                    timeout=1800, env=dict(os.environ, DS_BUILD_OPS="0"))
            assert p.returncode == 0, p.stderr[-4000:]
            with open(stamp, "w") as f:
                f.write(want)
        p = run([os.path.join(VENV, "bin", "python"), "-m", "pip", "install", "-q",
                 "--disable-pip-version-check", "--force-reinstall", "--no-deps", cls.wheel])
        assert p.returncode == 0, p.stderr[-4000:]
        cls.work = tempfile.mkdtemp(prefix="ss-wheel-")  # outside the checkout

    def launch(self, *args, nproc=2, timeout=600, **env):
        torchrun = os.path.join(VENV, "bin", "torchrun")
        return run([torchrun, "--nproc-per-node", str(nproc), *args], cwd=self.work,
                   env=user_env(**env), timeout=timeout)

    def test_the_torch_asked_for(self):
        py = os.path.join(VENV, "bin", "python")
        p = run([py, "-c", "import torch; print(torch.__version__)"], env=user_env())
        self.assertEqual(p.stdout.strip().split("+")[0], pins()["torch"].split("==")[1])

    def test_installed_where_a_user_has_it(self):
        """The package, its native module and the commands come from the venv, nowhere else."""
        py = os.path.join(VENV, "bin", "python")
        p = run([py, "-c", "import shardscope, shardscope._native as n; "
                           "print(shardscope.__file__); print(n.__version__)"],
                cwd=self.work, env=user_env())
        self.assertEqual(p.returncode, 0, p.stderr)
        where, version = p.stdout.split()
        self.assertTrue(where.startswith(VENV), where)
        self.assertIn(f"-{version}-", os.path.basename(self.wheel))
        for command in ("shardscope-run", "shardscope-capture"):
            p = run([os.path.join(VENV, "bin", command), "--version"], cwd=self.work, env=user_env())
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn(version, p.stdout)
        p = run([os.path.join(VENV, "bin", "shardscope-run"), "--version"], env=user_env())
        self.assertRegex(p.stdout, r"tested: DeepSpeed [0-9.]+.* on torch")
        # manylinux, and nothing it links is left to the system but the policy's libraries
        self.assertRegex(os.path.basename(self.wheel), r"manylinux_\d+_\d+_x86_64\.whl$")

    def test_deepspeed_story_through_the_launcher(self):
        """torchrun -m shardscope.run on an unedited ZeRO-3 script: each rank's snapshot holds
        the tied embedding's read with its fix; the script sees what Python gives it."""
        script = os.path.join(USER, "train_deepspeed.py")
        out = os.path.join(self.work, "ds.rank{rank}.shardscope.json")
        p = self.launch("-m", "shardscope.run", "--snapshot-out", out, script, "--steps", "2",
                        "--exit-status", "3")
        self.assertEqual(p.returncode != 0, True)  # torchrun reports the ranks' status 3
        self.assertIn(f"user script: argv={[script, '--steps', '2', '--exit-status', '3']!r} "
                      f"name=__main__ path0={USER}", p.stdout)
        self.assertIn("step 2 loss", p.stdout)
        self.assertIn("exitcode  : 3", p.stderr)
        for rank in (0, 1):
            doc = load(out.format(rank=rank))
            fixes = [v.get("fix", "") for v in violations(doc)]
            self.assertIn("deepspeed.zero.register_external_parameter(model.lm_head, "
                          "model.embed.weight)", fixes, f"rank {rank}: {fixes}")

    def test_fsdp_story_and_the_users_exception(self):
        """The same for FSDP2: the read of a sharded parameter in the loop is recorded; the
        script's own exception reaches the user unchanged, with no frame of the launcher."""
        script = os.path.join(USER, "train_fsdp.py")
        out = os.path.join(self.work, "fsdp.rank{rank}.shardscope.json")
        p = self.launch("-m", "shardscope.run", "--snapshot-out", out, script, "--fail")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("ValueError: the user's own error at step 1", p.stderr)
        tb = p.stderr[p.stderr.index("Traceback"):]
        tb = tb[:tb.index("ValueError: the user's own error")]
        self.assertNotIn("runpy", tb)
        self.assertNotIn("shardscope", tb)
        self.assertIn(f'File "{script}"', tb)
        for rank in (0, 1):
            doc = load(out.format(rank=rank))
            fixes = [v.get("fix", "") for v in violations(doc)]
            self.assertTrue(any("model.blocks[1].fc1.weight.full_tensor()" in f for f in fixes),
                            f"rank {rank}: {fixes}")

    def test_check_names_the_line(self):
        """shardscope-check, installed by the wheel, on the unedited DeepSpeed script."""
        script = os.path.join(USER, "train_deepspeed.py")
        with open(script) as f:
            line = next(i for i, text in enumerate(f, 1)
                        if "return F.linear(x, self.embed.weight)" in text)
        p = run([os.path.join(VENV, "bin", "shardscope-check"), "--timeout", "240", script],
                cwd=self.work, env=user_env(), timeout=400)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn(f"train_deepspeed.py:{line}", p.stdout)
        self.assertIn("register_external_parameter(model.lm_head, model.embed.weight)", p.stdout)

    def test_bad_launches_say_what_to_do(self):
        runner = os.path.join(VENV, "bin", "shardscope-run")
        p = run([runner, "missing.py"], cwd=self.work, env=user_env())
        self.assertEqual(p.returncode, 2)
        self.assertIn("missing.py: no such file", p.stderr)
        p = run([runner, os.path.join(USER, "train_deepspeed.py")], cwd=self.work,
                env=user_env(OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2"))
        self.assertEqual(p.returncode, 2)
        self.assertIn("OMPI_COMM_WORLD_RANK is set but RANK is not", p.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
