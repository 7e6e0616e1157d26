"""A user's DeepSpeed ZeRO-3 training script that knows nothing of ShardScope (story 1 of
shared/context: a tied embedding read by another module). Run as a user would:

    torchrun --nproc-per-node 2 train_deepspeed.py --steps 3
    torchrun --nproc-per-node 2 -m shardscope.run --snapshot-out run.rank{rank}.json train_deepspeed.py --steps 3

It prints its arguments, __name__ and sys.path[0] on rank 0, so that a test sees that a launcher
left them as Python sets them, and exits with --exit-status after training.
"""
import argparse
import sys

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F


class Head(nn.Module):
    def __init__(self, embed):
        super().__init__()
        object.__setattr__(self, "embed", embed)  # tied: a reference, not a child

    def forward(self, x):
        return F.linear(x, self.embed.weight)  # reads a weight that `embed` owns


class TinyLM(nn.Module):
    def __init__(self, vocab=37, hidden=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.fc = nn.Linear(hidden, hidden)
        self.lm_head = Head(self.embed)

    def forward(self, ids):
        return self.lm_head(torch.tanh(self.fc(self.embed(ids))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--exit-status", type=int, default=0)
    args = parser.parse_args()
    deepspeed.init_distributed("gloo")
    rank = torch.distributed.get_rank()
    if rank == 0:
        print(f"user script: argv={sys.argv!r} name={__name__} path0={sys.path[0]}", flush=True)
    config = {"train_batch_size": 4 * torch.distributed.get_world_size(),
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
              "zero_allow_untested_optimizer": True}
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = TinyLM()
    engine, *_ = deepspeed.initialize(model=model, config=config,
                                      optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2))
    g = torch.Generator().manual_seed(rank)
    for step in range(1, args.steps + 1):
        ids = torch.randint(0, 37, (4, 8), generator=g)
        logits = engine(ids)
        loss = F.cross_entropy(logits.reshape(-1, 37), ids.reshape(-1))
        engine.backward(loss)
        engine.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    torch.distributed.destroy_process_group()
    sys.exit(args.exit_status)


if __name__ == "__main__":
    main()
