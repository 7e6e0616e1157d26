"""The rank's CUDA allocator figures, for every agent: torch.cuda.memory_allocated,
memory_reserved and max_memory_allocated of the device the model's parameters are on, sent as
one allocator_sample (docs/protocol.md) after a step's memory_sample. A model on the CPU has
no allocator figures: nothing is sent (torch's CPU allocator keeps no such counters).
"""


def device_of(params):
    """The CUDA device of the first parameter in params that is on one, or None."""
    for p in params:
        dev = getattr(p, "device", None)
        if dev is not None and dev.type == "cuda":
            return dev
    return None


def sampler(native, device):
    """A function that posts one allocator_sample for device through native (an
    _native.Agent), or None when device is not a CUDA device."""
    if device is None or getattr(device, "type", None) != "cuda":
        return None
    import torch

    cuda = torch.cuda

    def sample():
        native.allocator_sample(cuda.memory_allocated(device), cuda.memory_reserved(device),
                                cuda.max_memory_allocated(device))

    return sample
