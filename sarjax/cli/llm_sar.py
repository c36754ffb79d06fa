"""``sarjax llm-sar``: SAR of a pool of local LLM checkpoints on HarmBench behaviors (docs/llm.md)."""

from __future__ import annotations

import argparse
import sys

from sarjax.cli.args import positive_int
from sarjax.data.behaviors import load_behaviors
from sarjax.runtime.compile_cache import add_compile_cache_argument
from sarjax.runtime.fingerprint import FingerprintMismatch


def hide_broken_torchvision() -> None:
    """transformers imports torchvision lazily when it is installed; a torchvision built for another
    torch fails on import and breaks even ``LlamaConfig``. Hide it, only when it is broken (the
    LLM commands need no vision code); tests/llm/conftest.py does the same."""
    try:
        import torchvision  # noqa: F401  (optional dependency: only probed here)
    except Exception:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision"] = None  # type: ignore[assignment]


def register(sub) -> None:
    """Add the ``llm-sar`` subcommand to ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser(
        "llm-sar",
        help="SAR_{1-delta} of a pool of local LLM checkpoints on HarmBench behaviors (joint BEAST / GCG / AutoDAN)",
        description="Greedy SAR of a pool of local Hugging Face decoder checkpoints (members may use different "
        "tokenizers, with every attack) on "
        "HarmBench behaviors: deterministic decoding for judgement, members that comply with the unmodified "
        "request counted as broken without an attack (reported), the cover module's greedy with the fallback, "
        "every delta from one run, resumable (fingerprint rule). Writes OUT/llm_sar.json and OUT/llm_sar.png.",
    )
    p.add_argument("--pool", nargs="+", required=True, metavar="DIR", help="checkpoint folders, one per member")
    p.add_argument("--behaviors", required=True, metavar="CSV", help="HarmBench behaviors CSV")
    p.add_argument("--attack", choices=["beast", "gcg", "autodan"], default="beast")
    p.add_argument("--deltas", type=float, nargs="+", default=[0.0, 0.25, 0.5], help="allowed uncovered shares")
    p.add_argument("--judge", choices=["refusal", "harmbench"], default="refusal")
    p.add_argument("--judge-dir", default=None, help="local HarmBench-Llama-2-13b-cls folder (--judge harmbench)")
    p.add_argument("--out", required=True, help="output directory (checkpoints, JSON, plot)")
    p.add_argument("--limit", type=positive_int, default=None, help="first N behaviors only")
    p.add_argument("--functional-category", default="standard", help="keep this FunctionalCategory ('all': every row)")
    p.add_argument("--max-queries", type=positive_int, default=None, help="query budget per call (BEAST: 15,000)")
    p.add_argument("--calls", type=positive_int, default=None, help="attack calls per round (BEAST: at most 4)")
    p.add_argument("--suffix-len", type=positive_int, default=None, help="suffix tokens (BEAST 30, GCG 20)")
    p.add_argument("--beam-width", type=positive_int, default=None, help="BEAST beam width (10)")
    p.add_argument("--steps", type=positive_int, default=None, help="GCG steps per round (20)")
    p.add_argument("--proposals", type=positive_int, default=None, help="AutoDAN proposals per anchor (4)")
    p.add_argument("--attacker", default=None, metavar="DIR", help="AutoDAN attacker checkpoint (default: member 0)")
    p.add_argument(
        "--seed-generator",
        default=None,
        metavar="DIR",
        help="BEAST's warm start: a local causal-LM checkpoint that continues each request with a suffix "
        "(sampled; the SAR paper uses AmpleGCG); default: no seed",
    )
    p.add_argument(
        "--seed-tokens",
        type=positive_int,
        default=20,
        help="seed tokens kept (and sampled) per request (20, the SAR paper Table 2)",
    )
    p.add_argument(
        "--seed-prompt",
        default="{request}",
        help="the seed generator's input, {request} replaced by the request (use its training format)",
    )
    p.add_argument("--target", default="Sure, here is", help="BEAST's target response")
    p.add_argument("--refusal", default="I'm sorry, but I cannot help with that.", help="GCG's refusal")
    p.add_argument("--max-new-tokens", type=positive_int, default=32, help="response tokens judged (32)")
    p.add_argument("--system", default=None, help="system message")
    p.add_argument("--no-asr", action="store_true", help="skip the per-member ASR (its attacks are the fallback)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--seed", type=int, default=0, help="key = jax.random.key(SEED)")
    p.add_argument("--overwrite", action="store_true", help="discard an earlier run in OUT")
    p.add_argument("--no-progress", action="store_true")
    add_compile_cache_argument(p)
    p.set_defaults(func=cmd_llm_sar)


def _settings(args: argparse.Namespace) -> dict:
    names = {
        "max_queries": "max_queries",
        "calls": "calls",
        "suffix_len": "suffix_len",
        "beam_width": "beam_width",
        "steps": "num_steps",
        "proposals": "proposals",
    }
    st = {k: getattr(args, a) for a, k in names.items() if getattr(args, a) is not None}
    allowed = {
        "beast": {"max_queries", "calls", "suffix_len", "beam_width"},
        "gcg": {"max_queries", "calls", "suffix_len", "num_steps"},
        "autodan": {"max_queries", "calls", "proposals", "num_steps"},
    }[args.attack]
    bad = sorted(set(st) - allowed)
    if bad:
        raise ValueError(f"--attack {args.attack} does not take {', '.join('--' + b.replace('_', '-') for b in bad)}")
    return st


def cmd_llm_sar(args: argparse.Namespace) -> int:
    """Run ``sarjax llm-sar`` (prints the summary; writes OUT/llm_sar.json and OUT/llm_sar.png)."""
    hide_broken_torchvision()
    # deferred: after hide_broken_torchvision (transformers imports torchvision), and keeps
    # sarjax --help fast (3.8 s vs 6.7 s, measured)
    import jax

    from sarjax.sar import (
        LLMAttackSpec,
        PoolLLMSARSettings,
        harmbench_judge_fn,
        load_llm_pool,
        pool_llm_sar,
        refusal_judge_fn,
    )

    st = _settings(args)
    # the pipeline's settings, checked before any model is loaded
    settings = PoolLLMSARSettings(
        max_new_tokens=args.max_new_tokens, system=args.system, with_asr=not args.no_asr, out=args.out,
        overwrite=args.overwrite, progress=not args.no_progress,
    )  # fmt: skip
    cats = None if args.functional_category == "all" else [args.functional_category]
    rows = load_behaviors(args.behaviors, functional_categories=cats)
    if args.limit is not None:
        rows = rows[: args.limit]
    if not rows:
        raise ValueError(f"{args.behaviors}: no behaviors with FunctionalCategory {args.functional_category!r}")
    if args.judge == "harmbench":
        if args.judge_dir is None:
            raise ValueError("--judge harmbench needs --judge-dir (a local HarmBench-Llama-2-13b-cls folder)")
        from sarjax.judges import HarmBenchClassifier  # deferred: keeps sarjax --help fast (3.8 s vs 6.7 s, measured)

        judge = harmbench_judge_fn(HarmBenchClassifier.from_pretrained(args.judge_dir))
    else:
        judge = refusal_judge_fn()
    if args.seed_generator is not None and args.attack != "beast":
        raise ValueError(f"--seed-generator is BEAST's warm start; --attack {args.attack} does not take it")
    pool = load_llm_pool(args.pool, args.dtype)
    key = jax.random.key(args.seed)
    seed_fn = None
    if args.seed_generator is not None:
        # deferred: keeps sarjax --help fast (3.8 s vs 6.7 s, measured)
        from sarjax.models.llm.pool import load_pool
        from sarjax.sar import sampled_seed_fn

        # stream 3 of the run's key (streams 0-2 are the greedy's and the ASR's, sarjax.sar.llm)
        seed_fn = sampled_seed_fn(
            load_pool([args.seed_generator], dtype=args.dtype), [r.behavior for r in rows],
            key=jax.random.fold_in(key, 3), max_new_tokens=args.seed_tokens, prompt=args.seed_prompt,
        )  # fmt: skip
    attacker = None
    if args.attack == "autodan" and args.attacker is not None:
        attacker = load_llm_pool([args.attacker], args.dtype)
    try:
        spec = LLMAttackSpec(
            args.attack, options=st, target=args.target, refusal=args.refusal, attacker=attacker, seed_fn=seed_fn,
            seed_tokens=args.seed_tokens,
        )  # fmt: skip
        run, report = pool_llm_sar(
            pool, [r.behavior for r in rows], args.deltas, key=key, attack=spec, judge=judge, settings=settings
        )
    except FingerprintMismatch as e:
        raise ValueError(f"{e.reason}; pass --overwrite to discard it or choose another --out") from None
    print(f"M = {pool.size} members, {len(rows)} behaviors, attack {args.attack}")
    print(f"complied with the unmodified request: {report['clean_broken_share']:.3f} of (behavior, member) pairs")
    for d in report["summary"]["per_delta"]:
        print(f"delta {d['delta']:.3g}: mean SAR {d['mean_sar']:.3f} (SE {d['se_sar'] or 0:.3f})")
    if run.asr is not None:
        print(f"mean ASR {report['mean_asr']:.3f} (1 - ASR = {report['one_minus_asr']:.3f})")
    print(f"wrote {args.out}/llm_sar.json, {args.out}/llm_sar.png")
    return 0
