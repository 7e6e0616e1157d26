"""Builds its model, then deepspeed.initialize fails: the config's batch sizes disagree
(train_batch_size 3 is not 1 per rank x 2 ranks). Used by tests/check/tst_check.cpp."""
import deepspeed
import torch
import torch.nn as nn

deepspeed.init_distributed("gloo")
model = nn.Linear(4, 4)
deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                     config={"train_batch_size": 3, "train_micro_batch_size_per_gpu": 1,
                             "gradient_accumulation_steps": 1,
                             "zero_optimization": {"stage": 3}})
