"""A ZeRO-3 run through Accelerate's DeepSpeed plugin: the script names no DeepSpeed config
and does not import deepspeed; Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
calls deepspeed.initialize in prepare(). Used by tests/check/tst_check.cpp.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator, DeepSpeedPlugin


def main():
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
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
