"""Plain torch: neither DeepSpeed nor FSDP."""
import torch

print(torch.ones(2).sum())
