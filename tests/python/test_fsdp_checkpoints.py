"""shardscope.fsdp's checkpoint checks without ranks: what a save would lose, found in a state
dict however it is nested (docs/fsdp.md, "Checkpoints that lose data"). DTensors on a mesh of
two ranks come from torch's fake process group (one process, no communication)."""

from __future__ import annotations

import pytest
import torch

from shardscope import fsdp


@pytest.fixture
def mesh2():
    """A device mesh of two ranks, this process rank 1, on torch's fake process group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    assert not dist.is_initialized()
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=2)
    try:
        yield init_device_mesh("cpu", (2, ))
    finally:
        dist.destroy_process_group()


def _dtensor(mesh, local, shape, placement):
    from torch.distributed.tensor import DTensor

    stride = tuple(int(torch.tensor(shape[i + 1:]).prod()) for i in range(len(shape)))
    return DTensor.from_local(local, mesh, [placement], run_check=False, shape=torch.Size(shape),
                              stride=stride)


def test_the_walk_finds_what_measure_counts_in_order_through_dicts_lists_and_tuples():
    inner = {"a": 1, "b": 2}
    obj = {"model": inner, "extra": [3, ("x", 4)], "step": 5, "same": inner}
    obj["self"] = obj  # a container that holds itself is no loop
    found = fsdp._tensors_in(obj, lambda v: v * 10 if isinstance(v, int) and v != 5 else None)
    # inner is looked in once, under its first key
    assert found == [(("model", "a"), 10), (("model", "b"), 20), (("extra", 0), 30),
                     (("extra", 1, 1), 40)]


def test_the_walk_stops_at_its_depth():
    deep: dict = {"t": 1}
    for _ in range(10):
        deep = {"d": deep}
    assert fsdp._tensors_in(deep, lambda v: v if isinstance(v, int) else None) == []
    assert fsdp._tensors_in({"d": {"t": 1}}, lambda v: v if isinstance(v, int) else None) == \
        [(("d", "t"), 1)]


def test_a_shard_loses_what_the_other_ranks_hold(mesh2):
    from torch.distributed.tensor import Replicate, Shard

    # rank 1 of 2 holds 16 of embed's 33 rows: the other rank's 17 x 16 fp32 elements
    embed = _dtensor(mesh2, torch.zeros(16, 16), (33, 16), Shard(0))
    assert fsdp._sharded(embed, 2)
    assert fsdp._shard_loss(embed) == 17 * 16 * 4
    bias = _dtensor(mesh2, torch.zeros(8, dtype=torch.bfloat16), (16, ), Shard(0))
    assert fsdp._shard_loss(bias) == 8 * 2
    whole = _dtensor(mesh2, torch.zeros(4), (4, ), Replicate())
    assert not fsdp._sharded(whole)
    for value in (whole, torch.zeros(33, 16), 3, "embed.weight", None):
        assert fsdp._shard_loss(value) is None
    state = {"model": {"embed.weight": embed, "bias": bias, "plain": torch.zeros(2)}, "step": 3}
    assert fsdp._tensors_in(state, fsdp._shard_loss) == [(("model", "embed.weight"), 1088),
                                                         (("model", "bias"), 16)]


def test_a_mesh_of_one_rank_loses_nothing():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = _dtensor(init_device_mesh("cpu", (1, )), torch.zeros(3, 2), (3, 2), Shard(0))
        assert fsdp._sharded(t) and not fsdp._sharded(t, 2)  # load_state_dict's test, save's
        assert fsdp._shard_loss(t) is None
    finally:
        dist.destroy_process_group()
