"""What the FSDP2 agent (shardscope.fsdp) costs a real FSDP2 step: world 2 over gloo (CPU),
a client attached (shardscope-capture on rank 0), python/examples/fsdp_stories.py with
--layers N (each block its own fully_shard unit: 3 modules and 4 parameters a block, so
--layers 100 is ~300 modules and 100 all-gathers a forward).

Step by step within one run, as bench_deepspeed_agent.py: the agent is paused and resumed
between steps (shardscope.fsdp.pause/resume: paused, FSDP runs its own methods) in blocks of
K steps, in pairs of blocks, one observed and one paused, which first drawn for each pair by
a generator seeded with the pair's number (python/examples/steplabels.py; a fixed order read
about 1 % on its own in section 10); each pair's ratio observed / paused of the blocks' mean
step time, for wall time, rank 0's training-thread CPU and its process CPU (the agent's
server thread included); the geometric mean over all pairs of all runs, with its 95 %
interval (t over the pairs' log ratios).

    .venv/bin/python bench/bench_fsdp_agent.py --build build [--layers 100] [--hidden 64]
        [--runs 2] [--steps 120] [--toggle 5] [--toggle-method switch|both|control] [--control]

--toggle-method control labels the steps the same way with the agent and its client there and
never pauses it; --control runs the same schedule without the agent (`--no-agent`: the blocks
labelled, nothing toggled, no client). Either ratio is the method's own bias and noise on this
machine, to be read beside the agent's (an A/A test).
"""
import argparse
import glob
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchpackage import add_installed_argument, capture_command, package_env

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LAUNCH = os.path.join(ROOT, "scripts", "launch")
EXAMPLE = os.path.join(ROOT, "python", "examples", "fsdp_stories.py")
# two-sided 95 % t quantiles by degrees of freedom (larger: 1.96)
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23,
       12: 2.18, 15: 2.13, 20: 2.09, 25: 2.06, 30: 2.04, 40: 2.02, 60: 2.00}


def t95(df):
    keys = sorted(k for k in T95 if k <= df)
    return T95[keys[-1]] if keys and df <= 60 else 1.96


def one_run(args, out_dir, run):
    runtime = tempfile.mkdtemp(prefix="fsdpbench-rt-")
    env = dict(package_env(args, os.path.abspath(args.build)),
               XDG_RUNTIME_DIR=runtime, OMP_NUM_THREADS="1")
    timing = os.path.join(out_dir, f"run{run}.rank{{rank}}.jsonl")
    cmd = [LAUNCH, "-n", "2", sys.executable, EXAMPLE, "--layers", str(args.layers), "--hidden",
           str(args.hidden), "--steps", str(args.steps), "--toggle", str(args.toggle),
           "--timing", timing, "--toggle-method", args.toggle_method] + (["--no-agent"] if args.control else [])
    ranks = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    capture = None
    disc = os.path.join(runtime, "shardscope")
    for _ in range(0 if args.control else 600):  # rank 0's endpoint, then a client attached to it
        for f in glob.glob(os.path.join(disc, "*.json")):
            try:
                d = json.load(open(f))
            except (OSError, ValueError):
                continue
            if d.get("job", {}).get("ranks") == [0]:
                capture = subprocess.Popen(
                    [capture_command(args, args.build), "--attach", d["endpoint"],
                     "--until-step", str(args.steps + 10), "--out", os.path.join(out_dir, f"capture{run}.json")],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                break
        if capture is not None or ranks.poll() is not None:
            break
        time.sleep(0.05)
    out, err = ranks.communicate(timeout=3600)
    if ranks.returncode != 0:
        sys.exit(f"the ranks failed:\n{err[-3000:]}")
    if capture is None and not args.control:
        sys.exit("no client could attach to rank 0")
    if capture is not None:
        capture.wait(timeout=60)
    with open(timing.replace("{rank}", "0")) as f:
        return [json.loads(line) for line in f]


def pair_ratios(steps, toggle, skip_blocks):
    blocks = {}
    for s in steps:
        blocks.setdefault(s["step"] // toggle, []).append(s)
    ratios = {"wall": [], "thread_cpu": [], "process_cpu": []}
    for b in range(skip_blocks, max(blocks) + 1, 2):
        if b + 1 not in blocks or len(blocks[b]) != toggle or len(blocks[b + 1]) != toggle:
            continue
        pair = (blocks[b], blocks[b + 1])
        on = [x for x in pair if x[0]["observed"]]
        off = [x for x in pair if not x[0]["observed"]]
        if len(on) != 1 or len(off) != 1:
            continue
        for k in ratios:
            ratios[k].append(statistics.mean(x[k] for x in on[0]) / statistics.mean(x[k] for x in off[0]))
    return ratios


def summary(values):
    logs = [math.log(v) for v in values]
    m = statistics.mean(logs)
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else float("nan")
    return math.exp(m), math.exp(m - half), math.exp(m + half)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    add_installed_argument(p)
    p.add_argument("--layers", type=int, default=100)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--toggle", type=int, default=5)
    p.add_argument("--toggle-method", choices=["switch", "both", "control"], default="switch",
                   help="how the agent is paused and resumed (fsdp_stories.py --toggle-method); "
                        "control: never, the agent's own A/A")
    p.add_argument("--control", action="store_true",
                   help="the same schedule without the agent: the method's bias (A/A)")
    a = p.parse_args()
    import torch

    out_dir = tempfile.mkdtemp(prefix="fsdpbench-")
    ratios = {"wall": [], "thread_cpu": [], "process_cpu": []}
    medians = []
    for run in range(a.runs):
        steps = one_run(a, out_dir, run)
        r = pair_ratios(steps, a.toggle, skip_blocks=2)  # the first two blocks warm up
        for k in ratios:
            ratios[k].extend(r[k])
        medians.append((statistics.median(s["wall"] for s in steps if s["observed"]),
                        statistics.median(s["wall"] for s in steps if not s["observed"])))
    print(f"FSDP2 on torch {torch.__version__}, world 2 over gloo (CPU), fsdp_stories.py "
          f"--layers {a.layers} --hidden {a.hidden} ({3 * a.layers + 3} modules, {a.layers + 1} "
          f"fully_shard units), "
          f"{'CONTROL (no agent, no client)' if a.control else 'shardscope-capture attached to rank 0'}; "
          f"{a.runs} runs x {a.steps} "
          f"steps, blocks of {a.toggle} in pairs whose order is drawn per pair, toggle method "
          f"{a.toggle_method}, {len(ratios['wall'])} pairs")
    for obs, off in medians:
        print(f"  run median step: observed {obs * 1e3:.1f} ms, paused {off * 1e3:.1f} ms")
    print("| rank 0 | observed / paused (geometric mean) | 95 % interval |")
    print("|---|---|---|")
    for k, label in (("wall", "wall time"), ("thread_cpu", "training thread CPU"),
                     ("process_cpu", "process CPU (server thread included)")):
        g, lo, hi = summary(ratios[k])
        print(f"| {label} | {100 * (g - 1):+.1f} % | {100 * (lo - 1):+.1f} % .. {100 * (hi - 1):+.1f} % |")
    print(f"(timings in {out_dir})")


if __name__ == "__main__":
    main()
