"""An FSDP2 script with gradient accumulation: two micro-batches per optimizer step, the first
without gradient sync (set_requires_gradient_sync(False)). Four blocks (Linear 16x16, no bias,
each its own unit) and a head (Linear 16->8) on the root. What shardscope-check's FSDP2 memory
prediction replays one micro-batch at a time. Used by tests/check/tst_check.cpp.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(16, 16, bias=False) for _ in range(4))
        self.head = nn.Linear(16, 8)

    def forward(self, x):
        for b in self.blocks:
            x = torch.tanh(b(x))
        return self.head(x)


def main():
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(), ))
    torch.manual_seed(0)
    model = Model()
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(10):
        for micro in range(2):
            model.set_requires_gradient_sync(micro == 1)
            model(torch.randn(4, 16)).square().mean().backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
