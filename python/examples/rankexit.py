"""How every example rank ends once its main() has returned (deepspeed_stories.py, hf_stories.py,
fsdp_stories.py, hf_fsdp_stories.py): `exit_rank(main())` instead of `sys.exit(main())`."""
import logging
import os
import sys


def exit_rank(code):
    """Leaves the process with main()'s status after flushing stdout, stderr and logging, through
    os._exit rather than the interpreter's finalization; a string (a usage error) leaves as
    sys.exit leaves with it, and so does everything under shardscope-check, whose boot
    (shardscope._checkboot) catches the SystemExit, writes its report and leaves with os._exit
    itself. An exception from main() never gets here: it ends the process as Python ends it,
    with its traceback and status 1.

    Why not sys.exit: torch 2.13's gloo backend runs collectives on two worker threads of the
    process group, which destroy_process_group() leaves running, and a collective issued inside
    backward carries a Python object (the contextvars.Context that
    torch.autograd.graph._engine_run_backward stashes in thread-local state, and every work
    copies). The worker drops its reference after marking the work complete; when the main
    thread has meanwhile returned and Python is finalizing, the worker's take of the GIL ends
    the thread with pthread_exit, whose unwinding through torch's noexcept work destructor
    aborts the whole process ("terminate called without an active exception", status 134)
    after the run succeeded. Seen in 3 of about 120 two-rank runs of `fsdp_stories.py
    --compile model --compile-loss --no-agent` on 2 cores (the core's aborting thread:
    ProcessGroupGloo::runLoop -> ~AsyncWork -> ~ThreadLocalState -> SafePyObject decref ->
    PyEval_AcquireThread -> pthread_exit), and once in CI. By the time main() returns, the
    agent has finished (its snapshot is written, its endpoint closed) and the process group is
    destroyed: nothing is left for finalization to do that a rank needs.
    """
    if isinstance(code, str) or os.environ.get("SHARDSCOPE_CHECK"):
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code or 0)
