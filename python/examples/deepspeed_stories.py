"""Both user stories on real DeepSpeed ZeRO-3, with ShardScope attached (one process per rank).

    PYTHONPATH=build/python DS_ACCELERATOR=cpu LOCAL_SIZE=2 .venv/bin/torchrun --nproc-per-node 2 python/examples/deepspeed_stories.py
    shardscope --attach job:...   # or shardscope-capture --list, while it runs

A tiny language model: `embed` (nn.Embedding), a positional Conv1d with weight_norm
(`pos_conv`, wav2vec2's shape), `fc`, and `lm_head`, which computes the logits from
`embed.weight` (a tied embedding read by another module). Mirrors shardscope-train:

  --externals none      story 1 as users hit it: DeepSpeed registers embed.weight on lm_head
                        silently inside the engine's forward (recorded, with the fix line)
  --externals manual    the fix: deepspeed.zero.register_external_parameter(lm_head, embed.weight)
  --weight-norm unsafe  story 2: weight_norm applied to a conv zero.Init already partitioned:
                        IndexError while the model is built (recorded first)
  --weight-norm workaround  the story's workaround (GatheredParameters(modifier_rank=0), then
                        register weight_g/weight_v): weight_g/weight_v are late, then adopted
  --read-outside        story 1's training loop reads model.embed.weight outside any forward
                        (DeepSpeed: "mat2 must be a matrix"; recorded first), for its gradient:
                        the fix moves the read into the model's forward, registered there;
                        --read-outside no-grad reads it under torch.no_grad(): the fix gathers it
  --guard error         ShardScope raises at the first unregistered access, with the fix line

What DeepSpeed changed since 0.14.5 in the calls the agent observes: --leaf
(set_z3_leaf_modules on PositionalConv), --plain-backward (loss.backward(), DeepSpeed >= 0.18.3),
--nested-gathered (overlapping nested GatheredParameters, which DeepSpeed >= 0.19.4 rejects),
--compile eager|inductor (engine.compile(): torch.compile of the model; with --deepcompile,
DeepSpeed's DeepCompile, which needs a GPU; with --compiled-autograd,
engine.compile(compiled_autograd_enabled=True), DeepSpeed >= 0.18.3, which fails in DeepSpeed's
ZeRO-3 with and without the agent alike; compare DeepSpeed issue #6719).

Checkpoints, as users save and resume a run: --save-at S --save-dir DIR --save-how checkpoint
16bit saves after step S into DIR/checkpoint (engine.save_checkpoint) and DIR/16bit
(engine.save_16bit_model: every parameter gathered, rank 0 writes), and training goes on;
--resume DIR/checkpoint loads it (engine.load_checkpoint) before the first step, --first-step
S numbering the steps from S. The checkpoint pitfalls (docs/deepspeed.md, "Checkpoints"):
--save-how state-dict (torch.save(model.state_dict()): ZeRO-3's placeholders, saved empty;
gathered: the same inside GatheredParameters, whole), --load-full FILE (a full state dict
loaded into the partitioned model; --load-full-how gathered: inside GatheredParameters with
modifier_rank=0; no-modifier: inside GatheredParameters without it, the load discarded), and --resume at another world size than the save's.

--no-zero-init builds the model without zero.Init, as DeepSpeed's getting-started guide does:
deepspeed.initialize partitions it whole (no parameter is late).

For the tests: --wait-before-build (a client attaches before the model exists), --kill-rank
with --kill-at-step (a rank lost mid-step), --own-mode (the script's own torch function mode),
--raise-in-backward S (step S's backward raises inside the pass; the loop skips the batch, and
DeepSpeed fails at the next backward or step: the agent records backward_unfinished at the
first).
"""
import argparse
import contextlib
import gc
import os
import signal
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import deepspeed
import shardscope.deepspeed
from hold import add_hold_arguments, hold
from rankexit import exit_rank
from steplabels import METHOD_HELP, METHODS, toggle_step

# deepspeed.initialize runs a full gc.collect() at each of its memory reports; over the heap of
# what DeepSpeed imported (0.16 imports dynamo and Transformers eagerly) they add seconds to
# each rank's start. Frozen, the import-time heap is left out of every collection
# (docs/deepspeed.md, Example and tests).
gc.freeze()


class Head(nn.Module):
    """Logits from the embedding matrix of another module (tied weights)."""

    def __init__(self, embed):
        super().__init__()
        object.__setattr__(self, "embed", embed)  # a reference, not a child

    def forward(self, x):
        return F.linear(x, self.embed.weight)


class PositionalConv(nn.Module):
    """wav2vec2's positional convolution: a Conv1d under weight_norm (story 2)."""

    def __init__(self, hidden, kernel, weight_norm):
        super().__init__()
        self.conv = nn.Conv1d(hidden, hidden, kernel, padding=kernel - 1)
        if weight_norm == "unsafe":
            self.conv = nn.utils.weight_norm(self.conv, name="weight", dim=2)
        elif weight_norm == "workaround":
            with deepspeed.zero.GatheredParameters(self.conv.weight, modifier_rank=0):
                self.conv = nn.utils.weight_norm(self.conv, name="weight", dim=2)
            deepspeed.zero.register_external_parameter(self, self.conv.weight_v)
            deepspeed.zero.register_external_parameter(self, self.conv.weight_g)
        self.kernel = kernel

    def forward(self, x):  # causal: position t sees t-kernel+1 .. t
        return F.gelu(self.conv(x.transpose(1, 2))[:, :, :x.shape[1]].transpose(1, 2))


class TinyLM(nn.Module):

    def __init__(self, vocab, hidden, externals, weight_norm):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.pos_conv = PositionalConv(hidden, 4, weight_norm)
        self.fc = nn.Linear(hidden, hidden)
        self.lm_head = Head(self.embed)
        if externals == "manual":
            deepspeed.zero.register_external_parameter(self.lm_head, self.embed.weight)

    def forward(self, ids):
        x = self.embed(ids)
        x = x + self.pos_conv(x)
        return self.lm_head(torch.tanh(self.fc(x)))


class FailsInBackward(torch.autograd.Function):
    """--raise-in-backward: the identity, whose backward raises (a user's op that runs out of
    memory in backward)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("out of memory in a user's backward (--raise-in-backward)")


def fail_in_backward(module, inputs):
    """A forward pre-hook on fc: its input goes through FailsInBackward, so the backward pass
    raises after fc's gradients are in, before pos_conv's and embed's."""
    return (FailsInBackward.apply(inputs[0]),)


def die(module, inputs):
    """--kill-rank: a second for the agent's server to send what came before (a client of a
    rank that dies holds what was sent), then SIGKILL, in the middle of the step."""
    time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)


class CountingMode(torch.overrides.TorchFunctionMode):
    """The script's own torch function mode (a user's profiler, say)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def forward_in_own_mode(engine, ids):
    held = engine.module.embed.weight  # the Parameter object, outside forward: legal
    with CountingMode() as mine:
        logits = engine(ids)
        before = mine.calls
        torch.ones(1).add(1)
        if mine.calls == before:
            raise RuntimeError("own mode: no longer active after the forward")
    if torch._C._len_torch_function_stack() != 0:
        raise RuntimeError("own mode: a torch function mode stayed on the stack")
    print(f"own mode: active throughout ({mine.calls} calls), stack empty after; held "
          f"{tuple(held.ds_shape)}", flush=True)
    return logits


def diverge(how, engine, vocab, g, device):
    """After its step, one rank takes another path (--diverge), as scripts do by accident."""
    if how == "extra-forward":  # rank 0 evaluates one more batch
        with torch.no_grad():
            engine(torch.randint(0, vocab, (4, 8), generator=g).to(device))
    elif how == "gathered":  # rank 0 looks at a weight, as initialize_weights_zero3 does
        with deepspeed.zero.GatheredParameters([engine.module.fc.weight]):
            print(f"fc.weight norm {engine.module.fc.weight.norm().item():.4f}", flush=True)


def extra_batch(engine, vocab, g, device):
    """One more micro-batch on this rank at the end of the epoch (a sampler without drop_last)."""
    ids = torch.randint(0, vocab, (4, 8), generator=g).to(device)
    logits = engine(ids)
    engine.backward(F.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1)))
    engine.step()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--externals", choices=["none", "manual"], default="none")
    parser.add_argument("--weight-norm", choices=["off", "unsafe", "workaround"], default="workaround")
    parser.add_argument("--read-outside", nargs="?", const="grad", choices=["grad", "no-grad"])
    parser.add_argument("--call-module", action="store_true",
                        help="call engine.module(ids) instead of engine(ids) (outside DeepSpeed's forward)")
    parser.add_argument("--guard", choices=["warn", "error"], default="warn")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--listen", default=None, help="unix:PATH or tcp:HOST:PORT (default: private socket)")
    parser.add_argument("--snapshot-out", default="", help="snapshot file; {rank} becomes the rank")
    parser.add_argument("--no-agent", action="store_true", help="run without ShardScope")
    add_hold_arguments(parser)
    parser.add_argument("--timing", default="",
                        help="write each step's wall seconds, this thread's CPU seconds, the process's "
                        "CPU seconds and whether the agent observed it (1/0) to this file ({rank})")
    parser.add_argument("--toggle", type=int, default=0, metavar="K",
                        help="pause and resume the agent every K steps (what it costs, within one run)")
    parser.add_argument("--toggle-method", choices=METHODS, default="switch", help=METHOD_HELP)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--grad-accum", type=int, default=1, metavar="K",
                        help="gradient_accumulation_steps: K micro-batches (forward, backward, "
                             "engine.step()) per optimizer step; engine.backward gets loss= by name")
    parser.add_argument("--profile", default="", help="cProfile rank 0's training loop into this file")
    parser.add_argument("--wait-before-build", default="", metavar="PATH",
                        help="wait until PATH exists before building the model")
    parser.add_argument("--kill-rank", type=int, default=-1,
                        help="this rank kills itself (SIGKILL) inside fc's forward of --kill-at-step, "
                        "a second after it began")
    parser.add_argument("--kill-at-step", type=int, default=0)
    parser.add_argument("--no-zero-init", action="store_true",
                        help="build the model without zero.Init (DeepSpeed's getting-started "
                             "pattern): deepspeed.initialize partitions it")
    parser.add_argument("--fail-build-rank", type=int, default=-1,
                        help="this rank raises while its model is built (inside zero.Init)")
    parser.add_argument("--raise-in-backward", type=int, default=0, metavar="S",
                        help="step S's backward raises (RuntimeError, inside the pass, after fc's "
                        "gradients): the loop catches it and skips the batch, as after an "
                        "out-of-memory error; DeepSpeed fails at the next step's backward or step")
    parser.add_argument("--plain-backward", action="store_true",
                        help="loss.backward() instead of engine.backward(loss) (DeepSpeed >= 0.18.3)")
    parser.add_argument("--leaf", action="store_true",
                        help="deepspeed.utils.set_z3_leaf_modules(model, [PositionalConv]): pos_conv "
                        "gathers its conv's parameters itself, the conv has no scope of its own")
    parser.add_argument("--nested-gathered", action="store_true",
                        help="after the last step, GatheredParameters(fc.weight) nested in "
                        "GatheredParameters([fc.weight, fc.bias]) (DeepSpeed >= 0.19.4 raises)")
    parser.add_argument("--own-mode", action="store_true",
                        help="the last step holds model.embed.weight outside forward (legal), then "
                        "runs its forward under the script's own torch function mode, which must "
                        "stay active throughout")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: one GPU per rank (LOCAL_RANK) over nccl, with DS_ACCELERATOR=cuda")
    parser.add_argument("--hpz", type=int, default=0, metavar="N",
                        help="ZeRO++ hierarchical partitioning (zero_hpz_partition_size N; run on "
                        "a multiple of N ranks); prints each parameter's partitions as DeepSpeed "
                        "holds them after deepspeed.initialize")
    parser.add_argument("--compile", choices=["eager", "inductor"], default=None,
                        help="engine.compile(backend=...) after deepspeed.initialize: the model "
                        "run by torch.compile, DeepSpeed's ZeRO-3 hooks outside its graphs")
    parser.add_argument("--compiled-autograd", action="store_true",
                        help="with --compile: engine.compile(compiled_autograd_enabled=True), "
                        "engine.backward then runs under torch's compiled autograd (ZeRO-3 fails "
                        "there, with or without the agent)")
    parser.add_argument("--deepcompile", action="store_true",
                        help="with --compile: DeepSpeed's DeepCompile (\"compile\": "
                        "{\"deepcompile\": true}), which needs a GPU (its native op has no CPU "
                        "build: on CPU engine.compile raises DeepSpeed's own error)")
    parser.add_argument("--save-at", type=int, default=0, metavar="S", help="save a checkpoint after step S")
    parser.add_argument("--save-dir", default="", metavar="DIR")
    parser.add_argument("--save-how", choices=["checkpoint", "16bit", "state-dict", "gathered"],
                        nargs="+", default=["checkpoint"],
                        help="one or more, each into DIR/HOW: engine.save_checkpoint (ZeRO's "
                             "partitioned checkpoint), engine.save_16bit_model (the gathered "
                             "weights, rank 0 writes), torch.save(model.state_dict()) (ZeRO-3's "
                             "placeholders: the pitfall) or the same inside GatheredParameters "
                             "(rank 0 writes)")
    parser.add_argument("--load-full", default="", metavar="FILE",
                        help="model.load_state_dict(torch.load(FILE)) before the first step: a "
                             "full state dict loaded into the partitioned model (the pitfall)")
    parser.add_argument("--load-full-how", choices=["plain", "gathered", "no-modifier"], nargs="+",
                        default=["plain"],
                        help="one or more, in order: model.load_state_dict(full) (the pitfall: "
                             "torch raises), the same inside GatheredParameters(modifier_rank=0) "
                             "(the fix) or inside GatheredParameters without modifier_rank (the "
                             "load is discarded at the scope's exit)")
    parser.add_argument("--resume", default="", metavar="DIR",
                        help="engine.load_checkpoint(DIR) before the first step")
    parser.add_argument("--first-step", type=int, default=1, metavar="S", help="the number of the first step")
    # Issue 51: one rank takes another path (every other rank waits in a collective it never
    # issues: on GPUs the job hangs until NCCL's timeout). extra-forward: rank R evaluates one
    # more batch after step S; extra-batch: rank R gets one more micro-batch at the end;
    # gathered: GatheredParameters on rank R only after step S; raise: rank R raises at step S;
    # slow: rank R sleeps --diverge-seconds before step S's forward (a straggler, not stuck).
    parser.add_argument("--diverge", choices=["extra-forward", "extra-batch", "gathered", "raise", "slow"],
                        default=None)
    parser.add_argument("--diverge-rank", type=int, default=0, metavar="R")
    parser.add_argument("--diverge-step", type=int, default=0, metavar="S",
                        help="the step after (or at) which the rank diverges (default: the last)")
    parser.add_argument("--diverge-seconds", type=float, default=1.0, metavar="T")
    args = parser.parse_args()
    diverge_step = args.diverge_step or args.steps

    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not args.no_agent:
        shardscope.deepspeed.install(listen=args.listen, guard=args.guard,
                                     snapshot_out=args.snapshot_out or None, model_name="TinyLM")
    deepspeed.init_distributed("nccl" if args.device == "cuda" else "gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    vocab, hidden = 37, args.hidden
    times = []
    config = {"train_batch_size": 4 * world * args.grad_accum,
              "gradient_accumulation_steps": args.grad_accum,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
              "zero_allow_untested_optimizer": True}
    if args.hpz:
        config["zero_optimization"]["zero_hpz_partition_size"] = args.hpz
    if args.deepcompile:
        config["compile"] = {"deepcompile": True}
    if args.save_at and "16bit" in args.save_how:
        config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    torch.manual_seed(0)
    try:
        waited = time.monotonic()
        while args.wait_before_build and not os.path.exists(args.wait_before_build):
            if time.monotonic() - waited > 120:
                raise SystemExit(f"gave up waiting for {args.wait_before_build}")
            time.sleep(0.05)
        # --no-zero-init: built whole on every rank, partitioned by deepspeed.initialize
        building = (contextlib.nullcontext() if args.no_zero_init else
                    deepspeed.zero.Init(config_dict_or_path=config))
        with building:
            model = TinyLM(vocab, hidden, args.externals, args.weight_norm)
            if rank == args.fail_build_rank:
                raise RuntimeError(f"rank {rank} cannot build its model (--fail-build-rank)")
        if args.leaf:
            from deepspeed.utils import set_z3_leaf_modules
            set_z3_leaf_modules(model, [PositionalConv])
        engine, *_ = deepspeed.initialize(model=model, config=config,
                                          optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2))
        if not args.no_agent:
            shardscope.deepspeed.attach(engine)  # deepspeed.initialize did it already; harmless
        if args.compile:
            # compiled_autograd_enabled: DeepSpeed >= 0.18.3 only
            engine.compile(backend=args.compile,
                           **({"compiled_autograd_enabled": True} if args.compiled_autograd else {}))
        if args.hpz:  # what each rank holds: its partition, and hpZ's secondary one
            # (made by initialize's first gather, freed by each optimizer step)
            for name, p in engine.module.named_parameters():
                sec = getattr(p, "ds_secondary_tensor", None)
                print(f"rank {rank} partition {name} {p.ds_tensor.ds_numel} "
                      f"{getattr(p, 'ds_zero_partition_world_size', world)} "
                      f"{sec.ds_numel if sec is not None else 0}", flush=True)
        if args.resume:
            engine.load_checkpoint(args.resume)
        if args.load_full:
            full = torch.load(args.load_full)
            for how in args.load_full_how:
                if how == "gathered":
                    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
                        model.load_state_dict(full)
                elif how == "no-modifier":
                    with deepspeed.zero.GatheredParameters(list(model.parameters())):
                        model.load_state_dict(full)  # discarded at the exit: no modifier_rank
                else:
                    model.load_state_dict(full)  # ZeRO-3's placeholders: torch raises
                with deepspeed.zero.GatheredParameters([model.embed.weight]):
                    print(f"rank {rank} loaded {how} embed.weight sum "
                          f"{model.embed.weight.sum().item():.4f} "
                          f"(file {full['embed.weight'].float().sum().item():.4f})", flush=True)
        g = torch.Generator().manual_seed(rank)
        for _ in range(args.first_step - 1):  # a resumed run draws the batches the first run drew
            for _micro in range(args.grad_accum):
                torch.randint(0, vocab, (4, 8), generator=g)
        profiler = None
        if args.profile and rank == 0:
            import cProfile
            profiler = cProfile.Profile()
            profiler.enable()
        for step in range(args.steps):
            observed = True
            if args.toggle and not args.no_agent:
                observed = toggle_step(step, args.toggle, args.toggle_method, shardscope.deepspeed)
            if rank == args.kill_rank and step + 1 == args.kill_at_step:
                engine.module.fc.register_forward_pre_hook(die)
            failing = None
            if step + 1 == args.raise_in_backward:
                failing = engine.module.fc.register_forward_pre_hook(fail_in_backward)
            if args.diverge == "slow" and rank == args.diverge_rank and step + 1 == diverge_step:
                time.sleep(args.diverge_seconds)  # the others wait for it in the first gather
            if args.diverge == "raise" and rank == args.diverge_rank and step + 1 == diverge_step:
                raise RuntimeError(f"rank {rank} failed at step {step + 1} (--diverge raise)")
            began, cpu, process_cpu = time.perf_counter(), time.thread_time(), time.process_time()
            skipped = False
            for _micro in range(args.grad_accum):
                ids = torch.randint(0, vocab, (4, 8), generator=g).to(device)
                if args.own_mode and step + 1 == args.steps:
                    logits = forward_in_own_mode(engine, ids)
                else:
                    logits = engine.module(ids) if args.call_module else engine(ids)
                loss = F.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1))
                try:
                    if args.plain_backward:
                        loss.backward()
                    elif args.grad_accum > 1:
                        engine.backward(loss=loss)
                    else:
                        engine.backward(loss)
                except RuntimeError as e:
                    if failing is None:
                        raise
                    failing.remove()
                    print(f"rank {rank} step {args.first_step + step} skipped: {e}", flush=True)
                    skipped = True
                    break  # the batch skipped, as a loop does after an out-of-memory error
                engine.step()  # steps the optimizer on the last micro-batch only
            if skipped:
                continue
            times.append((time.perf_counter() - began, time.thread_time() - cpu,
                          time.process_time() - process_cpu, int(observed and not args.no_agent)))
            if args.read_outside:  # story 1: the embedding read in the training loop
                probe = torch.ones(2, vocab, device=device)
                with torch.set_grad_enabled(args.read_outside == "grad"):
                    probe.mm(engine.module.embed.weight)
            print(f"rank {rank} step {args.first_step + step} loss {loss.item():.4f}"
                  f"{'' if observed else ' (agent paused)'}", flush=True)
            if rank == args.diverge_rank and step + 1 == diverge_step:
                diverge(args.diverge, engine, vocab, g, device)
            if args.save_at and args.first_step + step == args.save_at:  # as users save mid-run
                for how in args.save_how:
                    where = os.path.join(args.save_dir, how)
                    if how == "16bit":
                        engine.save_16bit_model(where)
                        if rank == 0:
                            saved = torch.load(os.path.join(where, "pytorch_model.bin"))
                            print(f"rank 0 saved 16bit embed.weight {tuple(saved['embed.weight'].shape)}",
                                  flush=True)
                    elif how in ("state-dict", "gathered"):
                        os.makedirs(where, exist_ok=True)
                        path = os.path.join(where, f"model.rank{rank}.pt")
                        if how == "state-dict":
                            torch.save(model.state_dict(), path)  # every rank: what each holds
                        else:
                            with deepspeed.zero.GatheredParameters(list(model.parameters())):
                                torch.save(model.state_dict(), path)
                        saved = torch.load(path)
                        empty = sum(1 for t in saved.values() if t.numel() == 0)
                        print(f"rank {rank} saved {how}: {len(saved)} tensors, {empty} empty, "
                              f"embed.weight {tuple(saved['embed.weight'].shape)}", flush=True)
                    else:
                        engine.save_checkpoint(where)
        if args.diverge == "extra-batch" and rank == args.diverge_rank:
            extra_batch(engine, vocab, g, device)
        if args.diverge:
            # as a script does before it saves: every rank meets here (the one that took
            # another path is still in a collective the others never issue)
            torch.distributed.barrier()
            print(f"rank {rank} reached the end", flush=True)
        if args.compile:  # what dynamo made of the model: the same with and without the agent
            from torch._dynamo.utils import counters
            print(f"rank {rank} dynamo: {sum(counters['graph_break'].values())} graph breaks, "
                  f"{counters['stats']['unique_graphs']} graphs", flush=True)
        if args.nested_gathered:  # the user's exception, unchanged, after the agent saw it
            fc = engine.module.fc
            with deepspeed.zero.GatheredParameters([fc.weight, fc.bias]):
                with deepspeed.zero.GatheredParameters([fc.weight]):
                    print(f"rank {rank} nested gather: {tuple(fc.weight.shape)}", flush=True)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        if args.timing:
            with open(args.timing.replace("{rank}", str(rank)), "w") as f:
                f.write("".join(f"{w:.9f} {c:.9f} {p:.9f} {o}\n" for w, c, p, o in times))
        hold(args)
    finally:
        shardscope.deepspeed.finish()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    exit_rank(main())
