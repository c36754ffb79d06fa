"""``sarjax train-pool``: train a diversity-preset pool on MNIST (or CIFAR files) and save it."""

from __future__ import annotations

import argparse
import dataclasses
import time

from sarjax.cli.args import nonnegative_float, positive_float, positive_int
from sarjax.data.cifar import cifar_kind, load_cifar
from sarjax.data.mnist import load_mnist
from sarjax.runtime.compile_cache import add_compile_cache_argument
from sarjax.runtime.compile_stats import count_compiles
from sarjax.runtime.provenance import provenance


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
    """Train a diversity-preset pool on MNIST and save it (the config in ``pool.json`` records the
    run's compilations under ``"compile"``: :meth:`~sarjax.runtime.compile_stats.CompileStats.to_json`)."""
    compiles = count_compiles()
    # deferred: keeps sarjax --help fast (3.8 s vs 6.7 s, measured)
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
    cifar = args.data_dir is not None and cifar_kind(args.data_dir) is not None
    data = load_cifar(args.data_dir) if cifar else load_mnist(args.data_dir)
    print(f"data: {data.summary()}")
    members = preset_members(args.preset, args.members, args.seed)
    if cifar:  # the preset architectures on 32x32x3 images and the data set's classes
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
        "compile": compiles.stop().to_json(),  # training and the accuracy above
        "provenance": provenance(),  # command, commit, machine, date, load
    }
    out = save_pool(pool, args.out, config)
    print(
        f"{pool}: mean test accuracy {acc.mean():.4f} (min {acc.min():.4f}, max {acc.max():.4f}) in {time.time() - t0:.0f}s"
    )
    print(f"saved to {out}")
    return 0


def register(sub) -> None:
    """Add the ``train-pool`` subcommand to ``sub`` (an argparse subparsers object)."""
    t = sub.add_parser("train-pool", help="train a diversity-preset pool on MNIST (or CIFAR files) and save it")
    t.add_argument("--preset", choices=["low", "medium", "high"], required=True, help="diversity preset (SAR paper)")
    t.add_argument("--out", required=True, help="output pool directory")
    t.add_argument(
        "--data-dir",
        default=None,
        help="directory with MNIST IDX files or CIFAR-10 / CIFAR-100 python batches (default: the embedded "
        "5,000 MNIST digits)",
    )
    t.add_argument("--members", type=positive_int, default=20, help="pool size M (default 20)")
    t.add_argument("--epochs", type=positive_int, default=10, help="maximum epochs (default 10)")
    t.add_argument("--batch-size", type=positive_int, default=32, help="per-member batch size (default 32)")
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
        "--eps", type=positive_float, default=None, help="training radius of pgd-at / trades (e.g. 0.1 linf)"
    )
    t.add_argument(
        "--attack-steps",
        type=positive_int,
        default=None,
        help="inner attack steps of pgd-at / trades (default 10, of eps/4 each)",
    )
    t.add_argument(
        "--trades-beta", type=nonnegative_float, default=None, help="TRADES' KL weight (default 6, the paper's)"
    )
    add_compile_cache_argument(t)
    t.set_defaults(func=cmd_train_pool)
