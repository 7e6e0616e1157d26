"""shardscope-run: start a training script with the ShardScope agent installed, the script unchanged.

    torchrun --nproc-per-node 8 -m shardscope.run [options] train.py [script args]
    deepspeed --module shardscope.run [options] train.py [script args]
    accelerate launch -m shardscope.run [options] train.py [script args]
    shardscope-run [options] train.py [script args]          # one process, or under srun torchrun
    ... -m shardscope.run [options] -m package.train [args]  # a module, as python -m runs it

Installs the DeepSpeed ZeRO-3 or the FSDP2 agent (detected from the script as shardscope-check
detects it, or --backend) in each rank process, then runs the script as `python train.py` would:
the same sys.argv, `__name__ == "__main__"`, sys.path[0], exit status and exceptions. Options go
before the script; each also reads an environment variable, so a launcher's config can set it
(the command line wins). docs/install.md has the table.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import ShardScopeError
from ._agentcore import GUARDS

# option -> (environment variable, what it is); docs/install.md lists the same table.
ENVIRONMENT = {
    "backend": ("SHARDSCOPE_BACKEND", "auto, deepspeed or fsdp"),
    "snapshot_out": ("SHARDSCOPE_SNAPSHOT_OUT", "snapshot file per rank; {rank} is the rank"),
    "guard": ("SHARDSCOPE_GUARD", "warn or error"),
    "listen": ("SHARDSCOPE_LISTEN", "unix:PATH, tcp:HOST:PORT, or none"),
    "token_file": ("SHARDSCOPE_TOKEN_FILE", "file holding the endpoint's token (chmod 600)"),
    "job": ("SHARDSCOPE_JOB", "the job's name shared by its ranks"),
}
# Launchers that start one process per rank without torchrun's RANK (the rank is found later,
# inside deepspeed.init_distributed's MPI discovery): (their rank variable, their size variable).
# Each process would take rank 0's endpoint and snapshot name.
_OTHER_LAUNCHERS = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                    ("PMIX_RANK", "PMIX_SIZE"), ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS"))
USAGE_ERROR = 2


class UsageError(Exception):
    """Exit 2 with the message: nothing of the script has run."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shardscope-run", allow_abbrev=False,
        usage="%(prog)s [options] train.py [script args]\n"
              "       %(prog)s [options] -m module [args]\n"
              "       torchrun --nproc-per-node N -m shardscope.run [options] train.py [args]",
        description="Run a DeepSpeed ZeRO-3 or PyTorch FSDP2 training script with the ShardScope "
                    "agent installed, the script unchanged: attach the inspector to each rank "
                    "(shardscope --attach job:NAME) and keep each rank's snapshot.",
        epilog="Each option also reads an environment variable (the command line wins): "
               + "; ".join(f"--{k.replace('_', '-')}: {v[0]}" for k, v in ENVIRONMENT.items())
               + ". The token itself: SHARDSCOPE_TOKEN, or the file named by "
                 "SHARDSCOPE_TOKEN_FILE; never on the command line.")
    p.add_argument("--backend", choices=["auto", "deepspeed", "fsdp"], default=None,
                   help="the sharding library the script uses (default: detected from the script)")
    p.add_argument("--snapshot-out", metavar="PATH",
                   help="write each rank's snapshot to PATH ({rank} is replaced by the rank; "
                        "a .gz name is gzip'd), at the end and when a violation ends the run")
    p.add_argument("--guard", choices=list(GUARDS), default=None,
                   help="warn (default): record an unregistered access and let the run go on; "
                        "error: raise UnregisteredAccessError with the fix at the first one")
    listen = p.add_mutually_exclusive_group()
    listen.add_argument("--listen", metavar="ENDPOINT",
                        help="unix:PATH or tcp:HOST:PORT (rank N serves PATH.rankN or PORT+N); "
                             "default: a private Unix socket per rank; a non-loopback host "
                             "needs a token")
    listen.add_argument("--no-listen", action="store_true",
                        help="serve no endpoint (the snapshot only)")
    p.add_argument("--token-file", metavar="FILE",
                   help="the endpoint's token, read from FILE (chmod 600)")
    p.add_argument("--job", metavar="NAME",
                   help="the job's name (default: TORCHELASTIC_RUN_ID, else MASTER_ADDR:MASTER_PORT)")
    p.add_argument("--version", action="store_true",
                   help="print the release and the releases it was tested with, and exit")
    return p


def version_text() -> str:
    """The release and the releases each agent was tested with (their internals tables)."""
    from . import _dsinternals, _fsdpinternals, _native

    return (f"shardscope {_native.__version__}\n"
            f"tested: DeepSpeed {', '.join(_dsinternals.TESTED_VERSIONS)} on torch "
            f"{', '.join(_dsinternals.TESTED_TORCH)}; FSDP2 on torch "
            f"{', '.join(_fsdpinternals.TESTED_TORCH)}\n"
            f"another release runs with a warning, and is refused only where a hook the agent "
            f"needs is missing (the message names it)\n")


# shardscope-run's options that take a value: the first word after them that is not one of
# them, or -m MODULE, starts the script's own command line.
_VALUED = ("--backend", "--snapshot-out", "--guard", "--listen", "--token-file", "--job")


def split_command_line(argv: Sequence[str]) -> Tuple[List[str], Optional[str], Optional[str], List[str]]:
    """(shardscope-run's options, the script, the module, the script's arguments): everything
    from the script (or -m MODULE) on belongs to the script, options included."""
    argv = list(argv)
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            rest = argv[i + 1:]
            return argv[:i], (rest[0] if rest else None), None, rest[1:]
        if word == "-m":
            if i + 1 >= len(argv):
                raise UsageError("-m needs the module to run (-m package.train)")
            return argv[:i], None, argv[i + 1], argv[i + 2:]
        if word.startswith("-m") and not word.startswith("--"):
            return argv[:i], None, word[2:], argv[i + 1:]
        if word.startswith("-"):
            i += 2 if word in _VALUED else 1
            continue
        return argv[:i], word, None, argv[i + 1:]
    return argv, None, None, []


def options_of(argv: Sequence[str], environ: Dict[str, str]) -> argparse.Namespace:
    """The command line, with each option the command line leaves out taken from its
    environment variable; raises UsageError for a bad value of either."""
    own, script, module, args = split_command_line(argv)
    ns = _parser().parse_args(own)
    ns.script, ns.module, ns.args = script, module, args
    for key, (variable, _what) in ENVIRONMENT.items():
        value = environ.get(variable)
        if getattr(ns, key, None) is None and value:
            if key == "listen" and value.lower() in ("none", "off", "no"):
                ns.no_listen = True
            else:
                setattr(ns, key, value)
    ns.backend = ns.backend or "auto"
    if ns.backend not in ("auto", "deepspeed", "fsdp"):
        raise UsageError(f"SHARDSCOPE_BACKEND={ns.backend!r}: use auto, deepspeed or fsdp")
    ns.guard = ns.guard or GUARDS[0]
    if ns.guard not in GUARDS:
        raise UsageError(f"SHARDSCOPE_GUARD={ns.guard!r}: use {' or '.join(GUARDS)}")
    return ns


def _check_rank(environ: Dict[str, str]) -> Optional[str]:
    """A usage error when a launcher started several processes without RANK; None otherwise."""
    if "RANK" in environ:
        return None
    for rank, size in _OTHER_LAUNCHERS:
        try:
            many = int(environ.get(size, "0") or 0) > 1
        except ValueError:
            many = False
        if rank in environ and many:
            return (f"{rank} is set but RANK is not: this launcher starts the ranks without "
                    f"torchrun's variables, so every process would take rank 0's endpoint and "
                    f"snapshot name. Start each node's ranks with torchrun inside the "
                    f"allocation (srun torchrun --nnodes N --nproc-per-node 8 ... -m "
                    f"shardscope.run train.py), or with DeepSpeed's own launcher (deepspeed "
                    f"--module shardscope.run train.py): both set RANK, LOCAL_RANK and WORLD_SIZE")
    return None


def _backend_of(ns: argparse.Namespace) -> str:
    from .check import CouldNotRun, detect_backend

    if ns.backend != "auto":
        return ns.backend
    path = ns.script
    if ns.module is not None:
        import importlib.util

        try:
            spec = importlib.util.find_spec(ns.module)
        except (ImportError, ValueError) as e:
            raise UsageError(f"cannot find the module {ns.module}: {e}") from None
        if spec is None or not spec.origin or not os.path.isfile(spec.origin):
            raise UsageError(f"cannot find the module {ns.module} on sys.path (it is run as "
                             f"python -m {ns.module} would run it)")
        path = spec.origin
    try:
        return detect_backend(path)
    except CouldNotRun as e:
        raise UsageError(str(e)) from None


def _install(backend: str, ns: argparse.Namespace) -> Any:
    if backend == "fsdp":
        from . import fsdp as agent
    else:
        from . import deepspeed as agent  # type: ignore[no-redef]
    listen: Any = False if ns.no_listen else ns.listen
    return agent.install(listen=listen, snapshot_out=ns.snapshot_out, guard=ns.guard,
                         token_file=ns.token_file, job=ns.job)


def main(argv: Optional[List[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        ns = options_of(argv, dict(os.environ))
        if ns.version:
            sys.stdout.write(version_text())
            return
        if ns.script is None and ns.module is None:
            raise UsageError("give the training script to run (shardscope-run [options] "
                             "train.py [args]) or a module (-m package.train)")
        if ns.script is not None and not os.path.isfile(ns.script):
            raise UsageError(f"{ns.script}: no such file (the training script comes after "
                             f"shardscope-run's own options)")
        problem = _check_rank(dict(os.environ))
        if problem:
            raise UsageError(problem)
        backend = _backend_of(ns)
        _install(backend, ns)
    except UsageError as e:
        sys.stderr.write(f"shardscope-run: {e}\n")
        sys.exit(USAGE_ERROR)
    except ShardScopeError as e:
        sys.stderr.write(f"shardscope-run: {e}\n")
        sys.exit(USAGE_ERROR)
    from . import _script

    if ns.module is not None:
        _script.run(ns.module, ns.args, module=True, launchers=[__file__])
    else:
        _script.run(ns.script, ns.args, launchers=[__file__])


if __name__ == "__main__":
    main()
