"""A user's PyTorch FSDP2 training script that knows nothing of ShardScope: each block a unit,
and the loop logs a block's weight norm from `to_local()`, outside any unit's forward: this
rank's shard, not the weight (a silent read of a sharded parameter). With --fail it raises its
own error after the first step, so a test sees that a launcher leaves the script's exception and
status as they are.

    torchrun --nproc-per-node 2 -m shardscope.run --snapshot-out run.rank{rank}.json train_fsdp.py
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1 = nn.Linear(hidden, hidden)
        self.fc2 = nn.Linear(hidden, hidden)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Model(nn.Module):
    def __init__(self, hidden=16, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(depth))
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--fail", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        print(f"user script: argv={sys.argv!r} name={__name__} path0={sys.path[0]}", flush=True)
    torch.manual_seed(0)
    model = Model()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for step in range(1, args.steps + 1):
        x = torch.randn(4, 16, generator=g)
        loss = model(x).pow(2).mean()
        loss.backward()
        with torch.no_grad():
            norm = model.blocks[1].fc1.weight.to_local().norm()  # the shard's norm, not the weight's
        opt.step()
        opt.zero_grad()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} fc1 norm {norm.item():.4f}", flush=True)
        if args.fail:
            raise ValueError(f"the user's own error at step {step}")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
