"""What the DeepSpeed agent costs a real ZeRO-3 step: world 2 (gloo, CPU), the harness's small
model (python/examples/deepspeed_stories.py), without the agent vs with the agent and a
client attached (shardscope-capture on rank 0), in alternating runs of one benchmark
(ABAB...), so that machine drift hits both sides alike. Prints a Markdown table: median step
time of each run, the ratio of each B to its A, and the median of the ratios; then where the
agent's time goes (cProfile of rank 0 in one extra run, agent functions only).

    /usr/bin/python3 bench/bench_deepspeed_agent.py --build build [--pairs 3] [--steps 300]
"""
import argparse
import glob
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DS_CPU = os.path.normpath(os.path.join(ROOT, "..", "shared", "deepspeed-cpu"))
EXAMPLE = os.path.join(ROOT, "python", "examples", "deepspeed_stories.py")


def machine():
    cpu = "unknown cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, {platform.python_version()}"


def run(args, build, tmp, name, agent, profile=False, client=True):
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"), XDG_RUNTIME_DIR=tmp)
    timing = os.path.join(tmp, f"{name}.rank{{rank}}.txt")
    cmd = [os.path.join(DS_CPU, "launch"), "--nproc", "2", EXAMPLE, "--externals", "manual",
           "--weight-norm", "workaround", "--steps", str(args.steps), "--timing", timing,
           "--hidden", str(args.hidden)]
    if not agent:
        cmd.append("--no-agent")
    if profile:
        cmd += ["--profile", os.path.join(tmp, f"{name}.prof")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    capture = None
    if agent and client:
        # Attach a client to rank 0 as soon as it announces itself.
        deadline = time.time() + 120
        while capture is None and time.time() < deadline and proc.poll() is None:
            for f in glob.glob(os.path.join(tmp, "shardscope", "*.json")):
                try:
                    d = json.load(open(f))
                except (OSError, ValueError):
                    continue
                if d.get("job", {}).get("ranks") == [0]:
                    capture = subprocess.Popen(
                        [os.path.join(build, "bin", "shardscope-capture"), "--attach", d["endpoint"],
                         "--seconds", "600", "--out", os.path.join(tmp, f"{name}.capture.json")],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    break
            time.sleep(0.05)
    _, err = proc.communicate(timeout=900)
    if capture is not None:
        capture.wait(timeout=60)
    if proc.returncode != 0:
        sys.exit(f"bench: run {name} failed:\n{err.decode()[-3000:]}")
    steps = [float(x) for x in open(timing.replace("{rank}", "0")).read().split()]
    return statistics.median(steps[args.warmup:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--no-client", action="store_true",
                        help="B runs the agent with no client attached (what the client costs)")
    args = parser.parse_args()
    print(f"Machine: {machine()}")
    print(f"DeepSpeed 0.14.5 ZeRO-3, world 2 over gloo, {args.steps} steps per run "
          f"(first {args.warmup} not counted), hidden {args.hidden}; B = agent"
          f"{'' if args.no_client else ' + shardscope-capture on rank 0'}\n")
    print(f"| pair | A: no agent, median step | B: agent{'' if args.no_client else ' + client'}, median step | B / A |")
    print("|---|---|---|---|")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            a = run(args, args.build, tmp, f"a{i}", agent=False)
            b = run(args, args.build, tmp, f"b{i}", agent=True, client=not args.no_client)
            ratios.append(b / a)
            print(f"| {i + 1} | {a * 1e3:.3f} ms | {b * 1e3:.3f} ms | {b / a:.4f} |", flush=True)
        print(f"\nMedian B / A: **{statistics.median(ratios):.4f}** "
              f"(min {min(ratios):.4f}, max {max(ratios):.4f})\n")
        if args.no_client:
            return
        run(args, args.build, tmp, "profile", agent=True, profile=True)
        prof = os.path.join(tmp, "profile.prof")
        if os.path.exists(prof):
            stats = pstats.Stats(prof)
            rows = []
            for (path, line, func), (cc, nc, tt, ct, callers) in stats.stats.items():
                if "shardscope" in path and ("deepspeed.py" in path or "_dsinternals.py" in path):
                    rows.append((tt, nc, f"{os.path.basename(path)}:{func}"))
            rows.sort(reverse=True)
            agent_self = sum(r[0] for r in rows)
            print("Where the agent's time goes (rank 0, cProfile, self time of agent functions, "
                  "profiler overhead included):\n")
            print("| function | calls | self time |")
            print("|---|---|---|")
            for tt, nc, name in rows[:10]:
                print(f"| {name} | {nc} | {tt * 1e3:.1f} ms |")
            print(f"\nAgent functions: {agent_self * 1e3:.1f} ms self time over {args.steps} steps "
                  f"({agent_self / args.steps * 1e6:.1f} µs per step).")


if __name__ == "__main__":
    main()
