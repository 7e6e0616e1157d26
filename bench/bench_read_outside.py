"""What a read of a partitioned parameter outside any forward costs with the DeepSpeed agent
(issue #30, defect 7): one rank (gloo, CPU), a ZeRO-3 nn.Embedding built under zero.Init, and
N uses of `model.weight.sum()` in the training loop, outside every forward (on the empty
placeholder DeepSpeed leaves: the bug the agent reports, as a user keeps doing it). Timed in
a process without the agent and in one with it (snapshot_out set, as the issue measured);
the figure is the ratio of the two times per use.

    .venv/bin/python bench/bench_read_outside.py --build build [--uses 10000] [--runs 3]

Run it with the project environment's Python (scripts/deps), the one the native module in
build/python is built for.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile

RANK = r'''
import os, sys, time, glob, torch, deepspeed
uses, agent, out = int(sys.argv[1]), sys.argv[2] == "agent", sys.argv[3]
if agent:
    import shardscope.deepspeed as ssd
    ssd.install(listen=False, snapshot_out=out)
import logging; logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
deepspeed.init_distributed("gloo")
cfg = {"train_batch_size": 1, "zero_optimization": {"stage": 3}}
with deepspeed.zero.Init(config_dict_or_path=cfg):
    model = torch.nn.Embedding(1000, 64)
model.weight.sum()  # the first: the violation reported, its snapshot written
began = time.perf_counter()
for _ in range(uses):
    model.weight.sum()
took = time.perf_counter() - began
if agent:
    ssd.finish()
print(f"PER_USE {took / uses * 1e6:.3f}")
torch.distributed.destroy_process_group()
port = os.environ["MASTER_PORT"]
for f in glob.glob(f"/dev/shm/deepspeed_*_127.0.0.1_{port}_*"):
    os.unlink(f)
'''


def one(build, uses, agent, out):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DS_ACCELERATOR="cpu",
               OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(build, "python"))
    r = subprocess.run([sys.executable, "-c", RANK, str(uses), "agent" if agent else "none", out],
                       env=env, capture_output=True, text=True, timeout=600)
    for line in r.stdout.splitlines():
        if line.startswith("PER_USE "):
            return float(line.split()[1])
    raise SystemExit(f"the rank failed ({r.returncode}):\n{r.stdout}\n{r.stderr[-3000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--uses", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        without, with_agent = [], []
        for _ in range(args.runs):  # ABAB: drift of a shared machine hits both alike
            without.append(one(args.build, args.uses, False, ""))
            with_agent.append(one(args.build, args.uses, True, os.path.join(d, "s.json")))
    a, b = statistics.median(without), statistics.median(with_agent)
    print(f"read outside forward, {args.uses} uses x {args.runs} runs (median per use): "
          f"without the agent {a:.2f} us, with it {b:.2f} us: ratio {b / a:.2f}")


if __name__ == "__main__":
    main()
