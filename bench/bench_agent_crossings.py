"""What one crossing between DeepSpeed's Python and the DeepSpeed agent's hot path costs, alone:
a `ds_status` read and write through the agent's descriptor on torch.nn.Parameter against a
plain instance attribute, and `ZeROOrderedDict.__getitem__` through the agent's native hook
against DeepSpeed's own (the Python function install() puts on the class: the hook, or
DeepSpeed's own while dynamo traces), and what binding a scope hook as an instancemethod costs
against the bare native hook (the "DeepSpeed alone" column of that row is the bare hook); and
what recording adds (issue #55): a scope hook call with its enter or exit event against the
same Python function called as DeepSpeed's method, and a published parameter's status change
with its fetch or release event against a plain attribute store. Each is timed in the same process, alternately, best of --repeats
(the interpreter's own noise is a few ns); the counts per step are those of the T5 step of
bench_deepspeed_agent.py (docs/performance.md, section 10), so that the product says what the
crossings can cost a step at most.

    .venv/bin/python bench/bench_agent_crossings.py --build build

Run it with the project environment's Python (scripts/deps), the one build/python's native
module is built for. Nothing is distributed and no engine is made: the agent's HotPath is
created on a native Agent that does not listen, as shardscope.deepspeed creates it.
"""
import argparse
import ctypes
import os
import platform
import sys
import time

# (per T5 step, counted with a counting build of the hot path: docs/performance.md section 10)
PER_STEP = {"ds_status read": 3262, "ds_status write": 524, "ZeROOrderedDict.__getitem__": 287,
            "a scope hook's binding": 1085,
            # recorded (issue #55): a scope hook call with its enter or exit event (the binding
            # included: the total counts it once) and a published parameter's status change
            # (its fetch or release event; ~130 fetch/release triples a step: ~390 changes)
            "a scope hook call recorded (enter or exit)": 1085,
            "a published status change (its event)": 390}


def per_op(fn, n):
    t = time.perf_counter()
    fn(n)
    return (time.perf_counter() - t) / (n * 10) * 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--n", type=int, default=200000, help="loop iterations (10 ops each)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--step-ms", type=float, default=77.0,
                        help="the T5 step's training-thread time, to put the sum in proportion")
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(args.build, "python"))
    import torch
    from deepspeed.runtime.zero.parameter_offload import ZeROOrderedDict
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from shardscope import _dsinternals as _ds
    from shardscope import _native

    class Observer:  # HotPath keeps a weak reference; nothing here calls it
        pass

    observer = Observer()
    agent = _native.Agent(model="crossings", rank=0, world_size=1, backend="gloo", listen=False)
    hot = _native.HotPath(agent, observer, *_ds.status_members(), _ds.native_names())
    available = ZeroParamStatus.AVAILABLE

    p = torch.nn.Parameter(torch.zeros(4))
    p.ds_status = available
    p.ds_id = 1  # not published: a write is stored and looked up, no event (the common cost)
    module = torch.nn.Linear(2, 2)
    params = ZeROOrderedDict(parent_module=module)
    params["w"] = p
    module._parameters = params

    def reads(n):
        for _ in range(n):
            p.ds_status; p.ds_status; p.ds_status; p.ds_status; p.ds_status  # noqa: E702
            p.ds_status; p.ds_status; p.ds_status; p.ds_status; p.ds_status  # noqa: E702

    def writes(n):
        s = available
        for _ in range(n):
            p.ds_status = s; p.ds_status = s; p.ds_status = s; p.ds_status = s  # noqa: E702
            p.ds_status = s; p.ds_status = s; p.ds_status = s; p.ds_status = s  # noqa: E702
            p.ds_status = s; p.ds_status = s  # noqa: E702

    def getitems(n):
        d = params
        for _ in range(n):
            d["w"]; d["w"]; d["w"]; d["w"]; d["w"]; d["w"]; d["w"]; d["w"]; d["w"]; d["w"]  # noqa: E702

    descriptor = hot.status_descriptor()
    original = ZeROOrderedDict.__getitem__
    hook = hot.getitem_hook(original, lambda self, key, param: original(self, key))
    installed = _ds.observed_getitem(original, hook)  # as install() puts it on the class

    # A scope hook is an instancemethod on DeepSpeed's class (dynamo binds it at run time); the
    # native hook alone binds without a bound method. The same hook both ways, as a method of
    # the parameters' container: what the binding costs each of DeepSpeed's scope calls.
    im = ctypes.pythonapi.PyInstanceMethod_New
    im.restype, im.argtypes = ctypes.py_object, [ctypes.py_object]

    class Container(ZeROOrderedDict):
        direct = hook
        bound = im(hook)

    box = Container(parent_module=module)
    box["w"] = p

    def direct_calls(n):
        for _ in range(n):
            box.direct("w"); box.direct("w"); box.direct("w"); box.direct("w")  # noqa: E702
            box.direct("w"); box.direct("w"); box.direct("w"); box.direct("w")  # noqa: E702
            box.direct("w"); box.direct("w")  # noqa: E702

    def bound_calls(n):
        for _ in range(n):
            box.bound("w"); box.bound("w"); box.bound("w"); box.bound("w")  # noqa: E702
            box.bound("w"); box.bound("w"); box.bound("w"); box.bound("w")  # noqa: E702
            box.bound("w"); box.bound("w")  # noqa: E702

    # What recording costs (issue #55): a module scope through the two native scope hooks
    # (scope stack, enter and exit events, the memory sample's check) against the same two
    # Python functions called as DeepSpeed's methods, and a published parameter's status
    # changes (fetch/release events through AgentState) against plain attribute stores.
    inflight = _ds.status_members()[1]
    mid = agent.ensure_module("scoped", "Linear")
    scoped = torch.nn.Linear(2, 2)
    scoped._shardscope_id = mid
    observer.own_ds_ids = lambda module: [2]

    def pre(self, module):
        return None

    def post(self, module):
        return None

    phase = _native.PHASES["forward"]

    class Offload:
        pre_plain, post_plain = pre, post
        pre_hook = im(hot.scope_hook(pre, phase, True))
        post_hook = im(hot.scope_hook(post, phase, False))

    offload = Offload()

    def plain_scopes(n):
        o, m = offload, scoped
        for _ in range(n):
            o.pre_plain(m); o.post_plain(m); o.pre_plain(m); o.post_plain(m)  # noqa: E702
            o.pre_plain(m); o.post_plain(m); o.pre_plain(m); o.post_plain(m)  # noqa: E702
            o.pre_plain(m); o.post_plain(m)  # noqa: E702

    def hooked_scopes(n):
        o, m = offload, scoped
        for _ in range(n):
            o.pre_hook(m); o.post_hook(m); o.pre_hook(m); o.post_hook(m)  # noqa: E702
            o.pre_hook(m); o.post_hook(m); o.pre_hook(m); o.post_hook(m)  # noqa: E702
            o.pre_hook(m); o.post_hook(m)  # noqa: E702

    q = torch.nn.Parameter(torch.zeros(4))
    q.ds_status = available
    q.ds_id = 2
    hot.publish(2, 16, q)

    def changes(n):
        a, b = available, inflight
        for _ in range(n):
            q.ds_status = b; q.ds_status = a; q.ds_status = b; q.ds_status = a  # noqa: E702
            q.ds_status = b; q.ds_status = a; q.ds_status = b; q.ds_status = a  # noqa: E702
            q.ds_status = b; q.ds_status = a  # noqa: E702

    # name -> (the loop without the agent, the loop with it); set_observed changes the classes
    cases = (("ds_status read", reads, reads), ("ds_status write", writes, writes),
             ("ZeROOrderedDict.__getitem__", getitems, getitems),
             ("a scope hook's binding", direct_calls, bound_calls),
             ("a scope hook call recorded (enter or exit)", plain_scopes, hooked_scopes),
             ("a published status change (its event)", changes, changes))

    def set_observed(on):
        if on:
            torch.nn.Parameter.ds_status = descriptor
            ZeROOrderedDict.__getitem__ = installed
        else:
            if "ds_status" in torch.nn.Parameter.__dict__:
                del torch.nn.Parameter.ds_status
            ZeROOrderedDict.__getitem__ = original

    best = {(name, on): float("inf") for name, *_ in cases for on in (False, True)}
    for _ in range(args.repeats):
        for on in (False, True):
            set_observed(on)
            for name, *loops in cases:
                fn = loops[on]
                fn(args.n // 10)  # warm the specialisations after the class changed
                best[name, on] = min(best[name, on], per_op(fn, args.n))
    set_observed(False)

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), "unknown cpu")
    print(f"Machine: {cpu}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, "
          f"Python {platform.python_version()}, torch {torch.__version__}\n")
    print("| crossing | DeepSpeed alone | observed | difference | per T5 step | a step's µs |")
    print("|---|---|---|---|---|---|")
    total = 0.0
    for name, *_ in cases:
        off, on = best[name, False], best[name, True]
        us = (on - off) * PER_STEP[name] / 1e3
        if name != "a scope hook's binding":  # the recorded call includes it
            total += us
        print(f"| {name} | {off:.1f} ns | {on:.1f} ns | {on - off:+.1f} ns | {PER_STEP[name]} | "
              f"{us:+.1f} |")
    print(f"\nThese crossings together (the binding counted once, in the recorded call): "
          f"{total:+.1f} µs a step, "
          f"{total / (args.step_ms * 1e3) * 100:+.3f} % of a {args.step_ms:.0f} ms step.")


if __name__ == "__main__":
    main()
