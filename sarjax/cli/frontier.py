"""``sarjax frontier``: attack and defense frontiers of saved pools (:mod:`sarjax.experiments.frontier`)."""

from __future__ import annotations

import argparse

from sarjax.cli.args import (
    add_distributed_arguments,
    add_images_argument,
    add_model_argument,
    initialize_distributed,
    positive_int,
)

# NORMS / ATTACK_NORMS build the parser, so sarjax --help loads this module (its heavy imports wait)
from sarjax.experiments.frontier import run_frontier_on_dirs
from sarjax.experiments.frontier_config import (
    ATTACK_NORMS,
    NORMS,
    FrontierAutoAttack,
    FrontierSettings,
    frontier_attacks,
    frontier_autoattack,
)
from sarjax.runtime.compile_cache import add_compile_cache_argument


def _names(arg: str | None) -> list[str] | None:
    """A comma-separated option as a list (None when not given)."""
    return [a for a in arg.split(",") if a] if arg else None


def cmd_frontier(args: argparse.Namespace) -> int:
    """Attack and defense frontiers of saved pools (the frontier paper)."""
    initialize_distributed(args)  # before any JAX computation
    attacks = frontier_attacks(
        args.norm,
        attacks=_names(args.attacks),
        restarts=args.restarts,
        targeted=args.targeted,
        cap=args.cap,
        init_eps=args.init_eps,
    )
    autoattack = None
    if args.autoattack:
        autoattack = frontier_autoattack(
            attacks=_names(args.aa_attacks), n_iter=args.aa_iter, square_queries=args.aa_square, eps_ref=args.eps_ref
        )
    elif args.eps_ref is not None:
        FrontierAutoAttack(eps_ref=args.eps_ref)  # checked as before, though only --autoattack reads it
    settings = FrontierSettings(
        tiers=tuple(args.tiers),
        heldout=args.heldout,
        batch=args.batch,
        seed=args.seed,
        overwrite=args.overwrite,
        progress=not args.no_progress,
        chains=args.chain_updates,
        keep_points=not args.no_points,
    )
    run_frontier_on_dirs(
        args.models or [],
        attacks,
        out=args.out,
        model_specs=args.model,
        images=args.images,
        samples=args.samples,
        data_dir=args.data_dir,
        defenses=_names(args.defenses),
        autoattack=autoattack,
        settings=settings,
    )
    return 0


def register(sub) -> None:
    """Add the ``frontier`` subcommand to the ``sarjax`` parser's subparsers."""
    f = sub.add_parser(
        "frontier",
        help="attack pool with trajectories on saved pools, nested ensembles (Algorithm 1), AOI / DOI (the frontier paper)",
    )
    f.add_argument(
        "--models",
        nargs="+",
        default=None,
        metavar="DIR",
        help="pool directories written by train-pool or defense zoos (and / or --model)",
    )
    add_model_argument(f)
    f.add_argument("--norm", choices=NORMS, required=True, help="threat model")
    f.add_argument(
        "--tiers",
        type=int,
        nargs="+",
        default=[4000, 8000, 12000],
        help="nested budget tiers Q (the frontier paper: 4k 8k 12k)",
    )
    f.add_argument(
        "--heldout", type=float, default=13 / 30, help="held-out share of the models (the frontier paper: 13 of 30)"
    )
    f.add_argument(
        "--samples",
        type=positive_int,
        default=None,
        help="the first N images (default: 1000 MNIST test images, the frontier paper; every image of --images)",
    )
    f.add_argument("--out", required=True, help="output directory (frontier.json, plots, cache/)")
    f.add_argument("--cap", type=int, default=1000, help="per-attack cap T in queries (the frontier paper: 1000)")
    f.add_argument("--restarts", type=int, default=5, help="random restarts per attack (the frontier paper: 5)")
    f.add_argument(
        "--targeted", type=int, default=9, help="targeted runs per attack, top-k classes (the frontier paper: 9)"
    )
    f.add_argument(
        "--attacks",
        default=None,
        help="comma-separated subset of the norm's attacks (" + ", ".join(ATTACK_NORMS) + "; default all)",
    )
    f.add_argument(
        "--init-eps", type=float, default=None, help="radius of the restarts' random starts (default per norm)"
    )
    f.add_argument(
        "--defenses", default=None, help="comma-separated defenses of the zoo directories in --models (default all)"
    )
    f.add_argument("--batch", type=int, default=250, help="samples per attack call")
    f.add_argument("--data-dir", default=None, help="directory with MNIST IDX files (default: embedded)")
    add_images_argument(f)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--overwrite", action="store_true", help="discard cached attack runs in OUT/cache")
    f.add_argument("--no-progress", action="store_true", help="no progress bar")
    f.add_argument(
        "--autoattack", action="store_true", help="also run AutoAttack on an eps grid and score it as a curve"
    )
    f.add_argument("--eps-ref", type=float, default=None, help="AutoAttack's reference eps (added to its grid)")
    f.add_argument("--aa-attacks", default=None, help="AutoAttack stages (e.g. apgd-ce,apgd-t; default standard)")
    f.add_argument("--aa-iter", type=int, default=100, help="AutoAttack APGD/FAB iterations (AutoAttack: 100)")
    f.add_argument("--aa-square", type=int, default=5000, help="AutoAttack Square queries (AutoAttack: 5000)")
    f.add_argument(
        "--chain-updates",
        action="store_true",
        help="Algorithm 1 also takes the least feasible completion of updates the structural constraints forbid "
        "(ours; default: as published, docs/frontier.md)",
    )
    f.add_argument(
        "--no-points",
        action="store_true",
        help="do not keep the adversarial points in the cache (huge runs; load_points then has nothing to read)",
    )
    add_distributed_arguments(f)
    add_compile_cache_argument(f)
    f.set_defaults(func=cmd_frontier)
