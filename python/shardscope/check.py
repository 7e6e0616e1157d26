"""shardscope-check: find a model's ZeRO-3 bugs on a few CPU ranks before the GPU run.

    shardscope-check [options] train.py [script args]
    python -m shardscope.check [options] train.py [script args]

Runs the unchanged training script on N CPU ranks over gloo (DeepSpeed's CPU accelerator),
with the ShardScope agent installed before the script, for K optimizer steps, then prints
each distinct problem with the file and line to change and the line to paste. Exit status:
0 clean, 1 problems found, 2 could not run (the reason is printed), 128 + N stopped by signal
N (the ranks ended first). See docs/check.md.
"""
import argparse
import json
import math
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
# Stopped by a signal: 128 + its number, as a shell reports a process the signal ended
# (130 for Ctrl-C's SIGINT, 143 for SIGTERM), after the ranks were ended.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_GRACE_S = 5.0  # a rank's time to leave after SIGTERM (its agent writes its snapshot) before SIGKILL
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
# The records of a job whose ranks diverged or hang in a collective (docs/check.md, "A script
# that hangs"): the job's aligner makes collective_mismatch and rank_stalled, each rank's
# watchdog its own rank_stalled (SHARDSCOPE_STALL_SECONDS, 5 s on these CPU ranks).
HANG_KINDS = ("collective_mismatch", "rank_stalled")
_STALL_GRACE_S = 3.0  # once every rank still running has stalled: time for the last records
# A rank stalled while another waits where no agent sees (a barrier, its own collective): the
# ranks are stopped once this long has passed since the stall with no rank's stage changing.
_LONE_STALL_S = 15.0


class CouldNotRun(Exception):
    """Exit 2, with the reason."""


# ---------------------------------------------------------------------------- arguments
# The accepted ranges, said in --help and in the error of a number outside them.
NPROC = (1, 64)  # CPU ranks on one machine
STEPS = (1, 1000)
TARGET_WORLD = (1, 1 << 20)
MICRO_BATCH = (1, 1 << 16)
TIMEOUT = (0.0, 86400.0)  # seconds, the lower bound excluded: a day at most


def _int_in(bounds):
    low, high = bounds

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"invalid int value: {text!r} (accepted: {low}..{high})") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside the accepted {low}..{high}")
        return value

    return parse


def _seconds(text):
    low, high = TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    # nan compares false with everything and inf is no limit: both would switch it off.
    if not math.isfinite(value) or not low < value <= high:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds in the accepted range: more than "
            f"{low:.0f}, at most {high:.0f}")
    return value


def _parser():
    p = argparse.ArgumentParser(
        prog="shardscope-check",
        description="Run a ZeRO-3 training script on CPU ranks for a few steps and report "
                    "its sharding bugs with the line of code to change (docs/check.md).",
        epilog="exit status: 0 clean, 1 problems found, 2 could not run, 128+N stopped by "
               "signal N (130: Ctrl-C, 143: SIGTERM)")
    p.add_argument("-n", "--nproc", type=_int_in(NPROC), default=2, metavar="N",
                   help=f"CPU ranks (gloo), {NPROC[0]}..{NPROC[1]}, default 2")
    p.add_argument("--steps", type=_int_in(STEPS), default=3, metavar="K",
                   help=f"optimizer steps to run before stopping the script, "
                        f"{STEPS[0]}..{STEPS[1]}, default 3")
    p.add_argument("--timeout", type=_seconds, default=300.0, metavar="S",
                   help=f"give up after S seconds (exit 2), more than 0 and at most "
                        f"{TIMEOUT[1]:.0f}, default 300")
    p.add_argument("--target-world", type=_int_in(TARGET_WORLD), default=64, metavar="N",
                   help=f"world size of the real run, for the memory prediction, "
                        f"{TARGET_WORLD[0]}..{TARGET_WORLD[1]}, default 64")
    p.add_argument("--micro-batch", type=_int_in(MICRO_BATCH), default=None, metavar="N",
                   help=f"DeepSpeed: N samples per rank, {MICRO_BATCH[0]}..{MICRO_BATCH[1]} (the "
                        f"config's train_micro_batch_size_per_gpu, train_batch_size to match; a "
                        f"Trainer's per_device_train_batch_size); default: the script's own")
    p.add_argument("--snapshot", default="shardscope-check.json", metavar="FILE",
                   help="the snapshot written (open it with `shardscope FILE`)")
    p.add_argument("--sarif", metavar="FILE", help="also write the problems as SARIF 2.1.0")
    p.add_argument("--junit", metavar="FILE", help="also write the problems as JUnit XML")
    p.add_argument("--backend", choices=["auto", "deepspeed", "fsdp"], default="auto",
                   help="the sharding library the script uses (default: detected)")
    p.add_argument("--accelerate-config", metavar="FILE",
                   help="an Accelerate config with distributed_type DEEPSPEED, as `accelerate "
                        "launch --config_file FILE` takes it (default: the one `accelerate "
                        "config` wrote, for a script that names no DeepSpeed itself)")
    p.add_argument("--save-check", action="store_true",
                   help="after the last step, run the script's own saves once (torch.save, "
                        "save_pretrained, save_checkpoint, ... in the training loop's function), "
                        "written into the check's folder: a save the steps do not reach is "
                        "checked as if it ran")
    p.add_argument("--keep", action="store_true",
                   help="keep the ranks' files and logs (their directory is named at the end)")
    p.add_argument("script", help="the training script, run unchanged")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    return p


# ---------------------------------------------------------------------------- detection
# Accelerate's DeepSpeedPlugin (Accelerator(deepspeed_plugin=...)) runs deepspeed.initialize too.
_DEEPSPEED = re.compile(r"^\s*(import\s+deepspeed|from\s+deepspeed[\s.])|deepspeed\.initialize|"
                        r"[\"']deepspeed[\"']\s*:|deepspeed\s*=|--deepspeed|\bDeepSpeedPlugin\b",
                        re.M)
_FSDP = re.compile(r"fully_shard\b|torch\.distributed\.fsdp|FullyShardedDataParallel")
_HF_DS = re.compile(r"\bTrainingArguments\b|\bHfDeepSpeedConfig\b|\bAccelerator\b")


_ACCELERATE_DEEPSPEED = re.compile(r"^[\"']?distributed_type[\"']?\s*:\s*[\"']?DEEPSPEED\b", re.M)


def accelerate_config(path=None):
    """The Accelerate config `accelerate launch` reads (path, else the one `accelerate config`
    writes: $HF_HOME/accelerate/default_config.yaml, HF_HOME defaulting to
    $XDG_CACHE_HOME/huggingface, ~/.cache/huggingface) when its distributed_type is DEEPSPEED,
    else None. Raises CouldNotRun when a path given cannot be read."""
    if path is None:
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface")
        path = os.path.join(home, "accelerate", "default_config.yaml")
        if not os.path.isfile(path):
            return None
        explicit = False
    else:
        explicit = True
    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except OSError as e:
        if explicit:
            raise CouldNotRun(f"cannot read the Accelerate config {path}: {e.strerror}") from None
        return None
    if _ACCELERATE_DEEPSPEED.search(text):
        return os.path.abspath(path)
    if explicit:
        raise CouldNotRun(f"the Accelerate config {path} does not use DeepSpeed (its "
                          f"distributed_type is not DEEPSPEED)")
    return None


def detect_backend(script, accelerate=None):
    """'deepspeed' or 'fsdp' from the script's text (and the local modules it imports): DeepSpeed
    named in it (also through Accelerate's DeepSpeedPlugin or a Trainer's deepspeed=), else
    FSDP2. An Accelerate or Transformers script that names neither: None while accelerate is
    None (its Accelerate config decides, accelerate_config), 'deepspeed' when accelerate is
    true; raises CouldNotRun when accelerate is false, and for a script that uses none."""
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
        if accelerate is None or accelerate:
            return accelerate and "deepspeed"
        raise CouldNotRun(
            f"{script} uses Transformers/Accelerate but names no DeepSpeed config, "
            f"DeepSpeedPlugin or FSDP, and no Accelerate config with distributed_type DEEPSPEED "
            f"was found (--accelerate-config FILE); say which with --backend deepspeed or "
            f"--backend fsdp")
    raise CouldNotRun(
        f"no supported sharding backend found in {script}: it neither uses DeepSpeed "
        f"(import deepspeed, deepspeed.initialize, a \"deepspeed\" config, Accelerate's "
        f"DeepSpeedPlugin) nor FSDP2 (torch.distributed.fsdp.fully_shard); pass --backend if it "
        f"does so indirectly")


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


class _Stop:
    """The signal that asked the check to stop (SIGINT, SIGTERM, SIGHUP), or None. The handler
    only records it: the loop that watches the ranks ends them, then the report of what they
    recorded is written, so nothing is left half done by an exception raised anywhere."""
    signum = None

    @classmethod
    def handler(cls, signum, frame):
        if cls.signum is None:
            cls.signum = signum


def _stop_requested():
    return _Stop.signum is not None


def run_ranks(args, workdir, backend):
    """Starts the ranks, shows their progress, stops them at the timeout or when the check is
    asked to stop (_Stop). Returns (results per rank, logs per rank, timed_out, elapsed,
    the pids of ranks still alive after SIGKILL)."""
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
        "SHARDSCOPE_CHECK_SAVE": "1" if getattr(args, "save_check", False) else "0",
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
    })
    if getattr(args, "accelerate", None):
        env["SHARDSCOPE_CHECK_ACCELERATE_CONFIG"] = args.accelerate
    procs, logs = [], []
    for rank in range(args.nproc):
        if _stop_requested():
            break
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
    stalls = _Stalls(workdir, len(procs))
    args.stalled = False
    seen_stages: list = []
    moved = start  # when a rank's stage last changed
    while any(p.poll() is None for p in procs):
        elapsed = time.monotonic() - start
        if elapsed > args.timeout:
            timed_out = True
            break
        if _stop_requested():
            break
        # Every rank still running waits in a collective past the threshold (its watchdog's
        # rank_stalled is in its snapshot), or one does and nothing has moved for
        # _LONE_STALL_S since: the script hangs; stopped then, not at --timeout.
        every = stalls.all_stalled(procs)
        if every or (stalls.first is not None and
                     time.monotonic() - max(stalls.first, moved) > _LONE_STALL_S):
            args.stalled = "every" if every else "one"
            _progress("shardscope-check: " + ("every rank waits" if every else "a rank waits")
                      + " in a collective the others do not issue (rank_stalled); stopping the "
                      "ranks", tty)
            _wait_or_stop(procs, _STALL_GRACE_S if every else 0.0)
            break
        stages = []
        for rank in range(args.nproc):
            try:
                stages.append(open(os.path.join(workdir, f"status.{rank}")).read().split(" ", 1)[1].strip())
            except (OSError, IndexError):
                stages.append("starting python")
        if stages != seen_stages:
            seen_stages, moved = stages, time.monotonic()
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
    if timed_out or _stop_requested():
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
    texts += [""] * (args.nproc - len(texts))
    args.last_stage = last if not tty else last.split(": ", 2)[-1]
    alive = [p.pid for p in procs if p.poll() is None]
    return results, texts, timed_out, time.monotonic() - start, alive


class _Stalls:
    """Which ranks' snapshots (rank<N>.json, rewritten by the agent's flushes) hold this rank's
    own rank_stalled record: each file read again only when it changed."""

    def __init__(self, workdir, nproc):
        self.paths = [os.path.join(workdir, f"rank{r}.json") for r in range(nproc)]
        self.seen: list = [None] * nproc  # (mtime, size) last read
        self.stalled = [False] * nproc  # its rank_stalled collective still waits
        self.checked = 0.0
        self.first: float | None = None  # when a stall was first seen

    def all_stalled(self, procs):
        now = time.monotonic()
        if now - self.checked < 1.0:
            return False
        self.checked = now
        for r, path in enumerate(self.paths):
            try:
                st = os.stat(path)
            except OSError:
                continue
            key = (st.st_mtime_ns, st.st_size)
            if key == self.seen[r]:
                continue
            self.seen[r] = key
            try:
                with open(path) as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                self.seen[r] = None  # being replaced: read again next time
                continue
            self.stalled[r] = _still_stalled(doc)
        if not any(self.stalled):
            self.first = None  # none, or each completed after all (stragglers)
        elif self.first is None:
            self.first = now
        running = [r for r, p in enumerate(procs) if p.poll() is None]
        return bool(running) and any(self.stalled) and all(self.stalled[r] for r in running)


def _still_stalled(doc):
    """Whether a rank's snapshot holds its own rank_stalled of a collective that has not ended
    since (its collective_end not among its events: the watchdog flushes again when a stalled
    collective completes, a straggler rather than a hang)."""
    waits = {(c.get("group"), c.get("seq")) for v in doc.get("violations", [])
             if v.get("kind") == "rank_stalled" and isinstance(c := v.get("collective"), dict)}
    if not waits:
        return False
    ev = doc.get("events")
    if not isinstance(ev, dict) or "collective_end" not in ev.get("type_names", []):
        return True
    end = ev["type_names"].index("collective_end")
    columns = (ev.get("type", []), ev.get("b", []), ev.get("u0", []))
    ended = {(b, u0) for t, b, u0 in zip(*columns, strict=False) if t == end}
    return bool(waits - ended)


def _stage_order(stage):
    for i, prefix in enumerate(("starting", "importing torch", "importing deepspeed",
                                "importing torch.distributed.fsdp", "running",
                                "deepspeed.initialize", "step")):
        if stage.startswith(prefix):
            return (i, stage)
    return (9, stage)


def _wait_or_stop(procs, grace):
    """Waits up to grace seconds for the ranks to leave (less when the check is asked to stop),
    then ends those left: SIGTERM to each rank's process group (the agent writes the rank's
    snapshot), SIGKILL after _GRACE_S."""
    deadline = time.monotonic() + grace
    for p in procs:
        while p.poll() is None and time.monotonic() < deadline and not _stop_requested():
            time.sleep(0.05)
    for sig, wait in ((signal.SIGTERM, _GRACE_S), (signal.SIGKILL, 2.0)):
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


def _severity(v):
    """A violation entry's severity: the snapshot's, or for a file written before severities
    the one rule's (engine/state/severity.h, through the native module)."""
    if "severity" in v:
        return v["severity"]
    from . import _native
    return _native.severity_of(v["kind"], v["action"], v.get("read", "values"))


def problems_of(doc, rows):
    """Distinct problems: the ledger's rows (one per kind, accessor, parameter, owner and
    source location), each with the ranks and steps of its entries and the worst severity
    among them."""
    from . import _native

    order = _native.severities()  # worst first
    problems: dict = {}
    for v, row in zip(doc.get("violations", []) if doc else [], rows, strict=False):
        loc = v.get("location") or {}
        p = problems.get(row)
        if p is None:
            p = problems[row] = {"kind": v["kind"], "accessor": v.get("accessor"),
                                 "param": v.get("param"), "owner": v.get("owner"),
                                 "location": loc, "building": v.get("building", ""),
                                 "fix": v.get("fix", ""), "message": v.get("message", ""),
                                 "action": v.get("action"), "severity": _severity(v),
                                 "ranks": set(), "first_step": None, "last_step": 0, "count": 0}
        p["severity"] = min(p["severity"], _severity(v), key=order.index)
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
    its 1/target_world shard. A parameter is counted once however many modules hold it (a
    tied embedding is in the embedding and the head): order's entries are
    (module path, [(numel, element size, persistent, identity), ...]), identity DeepSpeed's
    ds_id (_checkboot._record_order)."""
    bucket = int(config.get("prefetch_bucket_size", 0) or 0)
    max_live = int(config.get("max_live_parameters", 0) or 0) or (1 << 62)
    mods = []  # (path, {identity: (numel, bytes)}) of each module's partitioned parameters
    seen = set()
    persistent_bytes = shard_bytes = 0
    for path, params in order:
        own = {}
        for k, (numel, elsize, persistent, *identity) in enumerate(params):
            key = identity[0] if identity else (path, k)
            first = key not in seen
            seen.add(key)
            if persistent:
                persistent_bytes += numel * elsize if first else 0
                continue
            shard_bytes += -(-numel // target_world) * elsize if first else 0
            own[key] = (numel, numel * elsize)
        mods.append((path, own))
    peak, at = 0, ""
    for i, (path, own) in enumerate(mods):
        live = dict(own)
        live_numel = sum(n for n, _ in live.values())
        prefetched = 0
        for _, theirs in mods[i + 1:]:
            new = {key: v for key, v in theirs.items() if key not in live}
            n = sum(numel for numel, _ in new.values())
            if n == 0:
                continue
            if prefetched + n > bucket or live_numel + n > max_live:
                break
            prefetched += n
            live_numel += n
            live.update(new)
        live_bytes = sum(b for _, b in live.values())
        if live_bytes > peak:
            peak, at = live_bytes, path
    return {"gathered_peak_bytes": peak, "at_module": at, "persistent_bytes": persistent_bytes,
            "shard_bytes": shard_bytes, "total_bytes": peak + persistent_bytes + shard_bytes,
            "target_world": target_world, "modules": len(mods)}


def predict_fsdp_peak(record, late_bytes, target_world):
    """FSDP2: the per-rank peak of gathered parameter memory at target_world, replaying the
    units' forward as the first step ran it (record: _checkboot._record_units) and the
    backward as its reverse (a unit's forward end is its backward's start); under gradient
    accumulation each micro-batch's forward and backward (record["passes"]) on its own. A unit's
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
    units = record["units"]
    passes = [[tuple(e) for e in events] for events in record.get("passes", [record.get("events", [])])]
    T = target_world

    def gathered(i):
        return sum(-(-rows // T) * T * row * g for rows, row, g, _ in units[i]["params"])

    def held_after_forward(i):
        w = units[i].get("post_forward_world")
        return sum(-(-rows // w) * row * g for rows, row, g, _ in units[i]["params"]) if w else 0

    shards = sum(-(-rows // T) * row * e for u in units for rows, row, _, e in u["params"])
    peak, at, phase = 0, "", ""

    def gather(live, i, prefetch, order, name):
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

    # Each forward of the root (a micro-batch) with its backward, on its own: a micro-batch's
    # units are resharded at their backward's end, before the next micro-batch's forward.
    for events in passes:
        forward_order = [i for kind, i in events if kind == "pre"]
        backward_order = [i for kind, i in reversed(events) if kind == "post"]
        live: dict = {}
        for kind, i in events:  # forward
            if kind == "pre":
                gather(live, i, units[i]["forward_prefetch"], forward_order, "forward")
            elif units[i]["reshard_after_forward"]:
                live[i] = held_after_forward(i)
        for kind, i in reversed(events):  # backward: a forward's end is its backward's start
            if kind == "post":
                gather(live, i, units[i]["backward_prefetch"], backward_order, "backward")
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
        out.append(f"\n{i}. {p['kind']}{': ' + subject if subject else ''} (ranks {ranks}, {steps}) "
                   f"[{p['severity']}]")
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
            sites: dict = {}
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
    saves = _saves_lines(results, args)
    if saves:
        out.append("\n" + "\n".join(saves))
    batch = _batch_line(results, args)
    if batch:
        out.append("\n" + batch)
    timing = _timing(results, elapsed)
    if timing:
        out.append("\n" + timing)
    out.append("\n" + ("no problems found" if not problems else
                       f"{len(problems)} problem{'s' if len(problems) != 1 else ''} found"
                       f" ({_by_severity(problems)})")
               + f"; snapshot: {args.snapshot} (open with `shardscope {args.snapshot}`)")
    return "\n".join(out)


def _saves_lines(results, args):
    """What --save-check ran (rank 0's, every rank runs the same), or, without it, the saves
    the script has that the steps may not have reached."""
    from . import _savecheck

    ran = next(((r or {}).get("save_check") for r in results if (r or {}).get("save_check")), None)
    if ran:
        out = [f"--save-check ran the script's saves once after step {args.steps}, into the "
               f"check's folder:"]
        for s in ran:
            via = f" (called at line {s['via']})" if s.get("via") else ""
            what = "ran" if s["ran"] else f"could not run: {s['error']}"
            out.append(f"   line {s['line']}{via}: {s['call']}: {what}")
        return out
    if getattr(args, "save_check", False):
        stopped = any((r or {}).get("stopped") for r in results)
        return ["--save-check: " + ("no save was found in the function of the training loop"
                                     if stopped else "the script did not reach its last step")]
    try:
        with open(args.script, encoding="utf-8") as f:
            found = _savecheck.saves_in(f.read(), args.script)
    except (OSError, SyntaxError, ValueError):
        return []
    if not found:
        return []
    lines = ", ".join(str(s.line) for s in found[:6])
    lines += " ..." if len(found) > 6 else ""
    return [f"the script saves at line{'s' if len(found) > 1 else ''} {lines}; a save the "
            f"{args.steps} step{'s' if args.steps != 1 else ''} did not reach is not checked: "
            f"--save-check runs the training loop's saves once after the last step"]


def _by_severity(problems):
    """ "1 error, 2 cost, 1 info": how many problems of each severity, worst first."""
    from . import _native

    counts = [(s, sum(1 for p in problems if p["severity"] == s)) for s in _native.severities()]
    return ", ".join(f"{n} {s}" for s, n in counts if n)


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
    t: dict = {}
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
    "partitioned_save": "A state dict of ZeRO-3's placeholders (size 0) or of FSDP2's shards was "
                        "taken or saved as if whole: the checkpoint loses the weights",
    "partitioned_load": "Full tensors were loaded into a ZeRO-3 partitioned or FSDP2 sharded "
                        "model with load_state_dict, which cannot copy them",
    "resume_world_size": "DeepSpeed: a ZeRO checkpoint was resumed at another data-parallel "
                         "world size than it was saved at",
    "collective_mismatch": "The ranks issued different collectives at one place of their "
                           "sequence: on GPUs the job hangs until NCCL's timeout",
    "rank_stalled": "A rank waited in a collective past the threshold while another rank never "
                    "issued it: on GPUs the job hangs until NCCL's timeout",
}


# The SARIF level of each severity (_native.severities(): engine/base/names.h): a crash or a
# silent wrong result is an error, a cost a warning, information a note. A severity without a
# level here fails write_sarif.
_LEVELS = {"error": "error", "cost": "warning", "info": "note"}


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

    missing = [s for s in _native.severities() if s not in _LEVELS]
    if missing:
        raise ValueError(f"no SARIF level for severity {', '.join(missing)}")
    results = []
    for p in problems:
        result = {"ruleId": p["kind"], "level": _LEVELS[p["severity"]],
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
    _write(path, json.dumps(doc, indent=1))


def write_junit(path, problems, elapsed):
    q = xml.quoteattr
    cases = []
    for p in problems:
        name = " ".join(part for part in (p["kind"], p["param"] or "", _who(p),
                                          f"at {_where(p['location'])}") if part)
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
    _write(path, text)


class CouldNotWrite(Exception):
    """An output could not be written after the run (it was writable before it)."""


def _write(path, text):
    """The project's one writer (wire/atomicfile.h writeFileAtomically, through the native
    module): the file is replaced by a rename, never written through a symlink planted at the
    name, and a reader sees the old file or the new one."""
    from . import _native

    why = _native.write_file_atomically(path, text)
    if why:
        raise CouldNotWrite(why)


def _outputs(args):
    """The files the check writes: (option, path)."""
    return [(o, p) for o, p in (("--snapshot", args.snapshot), ("--sarif", args.sarif),
                                ("--junit", args.junit)) if p]


def check_outputs(args):
    """Refuses, before any rank starts, an output that cannot be written (a missing directory,
    a directory, /proc, a read-only place), by the check every ShardScope writer makes
    (wire/atomicfile.h checkOutputFile), and two outputs at one path."""
    from . import _native

    seen: dict = {}
    for option, path in _outputs(args):
        why = _native.check_output_file(path)
        if why:
            raise CouldNotRun(f"{option}: {why}")
        real = os.path.realpath(path)
        if real in seen:
            raise CouldNotRun(f"{seen[real]} and {option} name the same file {path}; give each "
                              f"its own")
        seen[real] = option


# ---------------------------------------------------------------------------- main
def _why_not(results, logs, timed_out, args, elapsed):
    """The reason the run did not give a result (exit 2), or None."""
    def tail(rank):
        lines = [ln for ln in logs[rank].splitlines() if ln.strip()]
        return "\n".join("    " + ln for ln in lines[-12:])

    stage = getattr(args, "last_stage", "") or "starting python"
    if _stop_requested():
        name = signal.Signals(_Stop.signum or signal.SIGTERM).name
        return (f"stopped by {name} (at: {stage}); the ranks were ended (SIGTERM, then SIGKILL "
                f"after {_GRACE_S:.0f} s); what they recorded is kept")
    if timed_out:
        return (f"the script did not finish {args.steps} steps within --timeout {args.timeout:.0f} s "
                f"(stopped at: {stage}); what was recorded is kept")
    # A rank's own error first: the others, left in a collective, were then ended (no result).
    for rank, r in enumerate(results):
        if r is not None and r["error"] and not r["stopped"]:
            error = r["error"].rstrip()
            if r["model_built"]:
                return f"the script failed on rank {rank} after {r['steps']} steps:\n{error}"
            if r.get("initialize") == "called":
                return (f"the script built its model, then deepspeed.initialize failed on rank "
                        f"{rank}:\n{error}")
            if r.get("initialize") == "returned":
                return (f"the script failed on rank {rank} after deepspeed.initialize, before its "
                        f"first step:\n{error}")
            return f"the script failed on rank {rank} before the model was built:\n{error}"
    for rank, r in enumerate(results):
        if r is None:
            return (f"rank {rank} ended without a result (killed, or crashed in native code); "
                    f"its output ends:\n{tail(rank)}")
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


def _extras(args, problems, elapsed, status):
    """Writes --sarif and --junit; the status, or COULD_NOT_RUN when one could not be written."""
    try:
        if args.sarif:
            write_sarif(args.sarif, problems)
        if args.junit:
            write_junit(args.junit, problems, elapsed)
    except CouldNotWrite as e:
        print(f"shardscope-check: {e}", file=sys.stderr)
        return COULD_NOT_RUN
    return status


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return COULD_NOT_RUN if e.code else 0
    # A stop (Ctrl-C, SIGTERM, SIGHUP) is recorded, not raised: no rank starts after it, the
    # ranks started are ended, and what they recorded is reported (_run).
    previous = {sig: signal.signal(sig, _Stop.handler) for sig in _STOP_SIGNALS}
    try:
        return _main(args)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _main(args):
    try:
        if not os.path.isfile(args.script):
            raise CouldNotRun(f"no script {args.script!r} (shardscope-check [options] script.py [args])")
        accelerate = accelerate_config(args.accelerate_config)
        backend = detect_backend(args.script) if args.backend == "auto" else args.backend
        if backend is None:  # an Accelerate script that names no backend: its config says
            backend = "deepspeed" if accelerate else detect_backend(args.script, False)
        elif not args.accelerate_config:
            accelerate = None  # the default config only where it is what says DeepSpeed
        args.resolved_backend = backend
        # The ranks take the Accelerate config as `accelerate launch` gives it (_checkboot).
        args.accelerate = accelerate if backend == "deepspeed" else None
        if args.micro_batch and backend == "fsdp":
            # An FSDP2 script makes its own batches: no config says how many samples a rank
            # takes, so the option could only be ignored, and a run that looks smaller is not.
            raise CouldNotRun(
                f"--micro-batch changes a DeepSpeed config, and {args.script} uses FSDP2, whose "
                f"batch the script makes itself: pass the script's own batch-size argument after "
                f"its path instead (shardscope-check {args.script} --batch-size "
                f"{args.micro_batch}, if it has one)")
        _check_backend_available(backend)
        check_outputs(args)
    except CouldNotRun as e:
        print(f"shardscope-check: could not run: {e}", file=sys.stderr)
        return COULD_NOT_RUN

    workdir = tempfile.mkdtemp(prefix="shardscope-check-")
    alive: list = []
    try:
        status = _run(args, workdir, backend, alive)
        if _stop_requested():
            status = 128 + (_Stop.signum or signal.SIGTERM)
        return status
    finally:
        if alive:
            # Never delete the directory of ranks that still run (they did not die of SIGKILL).
            print(f"shardscope-check: rank processes {', '.join(map(str, alive))} did not end "
                  f"after SIGKILL; their files are left in {workdir}", file=sys.stderr)
        elif args.keep:
            print(f"shardscope-check: the ranks' logs, results and snapshots are in {workdir}",
                  file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(args, workdir, backend, alive):
    """Runs the ranks and reports; the exit status (main adds the stop's)."""
    results, logs, timed_out, elapsed, still = run_ranks(args, workdir, backend)
    alive.extend(still)
    text, doc, rows = merge(workdir, args.nproc)
    written = True
    try:
        if text is not None:
            _write(args.snapshot, text)
    except CouldNotWrite as e:  # writable before the run (check_outputs), not any more
        print(f"shardscope-check: {e}", file=sys.stderr)
        written = False
    why = _why_not(results, logs, timed_out, args, elapsed)
    problems = problems_of(doc, rows)
    failed = [r for r in results if r and r["error"] and not r["stopped"]]
    hang = [p for p in problems if p["kind"] in HANG_KINDS]
    if (timed_out or getattr(args, "stalled", False)) and hang and not _stop_requested():
        # The ranks would not finish, and the job's records say why: which rank issued which
        # collective on which line, and where the others wait (exit 1, not "timed out").
        print(report_text(problems, doc, None, results, args, elapsed))
        stalled = getattr(args, "stalled", False)
        how = (f"did not finish within --timeout {args.timeout:.0f} s" if timed_out or not stalled
               else "were stopped once every rank had waited in a collective past the stall "
               "threshold" if stalled == "every" else
               f"were stopped {_LONE_STALL_S:.0f} s after a rank had waited in a collective "
               f"past the stall threshold while no rank went on (the others wait where the "
               f"agent does not see: a barrier, or their own collective)")
        print(f"\nthe ranks {how} (stopped at: {getattr(args, 'last_stage', '') or 'starting'}); "
              f"on GPUs this script would hang until NCCL's timeout. Fix the problems above "
              f"and run shardscope-check again.")
        return _extras(args, problems, elapsed, PROBLEMS if written else COULD_NOT_RUN)
    if why is None and getattr(args, "stalled", False):
        why = "the ranks were stopped while waiting in a collective"
    if why is not None and problems and failed and not timed_out and not _stop_requested():
        # The script failed after the agent recorded problems: they are why (an
        # IndexError from an empty placeholder is DeepSpeed's reply to the read recorded).
        print(report_text(problems, doc, None, results, args, elapsed))
        last = failed[0]["error"].rstrip().splitlines()[-1]
        print(f"\nthe script then failed on rank {failed[0]['rank']} ({last}); the problems "
              f"above come first. Fix them and run shardscope-check again.")
        return _extras(args, problems, elapsed, PROBLEMS if written else COULD_NOT_RUN)
    if why is not None:
        print(f"shardscope-check: {'' if _stop_requested() else 'could not run: '}{why}",
              file=sys.stderr)
        if problems:
            print(f"shardscope-check: recorded before that ({args.snapshot}):", file=sys.stderr)
            print(report_text(problems, doc, None, results, args, elapsed), file=sys.stderr)
        elif text is not None and written:
            print(f"shardscope-check: what the ranks recorded (no problem): {args.snapshot}",
                  file=sys.stderr)
        return COULD_NOT_RUN
    order: list = next((r["module_order"] for r in results if r and r.get("module_order")), [])
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
    status = PROBLEMS if problems else CLEAN
    return _extras(args, problems, elapsed, status if written else COULD_NOT_RUN)


if __name__ == "__main__":
    sys.exit(main())
