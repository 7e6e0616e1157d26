"""FSDP2 ranks (CPU, gloo) of a Transformers job caught while they build the model, for
tst_attachwhilebuilding (issue #49, defect 8).

Each rank builds Transformers' T5ForConditionalGeneration from a small config (nothing is
downloaded: python/examples/t5story.py) and shards it bottom-up, as Accelerate and torchtitan
do: fully_shard on each T5Block, then on the model. Rank 1 stops between the two, its blocks
sharded and the model not, until the file --go exists (it first creates --go + ".waiting");
rank 0 goes on to its first forward, where FSDP's lazy init names the root (the agent then
names the model and lists it) and waits in the first all-gather for rank 1. Meanwhile the test
lists the job and attaches the inspector and shardscope-capture to it; then it creates --go
and both ranks train --steps steps, then stay up --hold seconds. Every rank prints "rank R step S loss L".
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import shardscope.fsdp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python",
                                "examples"))
from t5story import VOCAB, t5_config  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--go", required=True)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--hold", type=float, default=0.0, help="seconds to stay up after training")
    a = p.parse_args()
    shardscope.fsdp.install()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world, ))
    torch.manual_seed(0)
    from transformers import T5ForConditionalGeneration

    model = T5ForConditionalGeneration(t5_config(1))
    for stack in (model.encoder, model.decoder):
        for block in stack.block:
            fully_shard(block, mesh=mesh)
    if rank == 1:
        open(a.go + ".waiting", "w").close()
        while not os.path.exists(a.go):
            time.sleep(0.05)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    for step in range(1, a.steps + 1):
        ids = torch.randint(2, VOCAB, (2, 8), generator=g)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    time.sleep(a.hold)
    shardscope.fsdp.finish()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
