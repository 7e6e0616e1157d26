"""Both user stories on Hugging Face models under DeepSpeed ZeRO-3, with ShardScope attached.

    PYTHONPATH=build/python DS_ACCELERATOR=cpu LOCAL_SIZE=2 \\
        scripts/launch -n 2 .venv/bin/python python/examples/hf_stories.py --case t5-compute-loss
    shardscope --attach job:...   # or shardscope-capture --list, while it runs

The models are built from small configs (nothing is downloaded); the only ShardScope line is
the install() at the top of main(), as a user adds it to their own script.

  --case t5-compute-loss  story 1 as its user wrote it: a Trainer (deepspeed= a ZeRO-3 config)
                          whose compute_loss override multiplies differentiable one-hot inputs
                          by model.module.shared.weight, outside any forward. DeepSpeed fails
                          ("mat2 must be a matrix"), after ShardScope recorded the read with the
                          fix: the read needs the gradient, so it belongs in the model's forward,
                          registered there (--fixed does exactly that). --externals manual adds
                          the story's own attempt (register_external_parameter in __init__),
                          which does not help a read outside forward: it is still recorded.
  --case t5-forward       the same read inside the model's forward (a T5ForConditionalGeneration
                          subclass), through the same Trainer: DeepSpeed registers shared.weight
                          on the model silently, and ShardScope records that with the fix line
                          (--externals manual, or --fixed, registers it in __init__: clean).
  --case wav2vec2         story 2 on Wav2Vec2Model with plain deepspeed.initialize.
                          --setup hf: built the way Transformers builds under ZeRO-3
                          (HfDeepSpeedConfig, then from_config inside zero.Init): Transformers'
                          own workaround, weight_g/weight_v (parametrizations.weight.original0/1)
                          created late and registered: clean, the late parameters adopted.
                          --setup zero-init: the model built inside deepspeed.zero.Init without
                          HfDeepSpeedConfig, so Transformers takes its plain weight_norm path on
                          a conv zero.Init already partitioned: the IndexError reaches the user
                          unchanged, the read is in the snapshot first.

--loop accelerate (T5 cases): the same model and loss in a loop of the user's own with Accelerate
(a ZeRO-3 DeepSpeedPlugin, accelerator.prepare, accelerator.backward); --accelerate-cpu adds
Accelerator(cpu=True), under which Accelerate leaves DeepSpeed out (the agent says so at the end).

--activation-checkpointing (T5 cases): TrainingArguments(activation_checkpointing=True), each
block's forward run again in backward; the same record.

Common: --guard error (ShardScope raises at the first unregistered access, with the fix),
--steps, --snapshot-out FILE ({rank} becomes the rank), --hold S, --no-agent, --layers N (T5
depth). For bench/bench_deepspeed_agent.py (T5 cases): --timing FILE, --toggle K, --profile
FILE, as python/examples/deepspeed_stories.py has them, and --log-every N.
"""
import argparse
import gc
import os
import tempfile
import time

import torch

import shardscope.deepspeed
from hold import add_hold_arguments, hold
from rankexit import exit_rank
from steplabels import METHOD_HELP, METHODS, toggle_step
from t5story import VOCAB, sampled_inputs, t5_config


def ds_config(world, batch, stage=3):
    return {"train_batch_size": batch * world,
            "train_micro_batch_size_per_gpu": batch,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
            "zero_allow_untested_optimizer": True,
            "zero_force_ds_cpu_optimizer": False}


def t5_model_class(case, externals):
    from transformers import T5ForConditionalGeneration

    class T5WithSampledInput(T5ForConditionalGeneration):
        """The story's model: the embedding matrix also multiplies the sampled inputs."""

        def __init__(self, config):
            super().__init__(config)
            if externals == "manual":  # the story's registration, as its user wrote it
                import deepspeed
                deepspeed.zero.register_external_parameter(self, self.shared.weight)

        def forward(self, sampled_input=None, **inputs):
            out = super().forward(**inputs)
            if sampled_input is not None:  # --case t5-forward: the read inside forward
                b, l, c = sampled_input.shape
                sampled_input_embed = sampled_input.view(b * l, c).mm(self.shared.weight)
                out.loss = out.loss + 1e-3 * sampled_input_embed.pow(2).mean()
            return out

    return T5WithSampledInput


def story_loss(case, model, inputs):
    """The loss of a T5 case, as the story's compute_loss has it (model: the DeepSpeed engine
    the Trainer or Accelerate made). Returns (loss, outputs)."""
    inputs = dict(inputs)
    if case == "t5-forward":
        inputs["sampled_input"] = sampled_inputs(inputs["input_ids"])
    outputs = model(**inputs)
    loss = outputs.loss
    if case == "t5-compute-loss":  # story 1, outside any forward
        sampled_input = sampled_inputs(inputs["input_ids"])
        b, l, c = sampled_input.shape
        sampled_input_embed = sampled_input.view(b * l, c).mm(model.module.shared.weight)
        loss = loss + 1e-3 * sampled_input_embed.pow(2).mean()
    return loss, outputs


def make_trainer_class(case):
    from transformers import Trainer

    class StoryTrainer(Trainer):

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss, outputs = story_loss(case, model, inputs)
            return (loss, outputs) if return_outputs else loss

    return StoryTrainer


class StoryData(torch.utils.data.Dataset):

    def __init__(self, n, length=8, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(2, VOCAB, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i].flip(0)}


class StepPrinter:
    """Each step's loss on stdout, as deepspeed_stories.py prints it (the tests read it)."""

    def __init__(self, rank):
        self.rank = rank

    def callback(self):
        from transformers import TrainerCallback

        rank = self.rank

        class Printer(TrainerCallback):

            def on_log(self, args, state, control, logs=None, **kw):
                if logs and "loss" in logs:
                    print(f"rank {rank} step {state.global_step} loss {logs['loss']:.4f}", flush=True)

        return Printer()


def timing_callback(args, rank):
    """--timing and --toggle: each step's wall seconds, this thread's CPU seconds, the
    process's CPU seconds and whether the agent observed it (1/0), as deepspeed_stories.py
    writes them; the agent paused and resumed between steps in blocks of K."""
    from transformers import TrainerCallback

    class Timing(TrainerCallback):

        def __init__(self):
            self.rows = []
            self.began = None
            self.observed = True

        def on_step_begin(self, targs, state, control, **kw):
            self.observed = not args.no_agent
            if args.toggle and not args.no_agent:
                self.observed = toggle_step(state.global_step, args.toggle, args.toggle_method,
                                            shardscope.deepspeed)
            self.began = (time.perf_counter(), time.thread_time(), time.process_time())

        def on_step_end(self, targs, state, control, **kw):
            w, c, p = self.began
            self.rows.append((time.perf_counter() - w, time.thread_time() - c,
                              time.process_time() - p, int(self.observed)))

        def on_train_end(self, targs, state, control, **kw):
            if args.timing:
                with open(args.timing.replace("{rank}", str(rank)), "w") as f:
                    f.write("".join(f"{w:.9f} {c:.9f} {p:.9f} {o}\n" for w, c, p, o in self.rows))

    return Timing()


def run_t5(args, rank, world):
    from transformers import TrainingArguments

    fixed_forward = args.fixed and args.case == "t5-compute-loss"
    case = "t5-forward" if fixed_forward else args.case
    externals = "manual" if args.fixed else args.externals
    cls = t5_model_class(case, externals)
    if args.loop == "accelerate":
        return run_t5_accelerate(args, rank, world, case, cls)
    with tempfile.TemporaryDirectory() as out:
        # TrainingArguments(deepspeed=...) keeps an HfDeepSpeedConfig alive: from_config then
        # builds the model inside zero.Init, as Transformers does under ZeRO-3.
        targs = TrainingArguments(output_dir=out, per_device_train_batch_size=2,
                                  max_steps=args.steps, logging_steps=args.log_every,
                                  save_strategy="no",
                                  report_to=[], deepspeed=ds_config(world, 2), use_cpu=True,
                                  dataloader_num_workers=0, disable_tqdm=True,
                                  learning_rate=1e-3, remove_unused_columns=False,
                                  activation_checkpointing=args.activation_checkpointing)
        torch.manual_seed(0)
        model = cls._from_config(t5_config(args.layers))
        trainer = make_trainer_class(case)(
            model=model, args=targs, train_dataset=StoryData(max(64, 2 * args.steps) * world),
            callbacks=[StepPrinter(rank).callback(), timing_callback(args, rank)])
        profiler = None
        if args.profile and rank == 0:
            import cProfile
            profiler = cProfile.Profile()
            profiler.enable()
        trainer.train()
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        hold(args)


def run_t5_accelerate(args, rank, world, case, cls):
    """--loop accelerate: the same model and loss in a training loop of the user's own with
    Accelerate (an Accelerator with a ZeRO-3 DeepSpeedPlugin: the model built inside zero.Init
    by its HfDeepSpeedConfig, accelerator.prepare, accelerator.backward, optimizer.step)."""
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(hf_ds_config=ds_config(world, 2), zero3_init_flag=True)
    # Not cpu=True: Accelerate would then ignore the plugin and run DDP (the agent says so at
    # the end); DS_ACCELERATOR=cpu is what puts DeepSpeed on the CPU.
    accelerator = Accelerator(deepspeed_plugin=plugin, cpu=args.accelerate_cpu)
    torch.manual_seed(0)
    model = cls._from_config(t5_config(args.layers))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.DataLoader(StoryData(max(64, 2 * args.steps) * world), batch_size=2)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    batches = iter(data)
    for step in range(args.steps):
        loss, _ = story_loss(case, model, next(batches))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        print(f"rank {rank} step {step + 1} loss {loss.item():.4f}", flush=True)
    hold(args)


def run_wav2vec2(args, rank, world):
    import deepspeed
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    cfg = Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2),
                         conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                         num_conv_pos_embedding_groups=4, mask_time_prob=0.0)
    config = ds_config(world, 2)
    torch.manual_seed(0)
    if args.setup == "hf":
        from transformers.integrations import HfDeepSpeedConfig
        keep = HfDeepSpeedConfig(config)  # noqa: F841 (must stay alive while the model is built)
        model = Wav2Vec2Model._from_config(cfg)
    else:
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = Wav2Vec2Model(cfg)
    engine, *_ = deepspeed.initialize(model=model, config=config,
                                      optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3))
    g = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        audio = torch.randn(2, 400, generator=g)
        hidden = engine(audio).last_hidden_state
        loss = hidden.pow(2).mean()
        engine.backward(loss)
        engine.step()
        print(f"rank {rank} step {step + 1} loss {loss.item():.4f}", flush=True)
    hold(args)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", choices=["t5-compute-loss", "t5-forward", "wav2vec2"],
                        required=True)
    parser.add_argument("--externals", choices=["none", "manual"], default="none")
    parser.add_argument("--fixed", action="store_true", help="the fix ShardScope names")
    parser.add_argument("--setup", choices=["hf", "zero-init"], default="hf")
    parser.add_argument("--guard", choices=["warn", "error"], default="warn")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--loop", choices=["trainer", "accelerate"], default="trainer",
                        help="T5 cases: a Trainer (deepspeed= a ZeRO-3 config), or the user's own "
                             "loop with Accelerate (a ZeRO-3 DeepSpeedPlugin)")
    parser.add_argument("--accelerate-cpu", action="store_true",
                        help="--loop accelerate: Accelerator(cpu=True), which leaves DeepSpeed out")
    parser.add_argument("--activation-checkpointing", action="store_true",
                        help="TrainingArguments(activation_checkpointing=True): each T5 block's "
                             "forward run again in backward")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--listen", default=None)
    parser.add_argument("--snapshot-out", default="")
    add_hold_arguments(parser)
    parser.add_argument("--no-agent", action="store_true")
    parser.add_argument("--timing", default="")
    parser.add_argument("--toggle", type=int, default=0, metavar="K")
    parser.add_argument("--toggle-method", choices=METHODS, default="switch", help=METHOD_HELP)
    parser.add_argument("--profile", default="")
    parser.add_argument("--log-every", type=int, default=1, metavar="N",
                        help="the Trainer's logging_steps (a loss line every N steps)")
    args = parser.parse_args()

    model_name = {"wav2vec2": "Wav2Vec2Model"}.get(args.case, "T5ForConditionalGeneration")
    if not args.no_agent:  # the agent's lines, before anything builds the model
        shardscope.deepspeed.install(listen=args.listen, guard=args.guard,
                                     snapshot_out=args.snapshot_out or None, model_name=model_name)
    import deepspeed
    gc.freeze()  # as deepspeed_stories.py does: the import-time heap out of DeepSpeed's collections
    deepspeed.init_distributed("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    try:
        (run_wav2vec2 if args.case == "wav2vec2" else run_t5)(args, rank, world)
    finally:
        shardscope.deepspeed.finish()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    exit_rank(main())
