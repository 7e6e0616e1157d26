"""A script that names no sharding library: Accelerator() takes DeepSpeed ZeRO-3 from the
Accelerate config (`accelerate config` wrote it; accelerate_deepspeed.yaml here), as under
`accelerate launch`. Used by tests/check/tst_check.cpp.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator


def main():
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))
    data = torch.utils.data.TensorDataset(torch.randint(0, 16, (64, 4)))
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for (ids, ) in loader:
        loss = F.cross_entropy(model(ids).reshape(-1, 16), ids.reshape(-1))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
