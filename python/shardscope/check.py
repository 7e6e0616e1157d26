"""shardscope-check: find a model's ZeRO-3 bugs on a few CPU ranks before the GPU run.

    shardscope-check [options] train.py [script args]
    python -m shardscope.check [options] train.py [script args]

Runs the unchanged training script on N CPU ranks over gloo (DeepSpeed's CPU accelerator),
with the ShardScope agent installed before the script, for K optimizer steps, then prints
each distinct problem with the file and line to change and the line to paste. Exit status:
0 clean, 1 problems found, 2 could not run (the reason is printed). See docs/check.md.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import xml.sax.saxutils as xml

CLEAN, PROBLEMS, COULD_NOT_RUN = 0, 1, 2
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


class CouldNotRun(Exception):
    """Exit 2, with the reason."""


# ---------------------------------------------------------------------------- arguments
def _parser():
    p = argparse.ArgumentParser(
        prog="shardscope-check",
        description="Run a ZeRO-3 training script on CPU ranks for a few steps and report "
                    "its sharding bugs with the line of code to change (docs/check.md).",
        epilog="exit status: 0 clean, 1 problems found, 2 could not run")
    p.add_argument("-n", "--nproc", type=int, default=2, metavar="N",
                   help="CPU ranks (gloo), default 2")
    p.add_argument("--steps", type=int, default=3, metavar="K",
                   help="optimizer steps to run before stopping the script, default 3")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S",
                   help="give up after S seconds (exit 2), default 300")
    p.add_argument("--target-world", type=int, default=64, metavar="N",
                   help="world size of the real run, for the memory prediction, default 64")
    p.add_argument("--micro-batch", type=int, default=0, metavar="N",
                   help="DeepSpeed: N samples per rank (the config's train_micro_batch_size_per_gpu, "
                        "train_batch_size to match; a Trainer's per_device_train_batch_size); "
                        "default: the script's own")
    p.add_argument("--snapshot", default="shardscope-check.json", metavar="FILE",
                   help="the snapshot written (open it with `shardscope FILE`)")
    p.add_argument("--sarif", metavar="FILE", help="also write the problems as SARIF 2.1.0")
    p.add_argument("--junit", metavar="FILE", help="also write the problems as JUnit XML")
    p.add_argument("--backend", choices=["auto", "deepspeed", "fsdp"], default="auto",
                   help="the sharding library the script uses (default: detected)")
    p.add_argument("--keep", action="store_true", help="keep the ranks' files and logs")
    p.add_argument("script", help="the training script, run unchanged")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    return p


# ---------------------------------------------------------------------------- detection
_DEEPSPEED = re.compile(r"^\s*(import\s+deepspeed|from\s+deepspeed[\s.])|deepspeed\.initialize|"
                        r"[\"']deepspeed[\"']\s*:|deepspeed\s*=|--deepspeed", re.M)
_FSDP = re.compile(r"fully_shard\b|torch\.distributed\.fsdp|FullyShardedDataParallel")
_HF_DS = re.compile(r"\bTrainingArguments\b|\bHfDeepSpeedConfig\b|\bAccelerator\b")


def detect_backend(script):
    """'deepspeed' or 'fsdp' from the script's text (and the local modules it imports);
    raises CouldNotRun when neither is used."""
    try:
        text = open(script, encoding="utf-8", errors="replace").read()
    except OSError as e:
        raise CouldNotRun(f"cannot read the script {script}: {e.strerror}") from None
    texts = [text]
    here = os.path.dirname(os.path.abspath(script))
    for m in re.finditer(r"^\s*(?:from|import)\s+([A-Za-z_][\w]*)", text, re.M):
        local = os.path.join(here, m.group(1) + ".py")
        if os.path.isfile(local):
            texts.append(open(local, encoding="utf-8", errors="replace").read())
    joined = "\n".join(texts)
    ds, fsdp = bool(_DEEPSPEED.search(joined)), bool(_FSDP.search(joined))
    if fsdp and not ds:
        return "fsdp"
    if ds:
        return "deepspeed"
    if _HF_DS.search(joined):
        raise CouldNotRun(
            f"{script} uses Transformers/Accelerate but names no DeepSpeed config or FSDP; "
            f"say which with --backend deepspeed or --backend fsdp")
    raise CouldNotRun(
        f"no supported sharding backend found in {script}: it neither uses DeepSpeed "
        f"(import deepspeed, deepspeed.initialize, a \"deepspeed\" config) nor FSDP2 "
        f"(torch.distributed.fsdp.fully_shard); pass --backend if it does so indirectly")


def _check_backend_available(backend):
    import importlib.util

    if backend == "fsdp":
        # The ranks install it with install(listen=False, snapshot_out=...), as the
        # DeepSpeed agent (_checkboot._install_agent).
        if importlib.util.find_spec("shardscope.fsdp") is None:
            raise CouldNotRun(
                "the script uses FSDP2 (torch.distributed.fsdp.fully_shard), and this "
                "ShardScope has no FSDP agent (shardscope.fsdp is not importable); only "
                "DeepSpeed ZeRO-3 scripts can be checked with this build")
        return
    if importlib.util.find_spec("deepspeed") is None:
        raise CouldNotRun(f"the script uses DeepSpeed, which is not installed for "
                          f"{sys.executable} (pip install deepspeed)")


# ---------------------------------------------------------------------------- running
def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _progress(text, tty):
    if tty:
        sys.stderr.write("\r\033[K" + text)
    else:
        sys.stderr.write(text + "\n")
    sys.stderr.flush()


def run_ranks(args, workdir, backend):
    """Starts the ranks, shows their progress, stops them at the timeout. Returns
    (results per rank, logs per rank, timed_out)."""
    env = dict(os.environ)
    port = _free_port()
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update({
        "DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "WORLD_SIZE": str(args.nproc), "LOCAL_WORLD_SIZE": str(args.nproc), "GROUP_RANK": "0",
        "TORCHELASTIC_RUN_ID": f"shardscope-check-{os.getpid()}", "CUDA_VISIBLE_DEVICES": "",
        "SHARDSCOPE_CHECK": "1", "SHARDSCOPE_CHECK_DIR": workdir,
        "SHARDSCOPE_CHECK_STEPS": str(args.steps), "SHARDSCOPE_CHECK_BACKEND": backend,
        "SHARDSCOPE_CHECK_MICRO_BATCH": str(args.micro_batch or 0),
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
    })
    procs, logs = [], []
    for rank in range(args.nproc):
        e = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
        log = open(os.path.join(workdir, f"log.{rank}"), "w+b")
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "shardscope._checkboot", args.script, *args.args],
            env=e, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True))
    tty = sys.stderr.isatty()
    start = time.monotonic()
    last = ""
    timed_out = False
    while any(p.poll() is None for p in procs):
        elapsed = time.monotonic() - start
        if elapsed > args.timeout:
            timed_out = True
            break
        stages = []
        for rank in range(args.nproc):
            try:
                stages.append(open(os.path.join(workdir, f"status.{rank}")).read().split(" ", 1)[1].strip())
            except (OSError, IndexError):
                stages.append("starting python")
        stage = min(stages, key=_stage_order)
        # On a terminal one line, rewritten each second; in a log a line per stage.
        line = f"shardscope-check: {args.nproc} CPU ranks, {elapsed:4.0f} s: {stage}"
        if (line if tty else stage) != last:
            _progress(line, tty)
            last = line if tty else stage
        # A rank that failed leaves the others waiting in a collective: stop them soon.
        if any(p.poll() not in (None, 0) for p in procs):
            _wait_or_stop(procs, 5.0)
            break
        time.sleep(0.2)
    if timed_out:
        _wait_or_stop(procs, 0.0)
    else:
        _wait_or_stop(procs, 20.0)
    if tty:
        sys.stderr.write("\r\033[K")
    results = []
    for rank in range(args.nproc):
        try:
            results.append(json.load(open(os.path.join(workdir, f"result.{rank}.json"))))
        except (OSError, ValueError):
            results.append(None)
    texts = []
    for log in logs:
        log.seek(0)
        texts.append(log.read().decode("utf-8", "replace"))
        log.close()
    args.last_stage = last if not tty else last.split(": ", 2)[-1]
    return results, texts, timed_out, time.monotonic() - start


def _stage_order(stage):
    for i, prefix in enumerate(("starting", "importing torch", "importing deepspeed",
                                "importing torch.distributed.fsdp", "running", "step")):
        if stage.startswith(prefix):
            return (i, stage)
    return (9, stage)


def _wait_or_stop(procs, grace):
    deadline = time.monotonic() + grace
    for p in procs:
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0)):
        alive = [p for p in procs if p.poll() is None]
        if not alive:
            return
        for p in alive:
            try:
                os.killpg(p.pid, sig)  # the rank and anything it started
            except ProcessLookupError:
                pass
        end = time.monotonic() + wait
        for p in alive:
            while p.poll() is None and time.monotonic() < end:
                time.sleep(0.05)


# ---------------------------------------------------------------------------- the report
def merge(workdir, nproc):
    """The job's snapshot, merged from the ranks' files by the one merge (wire::mergeJobSnapshots,
    through the native module), and for each of its violation entries the ledger row it counts
    into (state::ViolationLedger): (text, doc, rows), or (None, None, []) without a file."""
    paths = [p for p in (os.path.join(workdir, f"rank{r}.json") for r in range(nproc))
             if os.path.exists(p)]
    if not paths:
        return None, None, []
    from . import _native
    text, rows = _native.merge_job_snapshots(paths, "shardscope-check")
    return text, json.loads(text), rows


def problems_of(doc, rows):
    """Distinct problems: the ledger's rows (one per kind, accessor, parameter, owner and
    source location), each with the ranks and steps of its entries."""
    problems = {}
    for v, row in zip(doc.get("violations", []) if doc else [], rows):
        loc = v.get("location") or {}
        p = problems.get(row)
        if p is None:
            p = problems[row] = {"kind": v["kind"], "accessor": v.get("accessor"),
                                 "param": v.get("param"), "owner": v.get("owner"),
                                 "location": loc, "building": v.get("building", ""),
                                 "fix": v.get("fix", ""), "message": v.get("message", ""),
                                 "action": v.get("action"), "ranks": set(), "first_step": None,
                                 "last_step": 0, "count": 0}
        p["ranks"].add(v["rank"])
        p["first_step"] = v["step"] if p["first_step"] is None else min(p["first_step"], v["step"])
        p["last_step"] = max(p["last_step"], v.get("last_step", v["step"]))
        p["count"] += v.get("count", 1)
    return [problems[row] for row in sorted(problems)]


def _bytes(p):
    return p["numel"] * _DTYPE_BYTES.get(p.get("dtype"), 4)


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def predict_peak(order, config, target_world):
    """Per-rank peak of gathered parameter memory at target_world, walking the modules in the
    order the first step ran them: at each module its own parameters are gathered, and the
    next modules' parameters are prefetched until prefetch_bucket_size elements; live gathered
    elements stay within max_live_parameters (never below the current module's own).
    Persistent parameters are whole on every rank all the time; every other parameter holds
    its 1/target_world shard."""
    bucket = int(config.get("prefetch_bucket_size", 0) or 0)
    max_live = int(config.get("max_live_parameters", 0) or 0) or (1 << 62)
    mods = []
    persistent_bytes = shard_bytes = 0
    for path, params in order:
        own = own_bytes = 0
        for numel, elsize, persistent in params:
            if persistent:
                persistent_bytes += numel * elsize
                continue
            own += numel
            own_bytes += numel * elsize
            shard_bytes += -(-numel // target_world) * elsize
        mods.append((path, own, own_bytes))
    peak, at = 0, ""
    for i, (path, own, own_bytes) in enumerate(mods):
        live, live_bytes = own, own_bytes
        prefetched = 0
        for _, n, b in mods[i + 1:]:
            if n == 0:
                continue
            if prefetched + n > bucket or live + n > max_live:
                break
            prefetched += n
            live += n
            live_bytes += b
        if live_bytes > peak:
            peak, at = live_bytes, path
    return {"gathered_peak_bytes": peak, "at_module": at, "persistent_bytes": persistent_bytes,
            "shard_bytes": shard_bytes, "total_bytes": peak + persistent_bytes + shard_bytes,
            "target_world": target_world, "modules": len(mods)}


def predict_fsdp_peak(record, late_bytes, target_world):
    """FSDP2: the per-rank peak of gathered parameter memory at target_world, replaying the
    units' forward as the first step ran it (record: _checkboot._record_units) and the
    backward as its reverse (a unit's forward end is its backward's start). A unit's
    parameters are gathered whole, dim 0 padded to a multiple of the world (FSDP2's shards);
    at a unit's forward start it is gathered with the unit it prefetches: its explicit
    set_modules_to_forward_prefetch list, else the next unit to begin forward (FSDP2 keeps the
    last all-gather's buffer until the next one is issued: one unit ahead); at its forward end
    it is resharded when reshard_after_forward (to its post-forward world when that is an
    int), else held until its backward ends (the root: FSDP does not reshard it after forward).
    At a unit's backward start it is gathered again with the unit it prefetches (explicit
    set_modules_to_backward_prefetch, else the next unit to begin backward, as FSDP2's
    post_forward_order does); at its backward end it is resharded. Every rank also holds every
    parameter's shard (ceil(dim 0 / world) rows, in the parameter's own dtype) and the late
    parameters whole."""
    units, events = record["units"], [tuple(e) for e in record["events"]]
    T = target_world

    def gathered(i):
        return sum(-(-rows // T) * T * row * g for rows, row, g, _ in units[i]["params"])

    def held_after_forward(i):
        w = units[i].get("post_forward_world")
        return sum(-(-rows // w) * row * g for rows, row, g, _ in units[i]["params"]) if w else 0

    shards = sum(-(-rows // T) * row * e for u in units for rows, row, _, e in u["params"])
    forward_order = [i for kind, i in events if kind == "pre"]
    backward_order = [i for kind, i in reversed(events) if kind == "post"]
    live = {}
    peak, at, phase = 0, "", ""

    def gather(i, prefetch, order, name):
        nonlocal peak, at, phase
        live[i] = gathered(i)
        if not prefetch:
            k = order.index(i) + 1
            prefetch = order[k:k + 1]
        for t in prefetch:
            live[t] = gathered(t)
        total = sum(live.values())
        if total > peak:
            peak, at, phase = total, units[i]["path"], name

    for kind, i in events:  # forward
        if kind == "pre":
            gather(i, units[i]["forward_prefetch"], forward_order, "forward")
        elif units[i]["reshard_after_forward"]:
            live[i] = held_after_forward(i)
    for kind, i in reversed(events):  # backward: a forward's end is its backward's start
        if kind == "post":
            gather(i, units[i]["backward_prefetch"], backward_order, "backward")
        else:
            live.pop(i, None)
    return {"gathered_peak_bytes": peak, "at_module": at, "phase": phase,
            "persistent_bytes": late_bytes, "shard_bytes": shards,
            "total_bytes": peak + late_bytes + shards, "target_world": T,
            "modules": len(units), "fsdp": True}


def _where(loc):
    if not loc or not loc.get("file"):
        return "(source location not known)"
    f = loc["file"]
    try:
        rel = os.path.relpath(f)
        if not rel.startswith(".."):
            f = rel
    except ValueError:
        pass
    return f"{f}:{loc.get('line', 0)}" + (f" in {loc['function']}" if loc.get("function") else "")


def _who(p):
    """The module a problem is about: the reader of an unregistered access, else where it is."""
    if p["kind"] != "unregistered_access":
        return f"in {p['accessor'] or '<root>'}" if p["accessor"] is not None else ""
    return (f"read by {p['accessor'] or '<root>'}" if p["accessor"] is not None
            else "read outside any module")


def report_text(problems, doc, prediction, results, args, elapsed):
    out = []
    steps = max((r or {}).get("steps", 0) for r in results) if results else 0
    out.append(f"shardscope-check {args.script}: {args.nproc} CPU ranks, {steps} steps, "
               f"{elapsed:.0f} s")
    if problems:
        out.append(f"\n{len(problems)} problem{'s' if len(problems) != 1 else ''}:")
    for i, p in enumerate(problems, 1):
        ranks = ",".join(str(r) for r in sorted(p["ranks"]))
        steps = (f"step {p['first_step']}" if p["first_step"] == p["last_step"]
                 else f"steps {p['first_step']}-{p['last_step']}")
        if p["first_step"] == 0:
            steps = "while the model was built"
        subject = " ".join(part for part in (p["param"] or "", _who(p)) if part)
        out.append(f"\n{i}. {p['kind']}{': ' + subject if subject else ''} (ranks {ranks}, {steps})")
        out.append(f"   at {_where(p['location'])}")
        for frame in (p["location"] or {}).get("chain", [])[:2]:
            out.append(f"      from {frame}")
        if p["building"]:
            out.append(f"   while building: {p['building']}")
        out.append(f"   {p['message']}")
        if p["fix"]:
            out.append(f"   fix: {p['fix']}")
    if doc:
        late = [q for q in doc.get("params", []) if q.get("late")]
        if late:
            # Each with the user's line that registered it (the agents' registration hook).
            sites = {}
            for r in results:
                for name, (f, line, function) in ((r or {}).get("late_sites") or {}).items():
                    sites.setdefault(name, {"file": f, "line": line, "function": function})
            out.append(f"\nlate parameters ({len(late)}):")
            for q in late[:8]:
                out.append("   " + q["name"] + (f" (replaces {q['replaces']})" if q.get("replaces") else "")
                           + (f" at {_where(sites[q['name']])}" if q["name"] in sites else ""))
            if len(late) > 8:
                out.append(f"   ... and {len(late) - 8} more")
        persistent = [q for q in doc.get("params", []) if q.get("persistent")]
        if persistent:
            cost = sum(_bytes(q) for q in persistent)
            thr = doc["engine"].get("config", {}).get("persistence_threshold", 0)
            out.append(f"\npersistent parameters (whole on every rank, below "
                       f"persistence_threshold {thr}): {len(persistent)}, {_size(cost)} per rank")
    if prediction and prediction["modules"]:
        fsdp = prediction.get("fsdp")
        out.append(f"\npredicted per-rank parameter memory at {prediction['target_world']} ranks: "
                   f"gathered peak {_size(prediction['gathered_peak_bytes'])} (at "
                   f"`{prediction['at_module'] or '<root>'}`"
                   + (f" {prediction['phase']}" if fsdp else "") + "), "
                   + ("late (whole) " if fsdp else "persistent ")
                   + f"{_size(prediction['persistent_bytes'])}, shards "
                   f"{_size(prediction['shard_bytes'])}; total {_size(prediction['total_bytes'])}")
    if prediction and prediction.get("unavailable"):
        out.append(f"\nno memory prediction: {prediction['unavailable']}")
    batch = _batch_line(results, args)
    if batch:
        out.append("\n" + batch)
    timing = _timing(results, elapsed)
    if timing:
        out.append("\n" + timing)
    out.append("\n" + ("no problems found" if not problems else
                       f"{len(problems)} problem{'s' if len(problems) != 1 else ''} found")
               + f"; snapshot: {args.snapshot} (open with `shardscope {args.snapshot}`)")
    return "\n".join(out)


def _batch_line(results, args):
    """The batch the ranks ran (DeepSpeed's figures at the first step, rank 0), and, when the
    script's first forward got another number of rows than DeepSpeed's micro batch, that the
    script makes its own batches (--micro-batch cannot change them)."""
    b = next((r["batch"] for r in results if r and r.get("batch")), None)
    if not b or "micro" not in b:
        return ""
    rows = b.get("input_rows")
    line = (f"batch: {b['micro']} per rank" + (" (--micro-batch" if b.get("requested") else
                                                " (the script's config")
            + (f"; the first forward's input: {rows} rows)" if rows is not None else ")")
            + f", gradient accumulation {b.get('accumulation', '?')}, train_batch_size "
              f"{b.get('global', '?')} at {args.nproc} ranks")
    if rows is not None and rows != b["micro"]:
        line += ("; the script makes its own batches"
                 + (", which --micro-batch does not change (pass the script's own batch-size "
                    "argument)" if b.get("requested") else ""))
    return line


def _timing(results, elapsed):
    """Where the time went, from rank 0's stages: python start and imports, the script up to
    its first step (model build, deepspeed.initialize), the steps, the rest (snapshot, exit)."""
    r = next((r for r in results if r and r.get("times")), None)
    if r is None:
        return ""
    t = {}
    for name, at in r["times"]:
        t.setdefault(name.split(" ")[0] if name.startswith("step") else name, at)
    imports = t.get("running the script (building the model)")
    first = t.get("step")
    done = t.get("done")
    if imports is None or first is None or done is None:
        return ""
    return (f"time: {elapsed:.1f} s wall; rank 0: imports {imports:.1f} s, script to its first "
            f"step {first - imports:.1f} s, steps {done - first:.1f} s; start, snapshot and "
            f"exit {max(0.0, elapsed - done):.1f} s")


# ---------------------------------------------------------------------------- SARIF, JUnit
# A SARIF rule for every violation kind (_native.violation_kinds(): engine/base/names.h); a
# kind without a line here fails write_sarif, and tst_check with it.
_RULES = {
    "unregistered_access": "A module or code outside modules read a ZeRO-3 partitioned "
                           "parameter DeepSpeed did not gather for it",
    "late_parameter": "A parameter was created after zero.Init partitioned the model "
                      "(FSDP2: after fully_shard), so it is not sharded",
    "trace_invalidated": "The module order differs from the recorded prefetch trace",
    "gathered_write_without_modifier": "A parameter changed inside GatheredParameters "
                                       "without modifier_rank",
    "tied_across_groups": "FSDP2: one tied parameter is in two or more fully_shard groups",
    "backward_unfinished": "A backward never finished: FSDP2's final callback did not run, so "
                           "each rank trains its own copy from then on; or DeepSpeed's raised "
                           "with gradients left in ZeRO-3's reduce bucket, so the next backward "
                           "or step fails",
    "shard_order": "FSDP2: fully_shard was called on a module inside one already sharded "
                   "(parents before children)",
}


def _uri(path):
    try:
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            return rel.replace(os.sep, "/")
    except ValueError:
        pass
    return "file://" + os.path.abspath(path)


def write_sarif(path, problems):
    from . import _native

    results = []
    for p in problems:
        result = {"ruleId": p["kind"], "level": "error",
                  "message": {"text": p["message"] + (f" Fix: {p['fix']}" if p["fix"] else "")}}
        loc = p["location"]
        if loc and loc.get("file"):
            result["locations"] = [{"physicalLocation": {
                "artifactLocation": {"uri": _uri(loc["file"])},
                "region": {"startLine": max(1, int(loc.get("line", 1)))}}}]
        results.append(result)
    doc = {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
           "runs": [{"tool": {"driver": {
               "name": "shardscope-check", "informationUri": "https://github.com/shardscope",
               "rules": [{"id": k, "shortDescription": {"text": _RULES[k]}}
                         for k in _native.violation_kinds()]}},
               "results": results}]}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def write_junit(path, problems, elapsed):
    q = xml.quoteattr
    cases = []
    for p in problems:
        name = f"{p['kind']} {p['param'] or ''} {_who(p)} at {_where(p['location'])}"
        body = p["message"] + ("\nfix: " + p["fix"] if p["fix"] else "")
        cases.append(f'  <testcase classname="shardscope-check" name={q(name)} time="0">\n'
                     f'   <failure message={q(p["message"])} type={q(p["kind"])}>'
                     f'{xml.escape(body)}</failure>\n  </testcase>')
    if not problems:
        cases.append('  <testcase classname="shardscope-check" name="no sharding problems" time="0"/>')
    text = (f'<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<testsuites>\n <testsuite name="shardscope-check" tests="{max(1, len(problems))}" '
            f'failures="{len(problems)}" errors="0" time="{elapsed:.3f}">\n'
            + "\n".join(cases) + "\n </testsuite>\n</testsuites>\n")
    with open(path, "w") as f:
        f.write(text)


# ---------------------------------------------------------------------------- main
def _why_not(results, logs, timed_out, args, elapsed):
    """The reason the run did not give a result (exit 2), or None."""
    def tail(rank):
        lines = [ln for ln in logs[rank].splitlines() if ln.strip()]
        return "\n".join("    " + ln for ln in lines[-12:])

    if timed_out:
        stage = getattr(args, "last_stage", "") or "starting python"
        return (f"the script did not finish {args.steps} steps within --timeout {args.timeout:.0f} s "
                f"(stopped at: {stage}); what was recorded is kept")
    for rank, r in enumerate(results):
        if r is None:
            return (f"rank {rank} ended without a result (killed, or crashed in native code); "
                    f"its output ends:\n{tail(rank)}")
    for rank, r in enumerate(results):
        if r["error"] and not r["stopped"]:
            where = "before the model was built" if not r["model_built"] else f"after {r['steps']} steps"
            return f"the script failed on rank {rank} {where}:\n{r['error'].rstrip()}"
    for rank, r in enumerate(results):
        if r["exit"] is not None and not r["stopped"]:
            return (f"the script called sys.exit({r['exit']}) on rank {rank} after {r['steps']} "
                    f"of {args.steps} steps" + ("" if r["model_built"] else
                                                 ", before the model was built"))
    for rank, r in enumerate(results):
        if not r["stopped"]:
            if not r["model_built"]:
                if getattr(args, "resolved_backend", "deepspeed") == "fsdp":
                    return (f"the script ended on rank {rank} without running an FSDP2 step "
                            f"(no forward of a fully_shard root module was seen)")
                return (f"the script ended on rank {rank} without running a DeepSpeed step "
                        f"(no deepspeed.initialize engine forward was seen)")
            return (f"the script ended on rank {rank} after {r['steps']} of {args.steps} steps; "
                    f"run fewer with --steps {max(1, r['steps'])}")
    return None


def _extras(args, problems, elapsed):
    if args.sarif:
        write_sarif(args.sarif, problems)
    if args.junit:
        write_junit(args.junit, problems, elapsed)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return COULD_NOT_RUN if e.code else 0
    try:
        if args.nproc < 1 or args.steps < 1 or args.target_world < 1 or args.timeout <= 0 \
                or args.micro_batch < 0:
            raise CouldNotRun("--nproc, --steps, --target-world and --micro-batch need a positive "
                              "integer, --timeout a positive number of seconds")
        if not os.path.isfile(args.script):
            raise CouldNotRun(f"no script {args.script!r} (shardscope-check [options] script.py [args])")
        backend = detect_backend(args.script) if args.backend == "auto" else args.backend
        args.resolved_backend = backend
        if args.micro_batch and backend == "fsdp":
            # An FSDP2 script makes its own batches: no config says how many samples a rank
            # takes, so the option could only be ignored, and a run that looks smaller is not.
            raise CouldNotRun(
                f"--micro-batch changes a DeepSpeed config, and {args.script} uses FSDP2, whose "
                f"batch the script makes itself: pass the script's own batch-size argument after "
                f"its path instead (shardscope-check {args.script} --batch-size "
                f"{args.micro_batch}, if it has one)")
        _check_backend_available(backend)
    except CouldNotRun as e:
        print(f"shardscope-check: could not run: {e}", file=sys.stderr)
        return COULD_NOT_RUN

    workdir = tempfile.mkdtemp(prefix="shardscope-check-")
    try:
        results, logs, timed_out, elapsed = run_ranks(args, workdir, backend)
        text, doc, rows = merge(workdir, args.nproc)
        if text is not None:
            with open(args.snapshot, "w") as f:
                f.write(text)
        why = _why_not(results, logs, timed_out, args, elapsed)
        problems = problems_of(doc, rows)
        failed = [r for r in results if r and r["error"] and not r["stopped"]]
        if why is not None and problems and failed and not timed_out:
            # The script failed after the agent recorded problems: they are why (an
            # IndexError from an empty placeholder is DeepSpeed's reply to the read recorded).
            print(report_text(problems, doc, None, results, args, elapsed))
            last = failed[0]["error"].rstrip().splitlines()[-1]
            print(f"\nthe script then failed on rank {failed[0]['rank']} ({last}); the problems "
                  f"above come first. Fix them and run shardscope-check again.")
            _extras(args, problems, elapsed)
            return PROBLEMS
        if why is not None:
            print(f"shardscope-check: could not run: {why}", file=sys.stderr)
            if problems:
                print(f"shardscope-check: recorded before that ({args.snapshot}):", file=sys.stderr)
                print(report_text(problems, doc, None, results, args, elapsed), file=sys.stderr)
            return COULD_NOT_RUN
        order = next((r["module_order"] for r in results if r and r.get("module_order")), [])
        units = next((r["fsdp_units"] for r in results if r and r.get("fsdp_units")), None)
        config = doc["engine"].get("config", {}) if doc else {}
        if units is not None:
            late = sum(_bytes(q) for q in (doc or {}).get("params", []) if q.get("late"))
            prediction = predict_fsdp_peak(units, late, args.target_world)
        elif backend == "fsdp":
            why = next((r["fsdp_units_error"] for r in results if r and r.get("fsdp_units_error")),
                       "no FSDP unit ran a forward through its module's hooks on rank 0")
            prediction = {"modules": 0, "unavailable": why}
        else:
            prediction = predict_peak(order, config, args.target_world)
        print(report_text(problems, doc, prediction, results, args, elapsed))
        _extras(args, problems, elapsed)
        return PROBLEMS if problems else CLEAN
    finally:
        if args.keep:
            print(f"shardscope-check: the ranks' logs, results and snapshots are in {workdir}",
                  file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
