"""shardscope-check on the Hugging Face T5 example (python/examples/hf_stories.py, the Trainer
with a ZeRO-3 config), world 2, 3 steps: wall time from the command's start to its exit,
including Python's start and the imports, against the target of 60 s (docs/performance.md,
section 13), and where the time goes (rank 0's stages, from the report's `time:` line).

    PYTHONPATH=build/python .venv/bin/python bench/bench_check.py [--runs 3]

Exit 1 when the median is above the target.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "python", "examples", "hf_stories.py")
TARGET_S = 60.0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--case", default="t5-forward")
    a = p.parse_args()
    walls, parts = [], []
    with tempfile.TemporaryDirectory() as d:
        for i in range(a.runs):
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "shardscope.check", "--snapshot",
                                os.path.join(d, "t5.json"), EXAMPLE, "--case", a.case],
                               capture_output=True, text=True)
            wall = time.perf_counter() - t0
            m = re.search(r"imports ([\d.]+) s, script to its first step ([\d.]+) s, steps "
                          r"([\d.]+) s; start, snapshot and exit ([\d.]+) s", r.stdout)
            if r.returncode not in (0, 1) or not m:
                print(f"run {i + 1}: shardscope-check exited {r.returncode}\n{r.stdout}\n"
                      f"{r.stderr[-2000:]}")
                return 2
            walls.append(wall)
            parts.append([float(x) for x in m.groups()])
            print(f"run {i + 1}: {wall:.1f} s wall (load {load:.1f}): imports {m.group(1)} s, "
                  f"script to first step {m.group(2)} s, 3 steps {m.group(3)} s, snapshot and "
                  f"exit {m.group(4)} s; exit status {r.returncode}")
    med = statistics.median(walls)
    names = ("imports", "script to first step", "steps", "snapshot and exit")
    split = ", ".join(f"{n} {statistics.median(x[k] for x in parts):.1f} s"
                      for k, n in enumerate(names))
    print(f"median {med:.1f} s wall over {a.runs} runs (target <= {TARGET_S:.0f} s): "
          f"{'met' if med <= TARGET_S else 'NOT met'}; median split: {split}")
    return 0 if med <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
