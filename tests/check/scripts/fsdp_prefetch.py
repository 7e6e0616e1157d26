"""An FSDP2 script with an explicit forward prefetch and a unit that stays unsharded after
forward: what shardscope-check's FSDP2 memory prediction reads (docs/check.md). Three blocks
(Linear 16x16, no bias) and a head (Linear 16->8) on the root; blocks[1] is sharded with
reshard_after_forward=False; blocks[0] prefetches blocks[1] and blocks[2] in forward.
Used by tests/check/tst_check.cpp.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(16, 16, bias=False) for _ in range(3))
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
    for i, b in enumerate(model.blocks):
        fully_shard(b, mesh=mesh, reshard_after_forward=(i != 1))
    fully_shard(model, mesh=mesh)
    model.blocks[0].set_modules_to_forward_prefetch([model.blocks[1], model.blocks[2]])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(10):
        loss = model(torch.randn(4, 16)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
