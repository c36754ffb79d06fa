"""``sarjax llm-demo``: train an offline LLM pool, distil it, SAR before / after (:mod:`sarjax.experiments.llm_demo`)."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from sarjax.cli.llm_sar import hide_broken_torchvision
from sarjax.runtime.compile_cache import add_compile_cache_argument

HARMBENCH_ENV = "SARJAX_HARMBENCH_DIR"  # a folder with the HarmBench behavior CSVs


def register(sub) -> None:
    """Add the ``llm-demo`` subcommand to ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser(
        "llm-demo",
        help="train 6 small Llama/Qwen2 LMs + a teacher on CPU, distil, SAR and ASR before/after (joint BEAST)",
        description="The offline LLM demo of the SAR paper's distillation claim: a corpus of templated benign "
        "instructions and HarmBench behaviors with refusals, a pool of M = 6 small decoders (Llama and Qwen2, two "
        "sizes, different seeds and data mixes), a teacher, descendants fine-tuned on the teacher's trajectories, "
        "then SAR and per-member ASR of both pools with joint BEAST on held-out behaviors. Pools are written as "
        "Hugging Face checkpoint folders (OUT/pool_before/*, OUT/pool_after/*), readable by sarjax llm-sar.",
    )
    p.add_argument("--out", default="sarjax-llm-demo", help="output directory (default ./sarjax-llm-demo)")
    p.add_argument(
        "--train-behaviors",
        default=None,
        metavar="CSV",
        help=f"HarmBench CSV of the training behaviors (default: harmbench_behaviors_text_test.csv in "
        f"${HARMBENCH_ENV})",
    )
    p.add_argument(
        "--eval-behaviors",
        default=None,
        metavar="CSV",
        help=f"HarmBench CSV of the held-out behaviors (default: harmbench_behaviors_text_val.csv in ${HARMBENCH_ENV})",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: a few steps, 2 behaviors (not a result)")
    p.add_argument("--eval", type=int, default=None, help="held-out behaviors attacked (default 12)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="discard an earlier run in OUT")
    p.add_argument("--no-progress", action="store_true")
    add_compile_cache_argument(p)
    p.set_defaults(func=cmd_llm_demo)


def cmd_llm_demo(args: argparse.Namespace) -> int:
    """Run ``sarjax llm-demo`` (prints the stages and the verdict; writes OUT/demo.json)."""
    hide_broken_torchvision()
    # deferred: after hide_broken_torchvision (transformers imports torchvision), and keeps
    # sarjax --help fast (3.8 s vs 6.7 s, measured)
    from sarjax.experiments.llm_demo import QUICK, DemoSettings, run_demo

    base = os.environ.get(HARMBENCH_ENV)
    if base is None and (args.train_behaviors is None or args.eval_behaviors is None):
        raise ValueError(
            f"pass --train-behaviors and --eval-behaviors, or set {HARMBENCH_ENV} to a folder with the HarmBench CSVs"
        )
    train = args.train_behaviors or os.path.join(base or "", "harmbench_behaviors_text_test.csv")
    evals = args.eval_behaviors or os.path.join(base or "", "harmbench_behaviors_text_val.csv")
    for f in (train, evals):
        if not os.path.isfile(f):
            raise ValueError(f"no behaviors CSV at {f}: pass --train-behaviors / --eval-behaviors")
    st = QUICK if args.quick else DemoSettings()
    if args.eval is not None:
        if args.eval < 1:
            raise ValueError(f"--eval must be >= 1, got {args.eval}")
        st = replace(st, eval_behaviors=args.eval)
    res = run_demo(
        args.out, train, evals, settings=st, seed=args.seed, overwrite=args.overwrite, progress=not args.no_progress
    )
    print("delta   SAR before  SAR after")
    for r in res["sar"]:
        print(f"{r['delta']:<7g} {r['sar_before']:.3f}       {r['sar_after']:.3f}")
    o = res["one_minus_asr"]
    print(f"1 - ASR: before {o['before']:.3f}, after {o['after']:.3f}")
    c = res["claim"]
    print(
        f"claim (SAR falls after distillation, more than 1 - ASR): {'holds' if c['holds'] else 'does not hold'} "
        f"here (falls: {c['sar_falls_after_distillation']}, more: {c['sar_falls_more_than_individual_robustness']})"
    )
    print(f"total {res['times_s']['total']:.0f} s (load average {res['load_avg'][0]:.1f}); wrote {args.out}/demo.json")
    return 0
