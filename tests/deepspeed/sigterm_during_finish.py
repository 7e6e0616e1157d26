"""SIGTERM while an agent finishes (tst_deepspeedagent's sigtermWhileFinishing): a launcher
stops the other ranks as soon as one fails, so a surviving rank is often terminated while its
own finish() runs. Whenever the signal comes, the snapshot must be there when the process has
died of it. The native Agent both agents share, with 20,000 parameters so that writing the
snapshot takes a while; each trial a forked process, its SIGTERM sent at a fraction of the
measured finish time. Prints one line per trial: "trial K delay D: signal S, snapshot yes|no"
and writes OUT_DIR/trialK.json."""
import os
import signal
import sys
import threading
import time

from shardscope import _native

out_dir, trials = sys.argv[1], int(sys.argv[2])


def child(out, delay):
    a = _native.Agent(model="m", rank=0, world_size=1, backend="gloo", listen=False,
                      endpoint="", token="", snapshot_out=out, history=1024, job="",
                      dialect="deepspeed")
    m = a.ensure_module("layer", "Linear")
    for i in range(20000):
        a.set_param(i, f"layer.p{i}", m, [4, 4], "float32", 16, 16, 16, False, True, False, 0,
                    "", 4)
    a.finish_on_sigterm()
    start = [None]

    def term():  # spins (finish() runs without the GIL) until start + delay
        while start[0] is None or time.perf_counter() < start[0] + delay:
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    if delay is not None:
        threading.Thread(target=term, daemon=True).start()
    start[0] = time.perf_counter()
    a.finish("training finished")
    took = time.perf_counter() - start[0]
    if delay is None:
        with open(os.path.join(out_dir, "took"), "w") as f:
            f.write(repr(took))
        os._exit(0)
    time.sleep(10)  # the signal comes (after finish: the default disposition)
    os._exit(0)


def run(out, delay):
    pid = os.fork()
    if pid == 0:
        try:
            child(out, delay)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return status


status = run(os.path.join(out_dir, "measure.json"), None)
if status != 0:
    raise SystemExit(f"the measuring run ended with status {status}")
with open(os.path.join(out_dir, "took")) as f:
    took = float(f.read())
print(f"finish took {took * 1000:.1f} ms", flush=True)
for k in range(trials):
    out = os.path.join(out_dir, f"trial{k}.json")
    delay = took * k / (trials - 2)  # from the start of finish() to past its end
    st = run(out, delay)
    sig = os.WTERMSIG(st) if os.WIFSIGNALED(st) else 0
    print(f"trial {k} delay {delay * 1000:.1f} ms: signal {sig}, snapshot "
          f"{'yes' if os.path.exists(out) else 'no'}", flush=True)
