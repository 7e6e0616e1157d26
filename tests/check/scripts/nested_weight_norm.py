"""A user's ZeRO-3 script whose weight_norm runs in a nested constructor (Model -> Encoder ->
PositionalConv), as wav2vec2's does: built inside zero.Init, the conv's weight is already
partitioned when weight_norm reads it. Used by tests/check/tst_check.cpp.

  --weight-norm unsafe   weight_norm(dim=None) on the partitioned conv: it reads an empty
                         placeholder without an error (the norm of nothing), the model is
                         built with wrong weights, and the first forward fails
  --weight-norm fixed    the workaround: GatheredParameters(modifier_rank=0) around it, the
                         new parameters registered on the module that uses them (per-channel
                         norm, dim=2, as wav2vec2's: zero.Init cannot broadcast dim=None's
                         0-dimensional weight_g)
"""
import argparse

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F


class PositionalConv(nn.Module):
    def __init__(self, hidden, fixed):
        super().__init__()
        self.conv = nn.Conv1d(hidden, hidden, 3, padding=1)
        if fixed:
            with deepspeed.zero.GatheredParameters(self.conv.weight, modifier_rank=0):
                self.conv = nn.utils.weight_norm(self.conv, name="weight", dim=2)
            deepspeed.zero.register_external_parameter(self, self.conv.weight_v)
            deepspeed.zero.register_external_parameter(self, self.conv.weight_g)
        else:
            self.conv = nn.utils.weight_norm(self.conv, name="weight", dim=None)

    def forward(self, x):
        return F.gelu(self.conv(x.transpose(1, 2)).transpose(1, 2))


class Encoder(nn.Module):
    def __init__(self, hidden, fixed):
        super().__init__()
        self.pos_conv_embed = PositionalConv(hidden, fixed)
        self.layer = nn.Linear(hidden, hidden)

    def forward(self, x):
        return self.layer(x + self.pos_conv_embed(x))


class Model(nn.Module):
    def __init__(self, vocab, hidden, fixed):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.encoder = Encoder(hidden, fixed)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--weight-norm", choices=["unsafe", "fixed"], default="unsafe")
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    deepspeed.init_distributed("gloo")
    world = torch.distributed.get_world_size()
    config = {"train_batch_size": 4 * world,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
              "zero_allow_untested_optimizer": True}
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = Model(29, 16, args.weight_norm == "fixed")
    engine, *_ = deepspeed.initialize(model=model, config=config,
                                      optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2))
    for _ in range(args.steps):
        ids = torch.randint(0, 29, (4, 8))
        logits = engine(ids)
        loss = F.cross_entropy(logits.reshape(-1, 29), ids.reshape(-1))
        engine.backward(loss)
        engine.step()


if __name__ == "__main__":
    main()
