"""``sarjax demo``: SAR of the low / medium / high diversity pools on the embedded MNIST."""

from __future__ import annotations

import argparse

from sarjax.cli.args import positive_int
from sarjax.runtime.compile_cache import add_compile_cache_argument


def cmd_demo(args: argparse.Namespace) -> int:
    """SAR of the low / medium / high diversity pools on the embedded MNIST."""
    from sarjax.experiments.demo import run_demo  # deferred: keeps sarjax --help fast (3.8 s vs 6.7 s, measured)

    run_demo(
        args.out,
        quick=args.quick,
        cache_dir=args.cache,
        samples=args.samples,
        seed=args.seed,
        data_dir=args.data_dir,
        overwrite=args.overwrite,
    )
    return 0


def register(sub) -> None:
    """Add the ``demo`` subcommand to ``sub`` (an argparse subparsers object)."""
    d = sub.add_parser("demo", help="the main job: SAR of the three MNIST diversity pools (trains or loads them)")
    d.add_argument(
        "--out", default=None, help="output directory (default ./sarjax-demo, ./sarjax-demo-quick with --quick)"
    )
    d.add_argument(
        "--quick", action="store_true", help="3-minute version: 6 members, 2 epochs, 12 images, 20 steps, 1 restart"
    )
    d.add_argument("--cache", default=None, help="trained-pool cache directory (default OUT/pools)")
    d.add_argument(
        "--samples",
        type=positive_int,
        default=None,
        help="test images to attack, at most the test split (default 50, quick 12)",
    )
    d.add_argument(
        "--data-dir", default=None, help="directory with MNIST IDX files (default: the embedded 5,000 digits)"
    )
    d.add_argument("--seed", type=int, default=0)
    d.add_argument(
        "--overwrite",
        action="store_true",
        help="discard an earlier run in OUT (results, plots, checkpoints; the pool cache is kept and checked)",
    )
    add_compile_cache_argument(d)
    d.set_defaults(func=cmd_demo)
