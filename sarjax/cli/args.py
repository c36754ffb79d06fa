"""The argument types the ``sarjax`` commands share."""

from __future__ import annotations

import argparse


def positive_int(s: str) -> int:
    """An argparse type: an integer >= 1."""
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {s}")
    return v


def positive_float(s: str) -> float:
    """An argparse type: a finite float > 0."""
    v = float(s)
    if not (v > 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {s}")
    return v


def nonnegative_float(s: str) -> float:
    """An argparse type: a finite float >= 0."""
    v = float(s)
    if not (v >= 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {s}")
    return v


def add_model_argument(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    """``--model PKG.MODULE:FUNCTION`` (repeatable, dest ``model``): a function returning a Pool."""
    parser.add_argument(
        "--model",
        action="append",
        default=None,
        required=required,
        metavar="PKG.MODULE:FUNCTION",
        help="a function returning a sarjax.models.Pool (your own models: flax, nnx, PyTorch, plain "
        "functions); the module must be importable (installed or on PYTHONPATH); frontier takes it repeated "
        "for several pools",
    )


def add_images_argument(parser: argparse.ArgumentParser) -> None:
    """``--images FILE.npz`` (dest ``images``): the user's images (:mod:`sarjax.data.images`)."""
    parser.add_argument(
        "--images",
        default=None,
        metavar="FILE.npz",
        help="attack your own images: an .npz with x [N, H, W, C] in [0, 1], y [N] labels and optional ids [N] "
        "(instead of the embedded MNIST or --data-dir)",
    )


def coordinator(s: str) -> str:
    """An argparse type: ``HOST:PORT`` (port in 1..65535; ``[IPv6]:PORT``) or ``auto``, returned as given.

    Raises:
        argparse.ArgumentTypeError: no host, no port or a port outside 1..65535 (naming the value).
    """
    if s == "auto":
        return s
    from sarjax.runtime.distributed import parse_coordinator  # imports jax: only when --coordinator is given

    try:
        parse_coordinator(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e} (or 'auto')") from None
    return s


def add_distributed_arguments(parser: argparse.ArgumentParser) -> None:
    """``--coordinator HOST:PORT|auto``, ``--num-processes N``, ``--process-id I``, ``--coordinator-timeout S``
    (JAX's distributed runtime)."""
    parser.add_argument(
        "--coordinator",
        type=coordinator,
        default=None,
        metavar="HOST:PORT",
        help="multi-process run on JAX's distributed runtime: process 0's address (with --num-processes, "
        "--process-id), or 'auto' on a TPU pod slice / Slurm / Open MPI job; every process runs the same command "
        "and its share of the work, results are gathered (bit-identical to one process), process 0 writes OUT",
    )
    parser.add_argument("--num-processes", type=positive_int, default=None, help="processes in the run (--coordinator)")
    parser.add_argument("--process-id", type=int, default=None, help="this process, 0 .. N-1 (--coordinator)")
    parser.add_argument(
        "--coordinator-timeout",
        type=positive_int,
        default=None,
        metavar="SECONDS",
        help="give up joining the distributed runtime after this many seconds: the coordinator not reachable or "
        "a process missing (default 300, JAX's)",
    )


def initialize_distributed(args: argparse.Namespace) -> None:
    """Join JAX's distributed runtime when any of ``--coordinator / --num-processes / --process-id`` is given.

    ``--coordinator auto`` lets JAX read the cluster's settings (TPU pod slice, Slurm, Open MPI).
    ``--coordinator-timeout S`` (default :data:`sarjax.runtime.distributed.COORDINATOR_TIMEOUT`,
    300 s) bounds the wait for the coordinator and the other processes; a line on stderr says what
    is awaited. Call it before any JAX computation.

    Raises:
        ValueError: ``--coordinator-timeout`` without the distributed options, or what
            :func:`sarjax.runtime.distributed.initialize` raises.
    """
    timeout = getattr(args, "coordinator_timeout", None)
    if args.coordinator is None and args.num_processes is None and args.process_id is None:
        if timeout is not None:
            raise ValueError("--coordinator-timeout bounds joining the distributed runtime: give --coordinator too")
        return
    import sys

    from sarjax.runtime.distributed import COORDINATOR_TIMEOUT, initialize  # imports jax: kept out of `sarjax --help`

    timeout = COORDINATOR_TIMEOUT if timeout is None else timeout
    auto = args.coordinator == "auto"
    where = "the cluster's coordinator" if auto else f"coordinator {args.coordinator}"
    who = "" if args.process_id is None else f" as process {args.process_id} of {args.num_processes}"
    print(
        f"joining JAX's distributed runtime ({where}){who}; giving up after {timeout} s (--coordinator-timeout)",
        file=sys.stderr,
        flush=True,
    )
    initialize(None if auto else args.coordinator, args.num_processes, args.process_id, timeout=timeout)
