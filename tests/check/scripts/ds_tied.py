"""A ZeRO-3 model with a tied embedding, as GPT-2's: the head's weight is the embedding's
(one parameter in two modules). What shardscope-check's DeepSpeed memory prediction counts
once. Embedding 8x8, fc Linear(8, 8), head Linear(8, 8, bias=False) tied to the embedding;
nothing persistent, one prefetch bucket for the whole model. Used by tests/check/tst_check.cpp.
"""
import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIG = {"train_micro_batch_size_per_gpu": 2,
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                "stage3_prefetch_bucket_size": 1000000},
          "zero_allow_untested_optimizer": True}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(8, 8)
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 8, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, ids):
        return self.head(torch.tanh(self.fc(self.embed(ids))))


def main():
    deepspeed.init_distributed("gloo")
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=CONFIG):
        model = Model()
    engine, _, _, _ = deepspeed.initialize(model=model, config=CONFIG,
                                           optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(10):
        ids = torch.randint(0, 8, (2, 4))
        loss = F.cross_entropy(engine(ids).reshape(-1, 8), ids.reshape(-1))
        engine.backward(loss)
        engine.step()


if __name__ == "__main__":
    main()
