"""``sarjax sar``: SAR_{1-delta} of a saved pool (joint PGD greedy), on one device, a mesh or several processes."""

from __future__ import annotations

import argparse

from sarjax.cli.args import (
    add_distributed_arguments,
    add_images_argument,
    add_model_argument,
    initialize_distributed,
    positive_int,
)
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
    """SAR of a saved pool (``--pool DIR``) or of the user's pool (``--model PKG.MODULE:FUNCTION``)."""
    if args.model and len(args.model) > 1:  # --pool / --model: run_sar_on_saved_pool checks one is given
        raise ValueError("give one pool: --pool DIR or --model PKG.MODULE:FUNCTION")
    initialize_distributed(args)  # before any JAX work
    # deferred: keeps sarjax --help fast (3.8 s vs 6.7 s, measured)
    from sarjax.experiments.sar import SavedPoolSARSettings, run_sar_on_saved_pool

    run_sar_on_saved_pool(
        args.pool,
        args.eps,
        args.delta,
        model=args.model[0] if args.model else None,
        images=args.images,
        data_dir=args.data_dir,
        samples=args.samples,
        out=args.out,
        settings=SavedPoolSARSettings(
            steps=args.steps,
            restarts=args.restarts,
            seed=args.seed,
            conv_impl=args.conv_impl,
            overwrite=args.overwrite,
            devices=args.devices,
        ),
    )
    return 0


def register(sub) -> None:
    """Add the ``sar`` subcommand to ``sub`` (an argparse subparsers object)."""
    s = sub.add_parser("sar", help="SAR_{1-delta} of a saved pool on MNIST or CIFAR test images (joint PGD greedy)")
    s.add_argument("--pool", default=None, help="pool directory written by train-pool or save_pool (or --model)")
    add_model_argument(s)
    add_images_argument(s)
    s.add_argument("--eps", type=float, required=True, help="linf budget, a finite float > 0 (the paper: 0.05)")
    s.add_argument("--delta", type=float, required=True, help="allowed uncovered share, in [0, 1)")
    s.add_argument(
        "--samples",
        type=positive_int,
        default=None,
        help="the first N images to attack (default 100 test images; every image of --images), "
        "at most the test split or the file",
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
    add_distributed_arguments(s)
    add_compile_cache_argument(s)
    s.set_defaults(func=cmd_sar)
