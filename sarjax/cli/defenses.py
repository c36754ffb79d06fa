"""``sarjax train-defenses``: train the defense zoo (:mod:`sarjax.defenses.zoo`) into a directory;
``sarjax zoo-pool``: save trained defenses (the self-ensemble included) as one pool checkpoint."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from pathlib import Path

from sarjax.runtime.compile_cache import enable_compile_cache
from sarjax.runtime.compile_stats import count_compiles
from sarjax.runtime.provenance import provenance


def register(sub) -> None:
    """Add the ``train-defenses`` subcommand to ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser(
        "train-defenses",
        help="train the MNIST defense zoo (PGD-AT, TRADES, l1-AT, noise, distillation, self-ensemble) and save it",
        description="Train the defense zoo of sarjax.defenses.zoo into OUT (one checkpoint per defense, "
        "zoo.json index, summary.json). Resumable: defenses already trained with the same fingerprint are "
        "skipped; ones trained with other settings are refused unless --overwrite.",
    )
    p.add_argument("--out", default=None, help="output directory (required unless --list)")
    p.add_argument("--data-dir", default=None, help="directory with MNIST IDX files (default: the embedded 5,000)")
    p.add_argument(
        "--only", nargs="+", default=None, metavar="NAME", help="train only these defenses (and a student's teacher)"
    )
    p.add_argument(
        "--quick", action="store_true", help="smoke run: 1 epoch on 256 images, 2-step attacks (not defenses)"
    )
    p.add_argument("--epochs", type=int, default=None, help="epochs of the zoo-architecture defenses (default 6)")
    p.add_argument("--self-ensemble-epochs", type=int, default=None, help="epochs of the self-ensemble (default 6)")
    p.add_argument("--overwrite", action="store_true", help="retrain defenses saved with other settings")
    p.add_argument("--list", action="store_true", help="list the zoo's defenses and their sources, then exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--no-compile-cache", action="store_true", help="do not keep XLA's compiled programs in OUT/.jax_cache"
    )
    p.set_defaults(func=cmd_train_defenses)

    q = sub.add_parser(
        "zoo-pool",
        help="save trained defenses (self-ensemble included) as one pool checkpoint for the --pool commands",
        description="Load defenses from a zoo trained by `sarjax train-defenses` and save them, each in its "
        "deterministic form (the self-ensemble and the noise defense without their noise), as ONE pool "
        "checkpoint that `sarjax sar`, `sarjax autoattack`, `sarjax frontier` ... take with --pool.",
    )
    q.add_argument("--zoo", required=True, help="the zoo directory (sarjax train-defenses --out DIR)")
    q.add_argument("--out", required=True, help="the pool directory to write")
    q.add_argument("--only", nargs="+", default=None, metavar="NAME", help="these defenses (default: all trained)")
    q.set_defaults(func=cmd_zoo_pool)


def cmd_train_defenses(args: argparse.Namespace) -> int:
    """Run ``sarjax train-defenses`` (prints progress, writes OUT/summary.json, prints the summary;
    ``"compile"``: the run's XLA compilations, :meth:`~sarjax.runtime.compile_stats.CompileStats.to_json`)."""
    from sarjax.defenses import zoo, zoo_train  # deferred: keeps sarjax --help fast (3.8 s vs 6.7 s, measured)

    if args.list:
        for d in zoo.DEFENSES:
            print(
                f"{d.name:22s} {d.arch:14s} {d.objective:22s} {d.norm or '-':5s} {d.eps if d.eps is not None else '-'}"
            )
            print(f"{'':22s} {d.source}")
        return 0
    if args.out is None:
        raise ValueError("--out is required (the directory to train the zoo into)")
    compiles = count_compiles()  # summary.json's "compile"
    settings = zoo_train.QUICK if args.quick else zoo_train.ZooSettings()
    for flag, fld in (("epochs", "epochs"), ("self_ensemble_epochs", "self_ensemble_epochs")):
        v = getattr(args, flag)
        if v is not None:
            if v < 1:
                raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {v}")
            settings = replace(settings, **{fld: v})
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        raise ValueError(f"--data-dir {args.data_dir!r} is not a directory")
    if not args.no_compile_cache:
        # the ramp's trainer calls compile the same program again: XLA's persistent cache under OUT reuses it
        enable_compile_cache(Path(args.out, ".jax_cache"))
    summary = zoo_train.train_defenses(
        args.out,
        only=args.only,
        data_dir=args.data_dir,
        settings=settings,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    summary["compile"] = compiles.stop().to_json()  # this run's XLA programs (CompileStats.to_json)
    summary["provenance"] = provenance()  # command, commit, machine, date, load
    Path(args.out, "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


def cmd_zoo_pool(args: argparse.Namespace) -> int:
    """Run ``sarjax zoo-pool`` (prints the pool's members and which are randomized when deployed)."""
    # deferred: keeps sarjax --help fast (3.8 s vs 6.7 s, measured)
    from sarjax.defenses import zoo_io
    from sarjax.models.checkpoint import load_pool_meta

    path = zoo_io.save_zoo_pool(args.zoo, args.out, args.only)
    meta = load_pool_meta(path)
    members = meta["config"]["members"]
    print(f"wrote {path}: {len(meta['names'])} member(s)")
    for n in meta["names"]:
        m = members[n]
        note = " (randomized when deployed: saved without its noise; attack it with EOT)" if m["stochastic"] else ""
        print(f"  {n}: clean acc {m['clean_acc']}{note}")
    return 0
