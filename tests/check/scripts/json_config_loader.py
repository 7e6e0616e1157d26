"""A user's ZeRO-3 script whose DeepSpeed config is a JSON file (ds_config.json: 4 per rank,
gradient accumulation 2, train_batch_size 16 at 2 ranks) and whose batches come from
DeepSpeed's own data loader (deepspeed.initialize(training_data=...)): what
`shardscope-check --micro-batch N` changes. Used by tests/check/tst_check.cpp.

  --deepspeed_config FILE   the config as args.deepspeed_config (deepspeed.add_config_arguments)
  --config FILE             the config as deepspeed.initialize(config=FILE)
"""
import argparse

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=None)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    deepspeed.init_distributed("gloo")
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=args.config or args.deepspeed_config):
        model = nn.Sequential(nn.Embedding(29, 16), nn.Linear(16, 29))
    data = torch.utils.data.TensorDataset(torch.randint(0, 29, (256, 8)))
    engine, _, loader, _ = deepspeed.initialize(
        args=args if args.config is None else None, model=model, config=args.config,
        training_data=data, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2))
    for (ids, ) in loader:
        logits = engine(ids)
        loss = F.cross_entropy(logits.reshape(-1, 29), ids.reshape(-1))
        engine.backward(loss)
        engine.step()


if __name__ == "__main__":
    main()
