"""``sarjax plan``: per-device memory, FLOPs and a projected time of an attack run before renting it.

The command gives this process as many fake CPU devices as the target has (before JAX starts its
backend) and compiles the attack's step there with abstract shapes (:mod:`sarjax.experiments.plan`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sarjax.cli.args import add_model_argument, positive_float, positive_int
from sarjax.cli.autoattack import N_ITER, SQUARE_QUERIES
from sarjax.runtime.compile_stats import count_compiles
from sarjax.runtime.devices import DEVICES
from sarjax.runtime.provenance import provenance


def _shape(s: str) -> tuple[int, ...]:
    """``H,W,C`` as a tuple of positive ints."""
    parts = s.split(",")
    if not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected H,W,C positive integers, got {s!r}")
    return tuple(int(p) for p in parts)


def cmd_plan(args: argparse.Namespace) -> int:
    """Size the attack; print the plan; write ``--out`` JSON when given (``"compile"``: the XLA
    programs the plan compiled, :meth:`~sarjax.runtime.compile_stats.CompileStats.to_json`)."""
    given = [n for n, v in (("--zoo", args.zoo), ("--pool", args.pool), ("--model", args.model),
                            ("--llm-config", args.llm_config)) if v]  # fmt: skip
    if len(given) != 1:
        raise ValueError(
            f"give one pool: --zoo NAME:M, --pool DIR, --model PKG.MODULE:FUNCTION or --llm-config FILE..., got {given or 'none'}"
        )
    if args.device not in DEVICES:
        raise ValueError(f"unknown device {args.device!r}: expected one of {sorted(DEVICES)}")
    if args.out and Path(args.out).exists() and not args.overwrite:
        raise ValueError(f"{args.out} exists (a plan never overwrites a file it did not write: --overwrite)")
    from sarjax.experiments import plan as PL  # deferred: imports jax

    PL.use_fake_devices(args.devices)  # first: before anything starts JAX's backend
    compiles = count_compiles()  # the JSON's "compile": the programs the plan compiled to measure them
    settings = PL.PlanSettings(
        attack=args.attack, batch=args.batch, device=args.device, devices=args.devices, mesh=args.mesh,
        samples=args.samples, rounds=args.rounds, steps=args.steps, restarts=args.restarts, eps=args.eps,
        n_iter=args.n_iter, targets=args.targets, square_queries=args.square_queries, gcg_steps=args.gcg_steps,
        topk=args.topk, candidates=args.candidates, suffix_len=args.suffix_len, prompt_len=args.prompt_len,
        after_len=args.after_len, target_len=args.target_len, precision=args.precision,
        memory_fraction=args.memory_fraction, fit_batch=not args.no_fit_batch, llm_cost=args.llm_cost,
    )  # fmt: skip
    settings.check()
    pool = llm = None
    if args.llm_config:
        llm = PL.llm_configs(args.llm_config)
    elif args.zoo:
        pool = PL.zoo_pool(args.zoo, args.input_shape, args.classes)
    else:
        # deferred, as every command's library imports: keeps sarjax --help fast
        from sarjax.models.builders import load_model
        from sarjax.models.checkpoint import load_pool

        pool = PL.pool_shapes(load_model(args.model[0]) if args.model else load_pool(args.pool))
    result = PL.plan(settings, pool=pool, llm=llm, dtype=args.dtype, log=print)
    result["compile"] = compiles.stop().to_json()
    result["provenance"] = provenance()  # command, commit, machine, date, load
    print(PL.report(result))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {args.out}")
    return 0


def register(sub) -> None:
    """Add the ``plan`` subcommand to ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser(
        "plan",
        help="size an attack run before renting: per-device memory, FLOPs, largest batch and a projected time "
        "(compiled on fake CPU devices with abstract shapes; docs/scale.md)",
    )
    p.add_argument("--zoo", default=None, metavar="NAME:M",
                   help="a pool of M members: low, medium, high (the diversity presets, 28x28x1) or wrn-DEPTH-WIDTH "
                   "(RobustBench's DMWideResNet shape, 32x32x3), e.g. wrn-28-10:20")  # fmt: skip
    p.add_argument("--pool", default=None, help="a saved pool directory (train-pool / save_pool)")
    add_model_argument(p)
    p.add_argument("--llm-config", nargs="+", default=None, metavar="CONFIG.JSON",
                   help="Hugging Face config.json files (or folders), one per member: an LLM pool (joint-gcg)")  # fmt: skip
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="LLM parameter dtype")
    p.add_argument("--input-shape", type=_shape, default=None, metavar="H,W,C", help="--zoo input shape")
    p.add_argument("--classes", type=positive_int, default=10, help="--zoo class count (default 10)")
    p.add_argument("--attack", choices=["joint-pgd", "autoattack", "joint-gcg"], default="joint-pgd")
    p.add_argument("--batch", type=positive_int, default=128, help="samples (requests) per attack call, global")
    p.add_argument("--device", default="h100-80gb", help=f"target device: {', '.join(sorted(DEVICES))}")
    p.add_argument("--devices", type=positive_int, default=1, help="devices in the target (fake CPU devices here)")
    p.add_argument("--mesh", default=None, metavar="pool=P,data=D[,model=T]",
                   help="the run's mesh (default: data takes every device the other axes leave)")  # fmt: skip
    p.add_argument("--samples", type=positive_int, default=1000, help="samples in the run (chunks of --batch)")
    p.add_argument("--rounds", type=positive_int, default=1,
                   help="greedy cover rounds of a SAR run (at most the member count)")  # fmt: skip
    p.add_argument("--steps", type=positive_int, default=40, help="joint PGD steps (the SAR paper: 40)")
    p.add_argument("--restarts", type=positive_int, default=3, help="joint PGD restarts (the SAR paper: 3)")
    p.add_argument("--eps", type=positive_float, default=8 / 255, help="linf radius (default 8/255)")
    p.add_argument("--n-iter", type=positive_int, default=N_ITER, help=f"AutoAttack APGD / FAB iterations ({N_ITER})")
    p.add_argument("--targets", type=positive_int, default=9, help="AutoAttack APGD-T / FAB-T targets (9)")
    p.add_argument(
        "--square-queries",
        type=positive_int,
        default=SQUARE_QUERIES,
        help=f"AutoAttack Square queries ({SQUARE_QUERIES:,})",
    )
    p.add_argument("--gcg-steps", type=positive_int, default=20, help="joint GCG steps per round (20)")
    p.add_argument("--topk", type=positive_int, default=256, help="joint GCG top-k (256)")
    p.add_argument("--candidates", type=positive_int, default=64, help="joint GCG candidates per step (64)")
    p.add_argument("--suffix-len", type=positive_int, default=20, help="joint GCG suffix tokens (20)")
    p.add_argument("--prompt-len", type=positive_int, default=64, help="LLM tokens before the suffix (64)")
    p.add_argument("--after-len", type=int, default=8, help="LLM tokens between suffix and target (8)")
    p.add_argument("--target-len", type=positive_int, default=16, help="LLM target / refusal tokens (16)")
    p.add_argument("--precision", choices=["auto", "fp32", "tf32", "bf16"], default="auto",
                   help="datasheet peak of the roofline (auto: bf16 for bfloat16 params, else fp32)")  # fmt: skip
    p.add_argument("--memory-fraction", type=positive_float, default=0.75,
                   help="share of device memory the run may use (JAX's GPU default preallocation: 0.75)")  # fmt: skip
    p.add_argument("--llm-cost", choices=["layers", "unroll"], default="layers",
                   help="an LLM step's FLOPs: layers (unrolled at 2 and 3 layers, linear in the layer count; exact "
                   "for identical layers) or unroll (every layer unrolled: minutes at 32 layers)")  # fmt: skip
    p.add_argument("--no-fit-batch", action="store_true", help="skip the largest-batch search (2 fewer compiles)")
    p.add_argument("--out", default=None, help="write the plan as JSON here")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    p.set_defaults(func=cmd_plan)
