"""FSDP2's stories on real `fully_shard` ranks, with ShardScope attached (one process per rank).

    PYTHONPATH=build/python .venv/bin/torchrun --nproc-per-node 2 python/examples/fsdp_stories.py
    shardscope --attach job:...   # or shardscope-capture --list, while it runs

A tiny language model on CPU over gloo (`init_device_mesh("cpu", (world,))`): `embed`
(nn.Embedding), `blocks` (each its own FSDP unit), `head` (nn.Linear), and the root unit.
Each case below is a bug as users hit it; `--fixed` runs the line ShardScope's fix names:

  --read-outside [grad|no-grad]  the training loop reads model.blocks[-1].fc1.weight (its
                        unit resharded after forward) outside any FSDP unit's forward: torch
                        fails with "got mixed torch.Tensor and DTensor" (recorded first). Fixed:
                        no-grad reads model.blocks[1].fc1.weight.full_tensor(); grad moves the
                        read into model.blocks[1].forward
  --call-forward        model.forward(x) instead of model(x): the root's pre-forward all-gather
                        is skipped (recorded, then torch's mixed-tensor error). Fixed: model(x)
  --call-block-forward  the model's forward calls self.blocks[1].forward(x) instead of
                        self.blocks[1](x): that unit's pre-forward all-gather is skipped inside
                        the root's forward (recorded, then torch's mixed-tensor error). Fixed:
                        self.blocks[1](x)
  --to-local            the training loop logs model.blocks[-1].fc1.weight.to_local().norm()
                        under torch.no_grad(): no error, silently this rank's shard only
                        (recorded). Fixed: .full_tensor().norm()
  --tied                embed.weight tied to head.weight, and fully_shard(embed) and
                        fully_shard(head) each called: torch raises ValueError at the first
                        forward (recorded first). Fixed: fully_shard([embed, head])
  --late                a LoRA adapter added to head after fully_shard: plain, unsharded on
                        every rank (recorded as late). Fixed: the adapter added before fully_shard
  --parents-first       fully_shard on each block and each layer inside it, in a loop over
                        model.modules() (a block before its layers: parents first), on
                        fully_shard's default mesh: torch fails in the first layer's fully_shard
                        with "TypeError: Invariant encountered: value was None when it should not
                        be" (recorded first). Fixed: the loop over reversed(list(model.modules()))
  --explicit-unshard    model.blocks[0].unshard() before the forward (an explicit unshard),
                        and forward prefetching between the blocks
  --guard error         ShardScope raises at the first sharded read, with the fix line

--checkpoint reentrant|non-reentrant runs each block through torch.utils.checkpoint (activation
checkpointing, as Transformers calls a layer): its forward again in backward.

--save-at S [S ...] --save-dir DIR saves a checkpoint after each step S into DIR/HOW for each
HOW of --save-how (dcp, the default: torch's
distributed checkpoint of get_state_dict(model, optimizer), each rank its shards; full: the
gathered model state dict, full_state_dict and cpu_offload, torch.save'd by rank 0; local:
each rank torch.save's its own shards, state_dict() values' to_local(); state-dict: each rank
torch.save's model.state_dict() as it is, DTensors of its own shards, the pitfall ShardScope
records), and training goes on; each file written is read back and said ("rank R saved HOW
FILE: N tensors, D DTensors, numel H of G"); --resume DIR loads the dcp checkpoint into the
sharded model and optimizer before the first step (--resume-how full: the full file into the
model's shards, broadcast from rank 0, as a pretrained model is loaded, then "rank R loaded
full: K of N tensors equal to the file"; load-state-dict: the full file given to
model.load_state_dict, the pitfall: torch raises; several are run in order; --first-step S
numbers the steps from S). Neither dcp, full nor local is a read by the user.

--compile blocks|model (torch.compile each block before fully_shard, or the model after it;
--fullgraph, --compile-loss, --compile-backend eager|inductor) prints "rank R dynamo: N graph
breaks, M graphs" at the end: the same with and without the agent. --compiled-autograd runs
backward under torch's compiled autograd: torch 2.13 then drops FSDP2's end-of-backward callback
without an error (each rank trains its own copy from then on), and the agent records it
(backward_unfinished) as the backward returns.

Also --hsdp R (HSDP: R replicas, each sharded over world/R ranks), --snapshot-out F.rank{rank}.json, --describe F.rank{rank}.json (describe()'s FSDP view),
--hold SECONDS (stay up for a client after training), --steps N, --layers N. Every rank prints
"rank R step S loss L" (S from 1). For the tests: --wait-before-train FILE (a client attaches
before the first step), --kill-rank R with --kill-at-step S (rank R is killed inside
blocks[0]'s forward of step S).
"""
import argparse
import contextlib
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import shardscope.fsdp
from rankexit import exit_rank
from steplabels import METHOD_HELP, METHODS, toggle_step


class Block(nn.Module):

    def __init__(self, hidden):
        super().__init__()
        self.fc1 = nn.Linear(hidden, 2 * hidden)
        self.fc2 = nn.Linear(2 * hidden, hidden)

        self.read_in_forward = None  # --read-outside grad --fixed: the read, moved here

    def forward(self, x):
        x = x + self.fc2(F.gelu(self.fc1(x)))
        if self.read_in_forward is not None:
            x = x + self.read_in_forward.mm(self.fc1.weight.t()).mean()
        return x


class TinyLM(nn.Module):

    def __init__(self, vocab, hidden, layers, tied, block_forward=False, checkpoint=""):
        super().__init__()
        self.checkpoint = checkpoint  # --checkpoint: each block's activations recomputed in backward
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(layers))
        self.head = nn.Linear(hidden, vocab, bias=False)
        if tied:
            self.head.weight = self.embed.weight
        self.block_forward = block_forward  # --call-block-forward

    def forward(self, tokens):
        x = self.embed(tokens)
        for i, b in enumerate(self.blocks):
            if self.block_forward and i == 1:
                x = self.blocks[1].forward(x)  # story: block forward
            elif self.checkpoint:  # as Transformers' gradient checkpointing calls a layer
                x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=self.checkpoint == "reentrant")
            else:
                x = b(x)
        return self.head(x)


def die(module, inputs):
    """--kill-rank: a second for the agent's server to send what came before (a client of a
    rank that dies holds what was sent), then SIGKILL, in the middle of the step."""
    time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)


def report_file(how, path):
    """One line per file a save wrote, read back as a user would (torch.load, weights_only: this
    process imported torch.distributed.tensor, which DTensors need): its tensors, how many are
    DTensors, and the numel the file holds (a DTensor's: this rank's shard, to_local()) of the
    tensors' global numel."""
    from torch.distributed.tensor import DTensor
    state = torch.load(path, weights_only=True)
    tensors = [v for v in state.values() if isinstance(v, torch.Tensor)]
    held = sum(v.to_local().numel() if isinstance(v, DTensor) else v.numel() for v in tensors)
    print(f"rank {dist.get_rank()} saved {how} {os.path.basename(path)}: {len(tensors)} tensors, "
          f"{sum(isinstance(v, DTensor) for v in tensors)} DTensors, numel {held} of "
          f"{sum(v.numel() for v in tensors)}", flush=True)


def report_dcp(directory):
    """report_file's line for a distributed checkpoint, from its metadata: the model's tensors,
    the numel of every rank's chunks of them (what the directory holds) of their global numel."""
    import math

    import torch.distributed.checkpoint as dcp
    meta = dcp.FileSystemReader(directory).read_metadata().state_dict_metadata
    model = [m for k, m in meta.items() if k.startswith("model.") and hasattr(m, "chunks")]
    held = sum(math.prod(c.sizes) for m in model for c in m.chunks)
    print(f"rank {dist.get_rank()} saved dcp .metadata: {len(model)} tensors, 0 DTensors, numel "
          f"{held} of {sum(math.prod(m.size) for m in model)}", flush=True)


def save_checkpoint(model, opt, directory, how):
    """--save-at: as users save an FSDP2 run in the middle of training (every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_state_dict)
    if how == "dcp":
        import torch.distributed.checkpoint as dcp
        model_state, optim_state = get_state_dict(model, opt)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=directory)
        if dist.get_rank() == 0:  # the coordinator: the metadata is written when it returns
            report_dcp(directory)
    elif how == "state-dict":  # the pitfall: each rank's file holds its own DTensor shards
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"rank{dist.get_rank()}.pt")
        torch.save(model.state_dict(), path)  # story: torch.save state_dict
        report_file(how, path)
    elif how == "local":
        os.makedirs(directory, exist_ok=True)
        state = {k: v.to_local() for k, v in model.state_dict().items()}
        torch.save(state, os.path.join(directory, f"rank{dist.get_rank()}.pt"))
        print(f"rank {dist.get_rank()} saved local embed.weight {tuple(state['embed.weight'].shape)}", flush=True)
    else:
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dist.get_rank() == 0:
            os.makedirs(directory, exist_ok=True)
            torch.save(state, os.path.join(directory, "model.pt"))
            print(f"rank 0 saved full embed.weight {tuple(state['embed.weight'].shape)}", flush=True)
            report_file(how, os.path.join(directory, "model.pt"))
        dist.barrier()


def load_checkpoint(model, opt, directory, how):
    """--resume: a --save-how dcp checkpoint into the sharded model and its optimizer, or
    (how="full") a --save-how full file into the model's shards, or (how="load-state-dict") the
    same file given to model.load_state_dict: torch cannot copy its plain tensors into the
    DTensor shards and raises."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                         set_model_state_dict, set_state_dict)
    path = os.path.join(directory, "model.pt")
    if how == "full":
        full = torch.load(path) if dist.get_rank() == 0 else {}
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True,
                                                                   broadcast_from_rank0=True))
        # every rank: the file's tensors against the model's, gathered (full_tensor())
        file = torch.load(path)
        loaded = model.state_dict()
        same = sum(torch.equal(loaded[k].full_tensor(), v) for k, v in file.items())
        print(f"rank {dist.get_rank()} loaded full: {same} of {len(file)} tensors equal to the "
              f"file", flush=True)
        return
    if how == "load-state-dict":  # the pitfall: plain full tensors into the DTensor shards
        model.load_state_dict(torch.load(path))  # story: load_state_dict
        return
    model_state, optim_state = get_state_dict(model, opt)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=directory)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


class LoRA(nn.Module):

    def __init__(self, hidden, vocab, rank=2):
        super().__init__()
        self.a = nn.Linear(hidden, rank, bias=False)
        self.b = nn.Linear(rank, vocab, bias=False)

    def forward(self, x):
        return self.b(self.a(x))


def with_lora(head, hidden, vocab):
    head.lora = LoRA(hidden, vocab)
    plain = head.forward

    def forward(x):
        return plain(x) + head.lora(x)

    head.forward = forward


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--read-outside", nargs="?", const="grad", choices=["grad", "no-grad"])
    p.add_argument("--call-forward", action="store_true")
    p.add_argument("--call-block-forward", action="store_true")
    p.add_argument("--to-local", action="store_true")
    p.add_argument("--tied", action="store_true")
    p.add_argument("--late", action="store_true")
    p.add_argument("--parents-first", action="store_true")
    p.add_argument("--explicit-unshard", action="store_true")
    p.add_argument("--autograd-backward", action="store_true",
                   help="torch.autograd.backward(loss) instead of loss.backward()")
    p.add_argument("--fixed", action="store_true", help="run the fix ShardScope names")
    p.add_argument("--guard", choices=["warn", "error"], default="warn")
    p.add_argument("--attach", action="store_true", help="attach(model) after fully_shard instead of install() before")
    p.add_argument("--hsdp", type=int, default=0, metavar="R",
                   help="HSDP: a (replicate=R, shard=world/R) mesh instead of one dimension")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--vocab", type=int, default=33)  # odd: dim 0 padded to the world size
    p.add_argument("--listen", default=None)
    p.add_argument("--snapshot-out", default="")
    p.add_argument("--describe", default="", help="describe()'s JSON after training; {rank} is the rank")
    p.add_argument("--hold", type=float, default=0.0)
    p.add_argument("--no-agent", action="store_true")
    p.add_argument("--toggle", type=int, default=0, metavar="K",
                   help="pause/resume the agent every K steps, in pairs (bench/bench_fsdp_agent.py); "
                        "with --no-agent the same labels, nothing toggled")
    p.add_argument("--toggle-method", choices=METHODS, default="switch", help=METHOD_HELP)
    p.add_argument("--timing", default="", help="per-step times (JSON lines); {rank} is the rank")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: one GPU per rank (LOCAL_RANK) over nccl")
    p.add_argument("--wait-before-train", default="", metavar="FILE",
                   help="wait for FILE to exist before the first step (a client attaches first)")
    p.add_argument("--kill-rank", type=int, default=-1,
                   help="this rank kills itself (SIGKILL) inside blocks[0]'s forward of --kill-at-step")
    p.add_argument("--kill-at-step", type=int, default=0)
    p.add_argument("--profile", default="", help="cProfile rank 0's training loop into this file")
    p.add_argument("--compile", choices=["none", "blocks", "model"], default="none",
                   help="torch.compile each block before fully_shard (blocks, as torchtitan does) "
                        "or the whole model after it (model)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile's backend (eager: dynamo only)")
    p.add_argument("--fullgraph", action="store_true", help="torch.compile(fullgraph=True)")
    p.add_argument("--checkpoint", choices=["reentrant", "non-reentrant"], default="",
                   help="activation checkpointing: each block through torch.utils.checkpoint, "
                        "its forward run again in backward")
    p.add_argument("--compiled-autograd", action="store_true",
                   help="backward under torch's compiled autograd (torch._dynamo.compiled_autograd, "
                        "compiled with --compile-backend)")
    p.add_argument("--compile-loss", action="store_true",
                   help="the loss function compiled too (as torchtitan does), outside the model's forward")
    p.add_argument("--save-at", type=int, nargs="+", default=[], metavar="S",
                   help="save a checkpoint after each step S")
    p.add_argument("--save-dir", default="", metavar="DIR")
    p.add_argument("--save-how", choices=["dcp", "full", "local", "state-dict"], nargs="+", default=["dcp"],
                   help="one or more; each into DIR/HOW (state-dict: torch.save(model.state_dict()) "
                        "on each rank, the pitfall)")
    p.add_argument("--resume", default="", metavar="DIR", help="load a checkpoint of --save-how dcp or full first")
    p.add_argument("--resume-how", choices=["dcp", "full", "load-state-dict"], nargs="+", default=["dcp"],
                   help="one or more, in order. full: the model's weights only, rank 0's file "
                        "broadcast into the shards (set_model_state_dict, full_state_dict and "
                        "broadcast_from_rank0), as a pretrained model is loaded; the optimizer "
                        "starts afresh. load-state-dict: that file given to model.load_state_dict "
                        "on every rank, the pitfall (torch raises)")
    p.add_argument("--first-step", type=int, default=1, metavar="S", help="the number of the first step")
    # Issue 51: one rank takes another path (the others wait in a collective it never issues:
    # on GPUs the job hangs until NCCL's timeout). extra-forward: rank R evaluates one more
    # batch after step S; extra-batch: rank R gets one more batch at the end; raise: rank R
    # raises at step S; slow: rank R sleeps --diverge-seconds before step S (not stuck).
    p.add_argument("--diverge", choices=["extra-forward", "extra-batch", "raise", "slow"], default=None)
    p.add_argument("--diverge-rank", type=int, default=0, metavar="R")
    p.add_argument("--diverge-step", type=int, default=0, metavar="S",
                   help="the step after (or at) which the rank diverges (default: the last)")
    p.add_argument("--diverge-seconds", type=float, default=1.0, metavar="T")
    a = p.parse_args()
    diverge_step = a.diverge_step or a.steps

    if a.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(a.device, torch.cuda.current_device()) if a.device == "cuda" else torch.device("cpu")
    if a.hsdp:  # HSDP: replicas of a sharded model
        if a.hsdp < 1 or world % a.hsdp:
            sys.exit(f"--hsdp {a.hsdp}: the world size {world} is not a multiple of it")
        mesh = init_device_mesh(a.device, (a.hsdp, world // a.hsdp), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(a.device, (world, ), mesh_dim_names=("dp", ))
    options = dict(snapshot_out=a.snapshot_out or None, guard=a.guard,
                   listen=a.listen if a.listen else None)
    if not a.no_agent and not a.attach:
        shardscope.fsdp.install(**options)

    torch.manual_seed(0)
    model = TinyLM(a.vocab, a.hidden, a.layers, tied=a.tied,
                   block_forward=a.call_block_forward and not a.fixed, checkpoint=a.checkpoint).to(device)
    if a.late and a.fixed:
        with_lora(model.head, a.hidden, a.vocab)  # before fully_shard: sharded with head
    if a.parents_first:  # blocks and their layers; --fixed: children first, as fully_shard expects
        # The story on fully_shard's default mesh (no dimension names), as a loop without
        # mesh= gets it, where torch fails in fully_shard itself; the fix on the run's mesh.
        unit_mesh = mesh if a.fixed else init_device_mesh(a.device, (world, ))
        modules = list(model.modules())
        for m in reversed(modules) if a.fixed else modules:
            if isinstance(m, Block) or (isinstance(m, nn.Linear) and m is not model.head):
                fully_shard(m, mesh=unit_mesh)  # story: parents first
    for b in model.blocks:
        if a.compile == "blocks":
            b.compile(backend=a.compile_backend, fullgraph=a.fullgraph)
        if not a.parents_first:
            fully_shard(b, mesh=mesh)
    if a.tied and a.fixed:
        fully_shard([model.embed, model.head], mesh=mesh)
    elif a.tied:
        fully_shard(model.embed, mesh=mesh)
        fully_shard(model.head, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if a.late and not a.fixed:
        with_lora(model.head, a.hidden, a.vocab)  # after fully_shard: late, never sharded
    if a.explicit_unshard:
        model.blocks[0].set_modules_to_forward_prefetch([model.blocks[1]] if a.layers > 1 else [])
    if not a.no_agent and a.attach:
        shardscope.fsdp.attach(model, **options)
    if a.compile == "model":
        model.compile(backend=a.compile_backend, fullgraph=a.fullgraph)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    for how in a.resume_how if a.resume else ():
        load_checkpoint(model, opt, a.resume, how)
    loss_fn = F.cross_entropy
    if a.compile_loss:
        loss_fn = torch.compile(F.cross_entropy, backend=a.compile_backend, fullgraph=a.fullgraph)
    gen = torch.Generator().manual_seed(1 + rank)
    for _ in range(a.first_step - 1):  # a resumed run draws the batches the first run drew
        torch.randint(0, a.vocab, (4, 8), generator=gen)
    timings = []
    while a.wait_before_train and not os.path.exists(a.wait_before_train):
        time.sleep(0.05)
    profiler = None
    if a.profile and rank == 0:
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    for step in range(a.steps):
        if rank == a.kill_rank and step + 1 == a.kill_at_step:
            model.blocks[0].register_forward_pre_hook(die)
        observed = True
        if a.toggle:  # without the agent: the same labels, nothing toggled
            observed = toggle_step(step, a.toggle, a.toggle_method,
                                   None if a.no_agent else shardscope.fsdp)
        diverging = rank == a.diverge_rank and step + 1 == diverge_step
        if a.diverge == "slow" and diverging:
            time.sleep(a.diverge_seconds)  # the others wait for it in the first all-gather
        if a.diverge == "raise" and diverging:
            raise RuntimeError(f"rank {rank} failed at step {step + 1} (--diverge raise)")
        t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        tokens = torch.randint(0, a.vocab, (4, 8), generator=gen).to(device)
        if a.explicit_unshard:
            model.blocks[0].unshard()
        if a.read_outside == "grad" and a.fixed:
            model.blocks[-1].read_in_forward = torch.randn(2, a.hidden, generator=gen).to(device)
        logits = model.forward(tokens) if a.call_forward and not a.fixed else model(tokens)
        loss = loss_fn(logits.view(-1, a.vocab), tokens.view(-1))
        if a.to_local:
            with torch.no_grad():
                w = model.blocks[-1].fc1.weight
                _norm = w.full_tensor().norm() if a.fixed else w.to_local().norm()  # story: to_local
        if a.read_outside and not (a.read_outside == "grad" and a.fixed):
            sampled = torch.randn(2, a.hidden, generator=gen).to(device)
            if a.read_outside == "no-grad":
                with torch.no_grad():
                    w = model.blocks[-1].fc1.weight
                    w = w.full_tensor() if a.fixed else w
                    extra = sampled.mm(w.t()).mean()
            else:
                extra = sampled.mm(model.blocks[-1].fc1.weight.t()).mean()  # story: fails here
                loss = loss + extra
        with contextlib.ExitStack() as backward:
            if a.compiled_autograd:
                from torch._dynamo import compiled_autograd
                backward.enter_context(compiled_autograd._enable(
                    torch.compile(backend=a.compile_backend, fullgraph=a.fullgraph)))
            if a.autograd_backward:
                torch.autograd.backward(loss)
            else:
                loss.backward()  # story: the backward
        opt.step()
        opt.zero_grad()
        timings.append({"step": step, "observed": observed, "wall": time.perf_counter() - t0,
                        "thread_cpu": time.thread_time() - c0, "process_cpu": time.process_time() - p0})
        if a.steps <= 20:
            print(f"rank {rank} step {a.first_step + step} loss {loss.item():.4f}", flush=True)
        if a.first_step + step in a.save_at:
            for how in a.save_how:
                save_checkpoint(model, opt, os.path.join(a.save_dir, how), how)
        if a.diverge == "extra-forward" and diverging:
            with torch.no_grad():  # rank 0 evaluates one more batch
                model(torch.randint(0, a.vocab, (4, 8), generator=gen).to(device))
    if a.diverge == "extra-batch" and rank == a.diverge_rank:  # one more batch at the epoch's end
        tokens = torch.randint(0, a.vocab, (4, 8), generator=gen).to(device)
        loss_fn(model(tokens).view(-1, a.vocab), tokens.view(-1)).backward()
        opt.step()
        opt.zero_grad()
    if a.diverge:
        dist.barrier()  # as a script does before it saves: every rank meets here
        print(f"rank {rank} reached the end", flush=True)

    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(a.profile)
    if a.timing:
        with open(a.timing.replace("{rank}", str(rank)), "w") as f:
            for t in timings:
                f.write(json.dumps(t) + "\n")
    if a.compile != "none" or a.compile_loss:
        from torch._dynamo.utils import counters
        print(f"rank {rank} dynamo: {sum(counters['graph_break'].values())} graph breaks, "
              f"{counters['stats']['unique_graphs']} graphs", flush=True)
    if a.describe and not a.no_agent:
        with open(a.describe.replace("{rank}", str(rank)), "w") as f:
            json.dump(shardscope.fsdp.describe(), f, indent=1)
    if a.hold:
        if rank == 0:
            print(f"holding {a.hold}s; endpoint {shardscope.fsdp.agent().endpoint}", flush=True)
        time.sleep(a.hold)
    shardscope.fsdp.finish()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    exit_rank(main())
