"""What the DeepSpeed agent costs a real ZeRO-3 step: world 2 (gloo, CPU), with a client
attached (shardscope-capture on rank 0), on Transformers' T5ForConditionalGeneration trained by
a Trainer (python/examples/hf_stories.py --case t5-forward, registered: a clean run; --layers 6:
a few hundred modules), or on the small TinyLM of python/examples/deepspeed_stories.py
(--model tinylm).

1. Step by step, within one run (the figure): the agent is paused and resumed between steps
   (shardscope.deepspeed.pause/resume: paused, DeepSpeed runs its own code), in pairs of
   blocks, one observed and one paused, which first drawn for each pair by a generator seeded
   with the pair's number (python/examples/steplabels.py: a fixed order lined up with something
   periodic in the steps and read about 1 % on its own); each pair's ratio observed / paused,
   for wall time, rank 0's training-thread CPU time and its whole process's CPU time (the
   agent's server thread included); geometric mean over all pairs of all runs with its 95 %
   interval. --toggle-method control labels the steps the same way and never pauses: the
   method's own bias (expect 1); --detached attaches no client.
2. Runs without the agent vs with it (ABAB...), median step time of each run: what a paused
   agent and its idle server leave, which 1. cannot see (skip with --pairs 0).
3. Where the agent's time goes: cProfile of rank 0 in one more run, agent functions only.

    .venv/bin/python bench/bench_deepspeed_agent.py --build build [--model t5|tinylm]
        [--runs 3] [--toggled-steps 400] [--pairs 3] [--steps 150]

Run it with the project environment's Python (scripts/deps), the one the native module in
build/python is built for: the ranks run under the same interpreter.
"""
import argparse
import glob
import json
import math
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time

from benchpackage import add_installed_argument, capture_command, package_env

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LAUNCH = os.path.join(ROOT, "scripts", "launch")
EXAMPLES = {"t5": os.path.join(ROOT, "python", "examples", "hf_stories.py"),
            "tinylm": os.path.join(ROOT, "python", "examples", "deepspeed_stories.py")}


def versions():
    from importlib.metadata import version

    return {p: version(p) for p in ("deepspeed", "torch", "transformers")}


def model_args(args):
    if args.model == "t5":
        return ["--case", "t5-forward", "--externals", "manual", "--layers", str(args.layers),
                "--log-every", "1000000"]
    return ["--externals", "manual", "--weight-norm", "workaround", "--hidden", str(args.hidden)]


def describe(args):
    v = versions()
    model = (f"T5ForConditionalGeneration, {args.layers}+{args.layers} layers, Trainer"
             if args.model == "t5" else f"TinyLM, hidden {args.hidden}")
    return (f"DeepSpeed {v['deepspeed']} ZeRO-3 on torch {v['torch']} (Transformers "
            f"{v['transformers']}), world 2 over gloo, {model}")


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


def run(args, build, tmp, name, agent, profile=False, client=True, toggle=0, steps=None):
    env = dict(package_env(args, build), XDG_RUNTIME_DIR=tmp,
               DS_ACCELERATOR="cpu", LOCAL_SIZE="2", OMP_NUM_THREADS="1",
               TORCH_EXTENSIONS_DIR=os.path.join(build, "torch-extensions",
                                                 versions()["deepspeed"]))
    timing = os.path.join(tmp, f"{name}.rank{{rank}}.txt")
    cmd = [LAUNCH, "-n", "2", sys.executable, EXAMPLES[args.model], *model_args(args),
           "--steps", str(steps or args.steps), "--timing", timing]
    if toggle:
        cmd += ["--toggle", str(toggle)]
        cmd += ["--toggle-method", args.toggle_method]
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
                        [capture_command(args, build), "--attach", d["endpoint"],
                         "--seconds", "600", "--out", os.path.join(tmp, f"{name}.capture.json")],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    break
            time.sleep(0.05)
    _, err = proc.communicate(timeout=900)
    if capture is not None:
        capture.wait(timeout=60)
    if proc.returncode != 0:
        sys.exit(f"bench: run {name} failed:\n{err.decode()[-3000:]}")
    rows = [line.split() for line in open(timing.replace("{rank}", "0")) if line.strip()]
    rows = [(float(w), float(c), float(p), int(o)) for w, c, p, o in rows]
    if toggle:
        return rows
    return statistics.median(r[0] for r in rows[args.warmup:])


def log_pairs(rows, warmup, toggle):
    """Per pair of blocks (one observed, one paused, adjacent): log(observed / paused) of the
    blocks' medians, for each of the three measures."""
    out = ([], [], [])
    block = lambda b: rows[b * toggle:(b + 1) * toggle]
    first = (warmup + 2 * toggle - 1) // (2 * toggle) * 2  # the first whole pair after warm-up
    for b in range(first, len(rows) // toggle - 1, 2):
        x, y = block(b), block(b + 1)
        on, off = (x, y) if x[0][3] else (y, x)
        if not on[0][3] or off[0][3]:
            sys.exit("bench: the timing file's observed flags do not alternate as expected")
        for m in range(3):
            a = statistics.median(r[m] for r in on)
            z = statistics.median(r[m] for r in off)
            if a > 0 and z > 0:
                out[m].append(math.log(a / z))
    return out


def interval(logs):
    mean = statistics.fmean(logs)
    half = 1.96 * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    add_installed_argument(parser)
    parser.add_argument("--model", choices=sorted(EXAMPLES), default="t5")
    parser.add_argument("--layers", type=int, default=6, help="T5: encoder and decoder layers")
    parser.add_argument("--runs", type=int, default=3, help="runs of the step-by-step measure")
    parser.add_argument("--toggled-steps", type=int, default=400)
    parser.add_argument("--toggle", type=int, default=1, help="steps per observed/paused block")
    parser.add_argument("--pairs", type=int, default=3, help="ABAB pairs of runs (0: skip)")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=16, help="TinyLM: hidden size")
    parser.add_argument("--target", type=float, default=1.03,
                        help="observed / paused wall time the whole interval must lie below")
    parser.add_argument("--no-client", action="store_true",
                        help="B runs the agent with no client attached (what the client costs)")
    parser.add_argument("--toggle-method", choices=["switch", "both", "control"], default="switch",
                        help="switch: resume before an observed block, pause before a paused one; "
                        "both: every step follows a pause and a resume, in the order that leaves "
                        "its state (the switches cost both kinds of step alike); control: never "
                        "paused, the steps only labelled (the method's own bias: expect 1)")
    parser.add_argument("--detached", action="store_true",
                        help="step by step with no client attached (what reading the events "
                        "costs the ranks and the cores they share)")
    args = parser.parse_args()
    print(f"Machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        print(f"#### Step by step: the agent paused and resumed within one run\n\n"
              f"{describe(args)}, agent + "
              f"{'no client' if args.detached else 'shardscope-capture on rank 0'}; {args.runs} runs of {args.toggled_steps} steps, "
              f"observed and paused in blocks of {args.toggle} step(s), in pairs whose "
              f"order is drawn per pair (the same on both ranks), toggle method "
              f"{args.toggle_method}; the first {args.warmup} steps not counted; per pair "
              f"observed / paused of rank 0's block medians; geometric mean over all pairs "
              f"with its 95 % interval\n")
        logs = ([], [], [])
        cpu_frac = []
        for i in range(args.runs):
            rows = run(args, args.build, tmp, f"t{i}", agent=True, toggle=args.toggle,
                       steps=args.toggled_steps, client=not args.detached)
            for m, l in enumerate(log_pairs(rows, args.warmup, args.toggle)):
                logs[m].extend(l)
        names = ("wall time of a step", "training thread's CPU time",
                 "process CPU time (training thread, agent's server, torch's threads)")
        print("| measure (rank 0) | observed / paused, 95 % interval | pairs |")
        print("|---|---|---|")
        for m in range(3):
            g, lo, hi = interval(logs[m])
            print(f"| {names[m]} | **{g:.4f}** ({lo:.4f}-{hi:.4f}) | {len(logs[m])} |")
        g, lo, hi = interval(logs[0])
        t = args.target
        verdict = (f"met (the whole interval lies below {t:.2f})" if hi <= t else
                   f"**missed** (the interval lies above {t:.2f})" if lo > t else
                   f"**not resolved** (the interval contains {t:.2f})")
        print(f"\nTarget <= {(t - 1) * 100:.0f} % on wall time: {verdict}.\n", flush=True)
    if args.pairs <= 0:
        return
    print(f"#### Runs without the agent against runs with it\n\n"
          f"{describe(args)}, {args.steps} steps per run "
          f"(first {args.warmup} not counted); B = agent"
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
