"""An FSDP2 script (torch.distributed.fsdp.fully_shard)."""
import torch
from torch.distributed.fsdp import fully_shard

model = fully_shard(torch.nn.Linear(4, 4))
