#!/usr/bin/env python3
"""The CUDA allocator figures reach the snapshot: runs a story script on one GPU (world 1,
``python -m torch.distributed.run --nproc-per-node 1``, ``--device cuda``, ``--snapshot-out``)
and reads the snapshot with the json module alone (docs/snapshot.md, "events").

    PYTHONPATH=build/python python tests/fsdp/gpu_allocator_check.py [--agent fsdp|deepspeed]

Checks: allocator_sample events are present, each with allocated > 0 and reserved >=
allocated (docs/protocol.md, type 21); every step_end carries the loss the story printed;
reduce_scatter_begin/end pairs are present, with bytes.
Exits 0 when all hold, 1 with what failed, 77 (CTest's skip) with the reason when CUDA is not
available. torch (or, for --agent deepspeed, DeepSpeed) missing fails it, unless
SHARDSCOPE_ALLOW_SKIP names the agent (tests/support/prerequisite.py): then it skips too. No Qt: it runs where only Python, torch
and the built shardscope package are.
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import prerequisite  # noqa: E402

SKIP = prerequisite.SKIP
HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "python", "examples")


def events_of(doc):
    """The snapshot's events as one dict each (docs/snapshot.md: columns, or the older list)."""
    ev = doc.get("events")
    if isinstance(ev, list):
        return ev
    out, ts, step = [], 0, 0
    for i in range(ev["count"] if isinstance(ev, dict) else 0):
        ts = (ts + ev["ts_ns"][i]) % 2**64
        step += ev["step"][i]
        out.append({"ts_ns": ts, "step": step, "rank": ev["rank"][i],
                    "type": ev["type_names"][ev["type"][i]],
                    **{k: ev[k][i] for k in ("flags", "a", "b", "u0", "u1", "u2")}})
    return out


def loss_of(e):
    import struct

    return struct.unpack("<d", struct.pack("<Q", e["u0"]))[0]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--agent", choices=["fsdp", "deepspeed"], default="fsdp")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--python", default=sys.executable)
    a = p.parse_args()

    try:
        import torch
    except ImportError as e:  # not a missing GPU: fails unless asked for (prerequisite.py)
        return prerequisite.missing([a.agent], f"torch is not importable ({e})")
    if not torch.cuda.is_available():
        print(f"SKIP: CUDA is not available to torch {torch.__version__} here "
              f"(torch.cuda.is_available() is False)")
        return SKIP
    if a.agent == "deepspeed":
        try:
            import deepspeed  # noqa: F401
        except ImportError as e:
            return prerequisite.missing(["deepspeed"], f"--agent deepspeed needs DeepSpeed ({e})")

    script = os.path.join(EXAMPLES, "fsdp_stories.py" if a.agent == "fsdp" else
                          "deepspeed_stories.py")
    with tempfile.TemporaryDirectory() as tmp:
        snapshot = os.path.join(tmp, "gpu.rank{rank}.json")
        env = dict(os.environ)
        if a.agent == "deepspeed":
            env["DS_ACCELERATOR"] = "cuda"
        cmd = [a.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
               script,
               "--device", "cuda", "--steps", str(a.steps), "--snapshot-out", snapshot]
        print("running:", " ".join(cmd), flush=True)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540)
        if r.returncode != 0:
            print(f"FAIL: the story exited {r.returncode}\n--- stdout\n{r.stdout}\n--- stderr\n"
                  f"{r.stderr}")
            return 1
        path = snapshot.replace("{rank}", "0")
        if not os.path.exists(path):
            print(f"FAIL: no snapshot at {path}\n--- stderr\n{r.stderr}")
            return 1
        with open(path) as f:
            doc = json.load(f)
        stdout = r.stdout

    events = events_of(doc)
    problems = []
    samples = [e for e in events if e["type"] == "allocator_sample"]
    if not samples:
        types = sorted({e["type"] for e in events})
        problems.append(f"no allocator_sample among {len(events)} events (types: {types})")
    for e in samples:
        allocated, reserved, peak = e["u0"], e["u1"], e["u2"]
        if not allocated > 0:
            problems.append(f"step {e['step']}: allocated {allocated} is not > 0")
        if not reserved >= allocated:
            problems.append(f"step {e['step']}: reserved {reserved} < allocated {allocated}")
        if not peak >= allocated:
            problems.append(f"step {e['step']}: peak allocated {peak} < allocated {allocated}")
    ends = [e for e in events if e["type"] == "step_end"]
    if len(ends) != a.steps:
        problems.append(f"{len(ends)} step_end events, expected {a.steps}")
    # Each step ends with the loss the story printed ("rank 0 step S loss L", 4 decimals).
    printed = {int(m.group(1)): float(m.group(2))
               for m in re.finditer(r"rank 0 step (\d+) loss (-?[0-9.]+)", stdout)}
    for e in ends:
        loss = loss_of(e)
        if not math.isfinite(loss):
            problems.append(f"step {e['step']}: loss {loss} is not a finite number")
        elif e["step"] not in printed or abs(loss - printed[e["step"]]) > 5e-5:
            problems.append(f"step {e['step']}: loss {loss}, the story printed "
                            f"{printed.get(e['step'])}")
    # The gradients' reduce-scatters, begun and (on CUDA: seen) completed, bytes > 0.
    begins = [e for e in events if e["type"] == "reduce_scatter_begin"]
    finished = [e for e in events if e["type"] == "reduce_scatter_end"]
    if not begins or len(begins) != len(finished) or any(e["u0"] == 0 for e in begins):
        problems.append(f"{len(begins)} reduce_scatter_begin and {len(finished)} "
                        f"reduce_scatter_end (each with bytes > 0)")
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        return 1
    last = samples[-1]
    print(f"OK: torch {torch.__version__}: {len(samples)} allocator samples on "
          f"{torch.cuda.get_device_name(0)}; the last: allocated {last['u0']} B, reserved "
          f"{last['u1']} B, peak {last['u2']} B; {len(ends)} steps ending with the printed "
          f"loss; {len(begins)} reduce-scatters ({sum(e['u0'] for e in begins)} B)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
