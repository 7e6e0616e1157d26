"""A ZeRO-3 training loop that saves `model.state_dict()` every 100 steps, as scripts written
for one GPU do: under ZeRO-3 the file holds placeholders of size 0 (issue 54). The check's
steps never reach the save; `shardscope-check --save-check` runs it once. The save goes
through a function of the script (save_every), and a second one, the fix, sits beside it.
Used by tests/check/tst_check.cpp (saveCheckRunsTheScriptsSaves).
"""
import os

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIG = {"train_micro_batch_size_per_gpu": 2,
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                "stage3_gather_16bit_weights_on_model_save": True},
          "zero_allow_untested_optimizer": True}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(8, 8)
        self.fc = nn.Linear(8, 8)

    def forward(self, ids):
        return self.fc(torch.tanh(self.embed(ids)))


def save_fixed(engine, directory):
    engine.save_16bit_model(directory)  # the fix: every parameter gathered, rank 0 writes


def main():
    deepspeed.init_distributed("gloo")
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=CONFIG):
        model = Model()
    engine, _, _, _ = deepspeed.initialize(model=model, config=CONFIG,
                                           optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    for step in range(1, 1001):
        ids = torch.randint(0, 8, (2, 4))
        loss = F.cross_entropy(engine(ids).reshape(-1, 8), ids.reshape(-1))
        engine.backward(loss)
        engine.step()
        if step % 100 == 0:
            os.makedirs("checkpoints", exist_ok=True)
            torch.save(model.state_dict(), f"checkpoints/step{step}.pt")
            save_fixed(engine, f"checkpoints/fixed{step}")


if __name__ == "__main__":
    main()
