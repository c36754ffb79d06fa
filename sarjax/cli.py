"""The ``sarjax`` command line."""

from __future__ import annotations

import argparse
import sys
import time

from sarjax.runtime.compile_cache import add_compile_cache_argument


def _positive_int(s: str) -> int:
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {s}")
    return v


def _positive_float(s: str) -> float:
    v = float(s)
    if not (v > 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {s}")
    return v


def _nonnegative_float(s: str) -> float:
    v = float(s)
    if not (v >= 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {s}")
    return v


def _check_train_pool(args: argparse.Namespace) -> str | None:
    """The train-pool flags that go together (None if fine, else the error message)."""
    adv = args.objective != "standard"
    if adv and args.eps is None:
        return f"--objective {args.objective} needs --eps (the training radius, e.g. 0.1 for linf)"
    if not adv and (args.eps is not None or args.attack_steps is not None or args.trades_beta is not None):
        return "--eps, --attack-steps and --trades-beta need --objective pgd-at or trades"
    if args.trades_beta is not None and args.objective != "trades":
        return "--trades-beta needs --objective trades"
    return None


def cmd_train_pool(args: argparse.Namespace) -> int:
    """Train a diversity-preset pool on MNIST and save it."""
    import jax  # noqa: F401  (import late: --help stays fast)

    from sarjax.data.mnist import load_mnist
    from sarjax.defenses import make_objective, objective_spec
    from sarjax.models.checkpoint import save_pool
    from sarjax.models.presets import preset_members, preset_names
    from sarjax.models.train import TrainConfig, train_pool

    problem = _check_train_pool(args)
    if problem is not None:
        raise ValueError(problem)
    objective = make_objective(
        args.objective, eps=args.eps, norm=args.norm, steps=args.attack_steps, beta=args.trades_beta
    )
    from sarjax.data.cifar import cifar_kind, load_cifar

    cifar = args.data_dir is not None and cifar_kind(args.data_dir) is not None
    data = load_cifar(args.data_dir) if cifar else load_mnist(args.data_dir)
    print(f"data: {data.summary()}")
    members = preset_members(args.preset, args.members, args.seed)
    if cifar:  # the preset architectures on 32x32x3 images and the data set's classes
        import dataclasses

        classes = len(getattr(data, "label_names", ())) or int(max(data.y_train.max(), data.y_test.max())) + 1
        shape = tuple(data.x_train.shape[1:])
        members = [(dataclasses.replace(a, input_shape=shape, num_classes=classes), c) for a, c in members]
    cfg = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, patience=args.patience)
    t0 = time.time()
    if objective is not None:
        print(f"objective: {objective_spec(objective)}")
    pool, info = train_pool(
        members,
        data.x_train,
        data.y_train,
        config=cfg,
        names=preset_names(args.preset, args.members),
        objective=objective,
    )
    acc = pool.accuracy(data.x_test, data.y_test)
    config = {
        "preset": args.preset,
        "members": args.members,
        "seed": args.seed,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "patience": args.patience,
        "data": data.source,
        "objective": objective_spec(objective),
        "member_configs": [vars(c) for _, c in members],
        "history": info,
        "test_accuracy": acc.tolist(),
        "mean_test_accuracy": float(acc.mean()),
        "train_seconds": time.time() - t0,
    }
    out = save_pool(pool, args.out, config)
    print(
        f"{pool}: mean test accuracy {acc.mean():.4f} (min {acc.min():.4f}, max {acc.max():.4f}) in {time.time() - t0:.0f}s"
    )
    print(f"saved to {out}")
    return 0


def _version() -> str:
    """The installed sarjax version (pyproject.toml's ``version``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sarjax")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sarjax", description="Systemic adversarial robustness of model pools, in JAX.")
    p.add_argument("--version", action="version", version=f"sarjax {_version()}")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train-pool", help="train a diversity-preset pool on MNIST (or CIFAR files) and save it")
    t.add_argument("--preset", choices=["low", "medium", "high"], required=True, help="diversity preset (SAR paper)")
    t.add_argument("--out", required=True, help="output pool directory")
    t.add_argument(
        "--data-dir",
        default=None,
        help="directory with MNIST IDX files or CIFAR-10 / CIFAR-100 python batches (default: the embedded "
        "5,000 MNIST digits)",
    )
    t.add_argument("--members", type=_positive_int, default=20, help="pool size M (default 20)")
    t.add_argument("--epochs", type=_positive_int, default=10, help="maximum epochs (default 10)")
    t.add_argument("--batch-size", type=_positive_int, default=32, help="per-member batch size (default 32)")
    t.add_argument("--patience", type=int, default=3, help="early-stopping patience in epochs (0 = off)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument(
        "--objective",
        choices=["standard", "pgd-at", "trades"],
        default="standard",
        help="training objective: standard cross-entropy, PGD-AT (Madry et al. 2018) or TRADES "
        "(Zhang et al. 2019); adversarial ones need --eps (docs/defenses.md)",
    )
    t.add_argument("--norm", choices=["linf", "l2"], default="linf", help="threat model of the adversarial objective")
    t.add_argument(
        "--eps", type=_positive_float, default=None, help="training radius of pgd-at / trades (e.g. 0.1 linf)"
    )
    t.add_argument(
        "--attack-steps",
        type=_positive_int,
        default=None,
        help="inner attack steps of pgd-at / trades (default 10, of eps/4 each)",
    )
    t.add_argument(
        "--trades-beta", type=_nonnegative_float, default=None, help="TRADES' KL weight (default 6, the paper's)"
    )
    t.set_defaults(func=cmd_train_pool)

    for register in _EXTRA_COMMANDS:
        register(sub)
    __import__("sarjax.cli_defenses", fromlist=["register"]).register(sub)  # sarjax train-defenses
    __import__("sarjax.cli_autoattack", fromlist=["register"]).register(sub)  # sarjax autoattack
    __import__("sarjax.cli_frontier", fromlist=["register"]).register(sub)  # sarjax frontier
    __import__("sarjax.cli_llm_sar", fromlist=["register"]).register(sub)  # sarjax llm-sar
    __import__("sarjax.cli_llm_demo", fromlist=["register"]).register(sub)  # sarjax llm-demo
    return p


def cmd_demo(args: argparse.Namespace) -> int:
    """SAR of the low / medium / high diversity pools on the embedded MNIST."""
    from sarjax.demo import run_demo

    if args.compile_cache:
        from sarjax.runtime.compile_cache import enable_compile_cache

        enable_compile_cache(args.compile_cache)
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
    from sarjax.demo import run_sar_on_saved_pool

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


def _register_demo(sub) -> None:
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
        type=_positive_int,
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

    s = sub.add_parser("sar", help="SAR_{1-delta} of a saved pool on MNIST or CIFAR test images (joint PGD greedy)")
    s.add_argument("--pool", required=True, help="pool directory written by train-pool")
    s.add_argument("--eps", type=float, required=True, help="linf budget, a finite float > 0 (the paper: 0.05)")
    s.add_argument("--delta", type=float, required=True, help="allowed uncovered share, in [0, 1)")
    s.add_argument(
        "--samples", type=_positive_int, default=100, help="test images to attack, at most the test split (default 100)"
    )
    s.add_argument("--out", default="sarjax-sar", help="output directory (results.json, sar.png, arrays)")
    s.add_argument(
        "--data-dir",
        default=None,
        help="directory with MNIST IDX files or CIFAR-10 / CIFAR-100 python batches (default: the embedded MNIST)",
    )
    s.add_argument("--steps", type=_positive_int, default=40, help="PGD steps (Table 1: 40)")
    s.add_argument("--restarts", type=_positive_int, default=3, help="PGD restarts (Table 1: 3)")
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
    s.add_argument("--num-processes", type=_positive_int, default=None, help="processes in the run (--coordinator)")
    s.add_argument("--process-id", type=int, default=None, help="this process, 0 .. N-1 (--coordinator)")
    add_compile_cache_argument(s)
    s.set_defaults(func=cmd_sar)


_EXTRA_COMMANDS: list = [_register_demo]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"sarjax {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
