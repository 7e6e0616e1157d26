"""shardscope.fsdp's bad input, in one process (tst_fsdpagent's misuse case): each line the
user gets is a ShardScopeError that says what to do, and a refused install() patches nothing.
Prints "misuse ok" at the end; any other outcome raises."""
import contextlib
import io
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import shardscope
import shardscope.fsdp as sf
from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg


def expect(f, words):
    try:
        f()
    except shardscope.ShardScopeError as e:
        if words not in str(e):
            raise SystemExit(f"expected {words!r} in: {e}")
        print(f"refused: {e}", flush=True)
        return
    raise SystemExit(f"no ShardScopeError; expected one saying {words!r}")


dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
original = pg.FSDPParamGroup.__dict__["unshard"]

# A module fully_shard was never called on.
expect(lambda: sf.attach(nn.Linear(4, 4), listen=False), "is not sharded by FSDP2")
# The agent started twice: the second install() is refused, the first goes on.
expect(lambda: sf.install(listen=False), "already called")
assert sf.agent() is not None
sf.finish()
assert pg.FSDPParamGroup.__dict__["unshard"] is original, "finish() left FSDP patched"

# FSDP1 instead of FSDP2.
from torch.distributed.fsdp import FullyShardedDataParallel

fsdp1 = FullyShardedDataParallel(nn.Linear(4, 4), device_id=torch.device("cpu"))
expect(lambda: sf.attach(fsdp1, listen=False), "FSDP1 (FullyShardedDataParallel)")
sf.finish()

# The script ends and fully_shard never ran in this process (Accelerate's FSDP1 default, a
# CPU run Accelerate keeps out of FSDP): finish() says why the inspector has no model.
import contextlib
import io

said = io.StringIO()
with contextlib.redirect_stderr(said):
    sf.install(listen=False)
    sf.finish()
if "the script ended without fully_shard being called in this process" not in said.getvalue():
    raise SystemExit(f"finish() did not say that nothing was sharded: {said.getvalue()!r}")

# A torch whose FSDP2 lacks a method the agent observes: refused by name, nothing patched.
del pg.FSDPParamGroup.unshard
try:
    expect(lambda: sf.install(listen=False), "FSDPParamGroup.unshard does not exist")
finally:
    pg.FSDPParamGroup.unshard = original
assert sf.agent() is None
assert "_to_unsharded" in pg.FSDPParamGroup.__dict__ and \
    pg.FSDPParamGroup.__dict__["_to_unsharded"].__module__.startswith("torch"), "patched anyway"

# An unknown guard.
expect(lambda: sf.install(listen=False, guard="loud"), "guard='loud'")

# A user exception inside a step goes through unchanged, and the agent stays usable.
from torch.distributed.fsdp import fully_shard


class Boom(nn.Module):

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        raise KeyError("the user's own")


sf.install(listen=False)
m = Boom()
fully_shard(m)
try:
    m(torch.ones(2, 4))
except KeyError as e:
    assert e.args == ("the user's own", ), e
else:
    raise SystemExit("the user's exception was swallowed")
sf.finish()

# Steps leave torch's function-mode stack as they found it (the read watching is one mode
# between steps, none while paused or after finish, however many steps ran: autograd runs
# backward on a copy of that stack); the user's exception in backward passes unchanged; the
# one torch.Tensor.backward wrapper is torch's own again after finish().
from torch._C import _len_torch_function_stack


class Tiny(nn.Module):

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc2(self.fc1(x))


class FailingBackward(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise ValueError("the user's backward")


torch_backward = torch.Tensor.backward
torch_autograd_backward = torch.autograd.backward
from torch.distributed.fsdp._fully_shard import _fsdp_param_group as fpg


def native():
    """FSDP's group methods and foreach_reduce are the agent's native hooks (FsdpPath)."""
    return all(type(f).__module__ == "shardscope._native"
               for f in (fpg.FSDPParamGroup.__dict__["pre_forward"], fpg.foreach_reduce,
                         fpg.FSDPParamGroup.__dict__["_prefetch_unshard"].__func__))


torch_zero_grad = torch.optim.Optimizer.zero_grad
torch_load_state_dict = torch.optim.Optimizer.load_state_dict
torch_save = torch.save
torch_module_load = nn.Module.load_state_dict
sf.install(listen=False)
tiny = Tiny()
fully_shard(tiny.fc1)
fully_shard(tiny)
opt = torch.optim.Adam(tiny.parameters(), lr=1e-2)
for step in range(4):
    tiny(torch.ones(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()  # the read watching is off while it runs (its .grad reads), on after it
    assert _len_torch_function_stack() == 1, f"step {step}: {_len_torch_function_stack()} modes"
    assert all(p.grad is None for p in tiny.parameters()), "zero_grad did not run"
assert torch.optim.Optimizer.zero_grad is not torch_zero_grad, "zero_grad is not observed"
# A loaded optimizer state numbers the steps that follow (a resumed run); the user's own
# error in load_state_dict reaches them unchanged.
state = opt.state_dict()
for s in state["state"].values():
    s["step"] = torch.tensor(10.0)
opt.load_state_dict(state)
assert sf.agent().optimizer_steps == 10, sf.agent().optimizer_steps
try:
    opt.load_state_dict({"state": {}, "param_groups": []})
except ValueError as e:
    assert "parameter groups" in str(e), e
else:
    raise SystemExit("the mismatched optimizer state was accepted")
assert sf.agent().optimizer_steps == 10, sf.agent().optimizer_steps
# Checkpoints (docs/fsdp.md, "Checkpoints that lose data"), observed through wrappers that
# keep torch's names: at world 1 torch.save of the state dict loses nothing (no other rank
# holds a shard) and is not recorded; plain tensors given to load_state_dict for the DTensor
# shards are recorded and said once per line, and torch's own error reaches the script.
assert torch.save is not torch_save and torch.save.__wrapped__ is torch_save, "torch.save is not observed"
assert (torch.save.__name__, torch.save.__doc__) == (torch_save.__name__, torch_save.__doc__)
assert nn.Module.load_state_dict.__wrapped__ is torch_module_load, "load_state_dict is not observed"
assert nn.Module.load_state_dict.__qualname__ == "Module.load_state_dict"
said = io.StringIO()
with contextlib.redirect_stderr(said):
    torch.save(tiny.state_dict(), io.BytesIO())
    plain = {k: torch.zeros(v.shape) for k, v in tiny.state_dict().items()}
    for attempt in range(2):
        try:
            tiny.load_state_dict(plain, strict=False)
        except RuntimeError as e:
            assert "got mixed torch.Tensor and DTensor" in str(e), e
        else:
            raise SystemExit("plain tensors loaded into the DTensor shards without torch's error")
said = said.getvalue()
assert said.count("shardscope: rank 0: model.load_state_dict was given plain tensors of the "
                  "full shape for 4 parameters (`fc1.weight` first)") == 1, said
assert "\n  fix: set_model_state_dict(model, state_dict, options=StateDictOptions(" in said, said
assert "torch.save" not in said, said
assert "pre-forward" not in said, said  # torch's copy into the shards is the load's, not a read
assert native(), "FSDP's group methods are not observed natively"
sf.pause()
assert torch.save is torch_save, "paused, yet torch.save is wrapped"
assert nn.Module.load_state_dict is torch_module_load, "paused, yet Module.load_state_dict is wrapped"
assert not native(), "paused, yet FSDP's group methods are the agent's"
assert _len_torch_function_stack() == 0, "paused, yet a mode is left"
assert torch.optim.Optimizer.zero_grad is torch_zero_grad, "paused, yet zero_grad is wrapped"
assert torch.optim.Optimizer.load_state_dict is torch_load_state_dict, "paused, yet load_state_dict is wrapped"
sf.resume()
assert _len_torch_function_stack() == 1
assert torch.save.__wrapped__ is torch_save, "resumed, yet torch.save is not observed"
assert nn.Module.load_state_dict.__wrapped__ is torch_module_load, "resumed, yet load_state_dict is not observed"
assert native(), "resumed, yet FSDP's group methods are not observed"
try:
    FailingBackward.apply(tiny(torch.ones(2, 4))).sum().backward()
except ValueError as e:
    assert e.args == ("the user's backward", ), e
else:
    raise SystemExit("the user's exception in backward was swallowed")
assert _len_torch_function_stack() == 1, "the failed backward left the stack changed"
assert not sf.agent().unfinished_said, "a backward that failed before FSDP2's was reported"
# The same exception after FSDP2's root pre-backward (fc1's output goes through it), caught by
# the script, which goes on (a batch skipped after an out-of-memory error): FSDP2 never ends
# that backward and trains each rank's own copy from then on. The agent records it once
# (backward_unfinished) and says so, naming the exception, and the script's loop runs as
# without it.
skip = tiny.fc1.register_forward_hook(lambda module, args, out: FailingBackward.apply(out))
said = io.StringIO()
with contextlib.redirect_stderr(said):
    try:
        tiny(torch.ones(2, 4)).sum().backward()
    except ValueError as e:
        assert e.args == ("the user's backward", ), e
    else:
        raise SystemExit("the user's exception in backward was swallowed")
    skip.remove()
    for step in range(2):
        tiny(torch.ones(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
said = said.getvalue()
assert said.count("shardscope: rank 0: FSDP2's backward did not finish") == 1, said
assert "The backward raised ValueError: the user's backward" in said, said
assert "\n  fix: raise  # in the except around loss.backward()" in said, said
sf.finish()
assert _len_torch_function_stack() == 0, "finish() left a mode"
assert torch.Tensor.backward is torch_backward, "finish() left torch.Tensor.backward wrapped"
assert torch.autograd.backward is torch_autograd_backward, \
    "finish() left torch.autograd.backward wrapped"
assert torch.optim.Optimizer.zero_grad is torch_zero_grad, "finish() left zero_grad wrapped"
assert torch.optim.Optimizer.load_state_dict is torch_load_state_dict, "finish() left load_state_dict wrapped"
assert torch.save is torch_save, "finish() left torch.save wrapped"
assert nn.Module.load_state_dict is torch_module_load, "finish() left Module.load_state_dict wrapped"
assert "forward" not in type(tiny.fc1).__dict__, "finish() left the unit's forward wrapped"
assert not native() and fpg.FSDPParamGroup.pre_forward.__module__.startswith("torch"), \
    "finish() left FSDP's group methods replaced"
from torch.distributed.tensor import DTensor

assert DTensor.to_local.__module__.startswith("torch"), "finish() left DTensor.to_local wrapped"
dist.destroy_process_group()
print("misuse ok", flush=True)
sys.stderr.flush()
# Not through finalization, which a gloo worker dropping a backward's collective can abort
# (python/examples/rankexit.py says how).
os._exit(0)
