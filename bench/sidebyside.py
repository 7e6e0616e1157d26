"""Two builds of bench_trainoverhead side by side: the engine's cost of a change, measured as
the docs ask (a ratio of runs made in one session, the order of each pair drawn).

Each pair runs the baseline's and the candidate's bench_trainoverhead once each (order drawn),
and reads each run's median step of variants A (client attached) and C (telemetry off), wall
and training-process CPU. Prints the geometric mean of candidate / baseline over the pairs with
its 95 % interval (Student's t on the logs).

Usage: bench/sidebyside.py BASELINE_BINARY CANDIDATE_BINARY [--pairs N] [--steps N] [--seed S]
       (build the baseline in a worktree: git worktree add /tmp/base REV, then
       cmake --build /tmp/base/build --target bench_trainoverhead)
"""

import argparse
import math
import random
import re
import statistics
import subprocess
import sys

# Two-sided 97.5 % quantiles of Student's t by degrees of freedom (the pairs less one).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120,
        17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042}


def t975(df):
    return T975.get(df) or T975[max(k for k in T975 if k <= df)]


def run(binary, steps):
    out = subprocess.run([binary, "--reps", "5", "--steps", str(steps), "--toggled-steps", "31"],
                         capture_output=True, text=True, check=True).stdout
    medians = {}
    for variant in "AC":
        pattern = "^\\| " + variant + r":[^|]*\| ([\d.]+) \([^)]*\) \| ([\d.]+) "
        m = re.search(pattern, out, re.M)
        if not m:
            sys.exit(f"sidebyside: no median step of variant {variant} in {binary}'s output")
        medians[variant] = (float(m.group(1)), float(m.group(2)))
    return medians


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("baseline")
    parser.add_argument("candidate")
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--seed", type=int, default=51)
    args = parser.parse_args()
    if args.pairs < 2:
        parser.error("--pairs must be at least 2")
    rng = random.Random(args.seed)
    logs = {key: [] for key in ("A wall", "A cpu", "C wall", "C cpu")}
    for i in range(args.pairs):
        order = ["baseline", "candidate"] if rng.random() < 0.5 else ["candidate", "baseline"]
        got = {who: run(getattr(args, who), args.steps) for who in order}
        for variant in "AC":
            for j, what in enumerate(("wall", "cpu")):
                logs[f"{variant} {what}"].append(
                    math.log(got["candidate"][variant][j] / got["baseline"][variant][j]))
        print(f"pair {i + 1}/{args.pairs} ({' then '.join(order)}): C wall "
              f"{math.exp(logs['C wall'][-1]):.4f}, A wall {math.exp(logs['A wall'][-1]):.4f}",
              flush=True)
    print("\n| median step, candidate / baseline | geometric mean (95 % interval) |\n|---|---:|")
    for key, values in logs.items():
        mean = statistics.mean(values)
        half = t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
        print(f"| {key} | {math.exp(mean):.4f} ({math.exp(mean - half):.4f}-"
              f"{math.exp(mean + half):.4f}) |")


if __name__ == "__main__":
    main()
