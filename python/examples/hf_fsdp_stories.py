"""Story 1 on Transformers' T5ForConditionalGeneration under FSDP2 (fully_shard), with
ShardScope attached (one process per rank).

    PYTHONPATH=build/python scripts/launch -n 2 .venv/bin/python python/examples/hf_fsdp_stories.py --case stacks
    shardscope --attach job:...   # or shardscope-capture --list, while it runs

The T5 is built from a small config (nothing is downloaded); each T5Block is an FSDP unit and
the model the root, as Accelerate's and torchtitan's wrapping makes them; the only ShardScope
line is the install() at the top of main(), as a user adds it to their own script. T5 ties one
embedding matrix into four places: model.shared, encoder.embed_tokens, decoder.embed_tokens and
lm_head.

  --case stacks        the encoder and decoder stacks are FSDP units too, as one might wrap an
                       encoder-decoder model: the shared embedding is then tied into three groups
                       (the root's, encoder's and decoder's), and torch raises ValueError at the
                       first forward ("... is shared with a parameter already managed by another
                       FSDP group"), after ShardScope recorded it with one fix for all three
                       groups. --fixed runs that fix: fully_shard([model, model.encoder,
                       model.decoder]).
  --case compute-loss  story 1's read in the user's training loop, between the forward and
                       loss.backward(): sampled_input.view(b*l, c).mm(model.shared.weight).
                       FSDP2 does not reshard the root's group after the root's forward (the
                       root's default), so the read gets the whole weight and its gradient is
                       reduce-scattered with the root's: it trains, nothing is flagged, and the
                       losses are those of --fixed, which makes the read in the model's forward
                       (a T5ForConditionalGeneration subclass). With --root-reshards
                       (fully_shard(model, reshard_after_forward=True)) the read meets the
                       sharded DTensor: torch fails ("got mixed torch.Tensor and DTensor"), after
                       ShardScope recorded the read with the fix (into the model's forward).

Also --root-reshards, --steps N, --layers N (T5 depth), --guard warn|error, --snapshot-out F.rank{rank}.json,
--hold SECONDS, --no-agent. Every rank prints "rank R step S loss L" (S from 1).
"""
import argparse
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import shardscope.fsdp
from rankexit import exit_rank
from t5story import VOCAB, sampled_inputs, t5_config


def t5_class():
    from transformers import T5ForConditionalGeneration

    class T5WithSampledInput(T5ForConditionalGeneration):
        """The story's model; --case compute-loss --fixed passes sampled_input, so that the
        read is made in the model's forward."""

        def forward(self, sampled_input=None, **inputs):
            out = super().forward(**inputs)
            if sampled_input is not None:
                b, l, c = sampled_input.shape
                sampled_input_embed = sampled_input.view(b * l, c).mm(self.shared.weight)
                out.loss = out.loss + 1e-3 * sampled_input_embed.pow(2).mean()
            return out

    return T5WithSampledInput


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=["stacks", "compute-loss"], required=True)
    p.add_argument("--fixed", action="store_true", help="run the fix ShardScope names")
    p.add_argument("--guard", choices=["warn", "error"], default="warn")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--snapshot-out", default="")
    p.add_argument("--listen", default=None)
    p.add_argument("--hold", type=float, default=0.0)
    p.add_argument("--no-agent", action="store_true")
    p.add_argument("--root-reshards", action="store_true",
                   help="fully_shard(model, reshard_after_forward=True): the root's group resharded "
                        "after its forward too (by default FSDP2 keeps the root's unsharded until backward)")
    a = p.parse_args()

    if not a.no_agent:
        shardscope.fsdp.install(snapshot_out=a.snapshot_out or None, guard=a.guard, listen=a.listen)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world, ))
    torch.manual_seed(0)
    read_in_forward = a.case == "compute-loss" and a.fixed
    model = t5_class()(t5_config(a.layers))
    for stack in (model.encoder, model.decoder):
        for block in stack.block:
            fully_shard(block, mesh=mesh)
    if a.case == "stacks" and a.fixed:
        fully_shard([model, model.encoder, model.decoder], mesh=mesh)  # ShardScope's fix
    else:
        if a.case == "stacks":  # story: each stack its own unit
            fully_shard(model.encoder, mesh=mesh)
            fully_shard(model.decoder, mesh=mesh)
        fully_shard(model, mesh=mesh, **({"reshard_after_forward": True} if a.root_reshards else {}))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    g = torch.Generator().manual_seed(rank)
    for step in range(a.steps):
        ids = torch.randint(2, VOCAB, (2, 8), generator=g)
        if read_in_forward:
            loss = model(input_ids=ids, labels=ids, sampled_input=sampled_inputs(ids)).loss
        else:
            loss = model(input_ids=ids, labels=ids).loss
        if a.case == "compute-loss" and not a.fixed:  # story 1, outside any forward
            sampled_input = sampled_inputs(ids)
            b, l, c = sampled_input.shape
            sampled_input_embed = sampled_input.view(b * l, c).mm(model.shared.weight)
            loss = loss + 1e-3 * sampled_input_embed.pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"rank {rank} step {step + 1} loss {loss.item():.4f}", flush=True)

    if a.hold:
        if rank == 0 and not a.no_agent:
            print(f"holding {a.hold}s; endpoint {shardscope.fsdp.agent().endpoint}", flush=True)
        time.sleep(a.hold)
    if not a.no_agent:
        shardscope.fsdp.finish()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    exit_rank(main())
