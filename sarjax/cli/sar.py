"""``sarjax sar``: SAR_{1-delta} of a saved pool (joint PGD greedy), on one device, a mesh or several processes."""

from __future__ import annotations

import argparse

from sarjax.cli.args import positive_int
from sarjax.runtime.compile_cache import add_compile_cache_argument


def _mesh_shape(s: str) -> tuple[int, int]:
    """``--devices pool=P,data=D`` (either may be left out: 1) as ``(P, D)``."""
    shape = {"pool": 1, "data": 1}
    for part in s.split(","):
        name, _, value = part.partition("=")
        if name.strip() not in shape or not value.strip().isdigit() or int(value) < 1:
            raise argparse.ArgumentTypeError(f"expected pool=P,data=D with positive integers, got {s!r}")
        shape[name.strip()] = int(value)
    return shape["pool"], shape["data"]


def cmd_sar(args: argparse.Namespace) -> int:
    """SAR of a saved pool."""
    if args.coordinator is not None or args.num_processes is not None or args.process_id is not None:
        from sarjax.cover.distributed import initialize

        auto = args.coordinator == "auto"  # TPU pod slice, Slurm, Open MPI: JAX reads the cluster's settings
        initialize(None if auto else args.coordinator, args.num_processes, args.process_id)  # before any JAX work
    if args.compile_cache:
        from sarjax.runtime.compile_cache import enable_compile_cache

        enable_compile_cache(args.compile_cache)
    from sarjax.experiments.demo import run_sar_on_saved_pool

    run_sar_on_saved_pool(
        args.pool,
        args.eps,
        args.delta,
        samples=args.samples,
        out=args.out,
        data_dir=args.data_dir,
        steps=args.steps,
        restarts=args.restarts,
        seed=args.seed,
        conv_impl=args.conv_impl,
        overwrite=args.overwrite,
        devices=args.devices,
    )
    return 0


def register(sub) -> None:
    """Add the ``sar`` subcommand to ``sub`` (an argparse subparsers object)."""
    s = sub.add_parser("sar", help="SAR_{1-delta} of a saved pool on MNIST or CIFAR test images (joint PGD greedy)")
    s.add_argument("--pool", required=True, help="pool directory written by train-pool")
    s.add_argument("--eps", type=float, required=True, help="linf budget, a finite float > 0 (the paper: 0.05)")
    s.add_argument("--delta", type=float, required=True, help="allowed uncovered share, in [0, 1)")
    s.add_argument(
        "--samples", type=positive_int, default=100, help="test images to attack, at most the test split (default 100)"
    )
    s.add_argument("--out", default="sarjax-sar", help="output directory (results.json, sar.png, arrays)")
    s.add_argument(
        "--data-dir",
        default=None,
        help="directory with MNIST IDX files or CIFAR-10 / CIFAR-100 python batches (default: the embedded MNIST)",
    )
    s.add_argument("--steps", type=positive_int, default=40, help="PGD steps (Table 1: 40)")
    s.add_argument("--restarts", type=positive_int, default=3, help="PGD restarts (Table 1: 3)")
    s.add_argument(
        "--conv-impl",
        choices=["im2col", "xla", "fused"],
        default=None,
        help="convolution formulation for the attack (default: the saved one; fused is the fastest on CPU)",
    )
    s.add_argument(
        "--seed", type=int, default=0, help="PRNG seed of the attacks: key = jax.random.key(SEED) (default 0)"
    )
    s.add_argument(
        "--overwrite",
        action="store_true",
        help="discard an earlier run in OUT (a rerun with the same settings resumes; other settings are refused)",
    )
    s.add_argument(
        "--devices",
        type=_mesh_shape,
        default=None,
        metavar="pool=P,data=D",
        help="shard the pool over P x D of this process's devices: members on P, each attack's batch on D "
        "(same result as one device; docs/cover.md)",
    )
    s.add_argument(
        "--coordinator",
        default=None,
        metavar="HOST:PORT",
        help="multi-process run on JAX's distributed runtime: process 0's address (with --num-processes, "
        "--process-id), or 'auto' on a TPU pod slice / Slurm / Open MPI job; each process attacks its block "
        "of the images, process 0 writes OUT",
    )
    s.add_argument("--num-processes", type=positive_int, default=None, help="processes in the run (--coordinator)")
    s.add_argument("--process-id", type=int, default=None, help="this process, 0 .. N-1 (--coordinator)")
    add_compile_cache_argument(s)
    s.set_defaults(func=cmd_sar)
