"""LLM pool throughput: sarjax (JAX, stacked + vmapped) vs transformers (PyTorch loop over members).

1. Candidate scoring: per-token target NLL of N candidate prompts for every
   member of an M-member pool of the same small Llama (the BEAST/GCG inner loop).
   sarjax: one compiled call for the whole stack; PyTorch: a loop over members, one batched
   forward each. The shared-prompt-prefix variant gives BOTH sides a prefix cache: sarjax's
   ``stack_prefix_cache``, and for transformers the prefix's ``past_key_values`` (one forward of
   the prefix per member, repeated over the candidates), each rebuilt on every call, and its
   ratio is taken against that cached PyTorch loop (a cache on one side only is not a fair
   comparison, issue 43).
2. Greedy decoding tokens/s: sarjax's KV-cache ``stack_greedy_generate`` vs
   transformers' ``generate(do_sample=False)`` looped over members.

Both sides are measured alternately in the same run on the same CPU; PyTorch runs
at every thread count of ``--threads`` (default 1 and 2) in the same rotation,
and the ratio is taken against the FASTEST of them (the baseline a careful
PyTorch user would pick). Medians, ratios, the machine and its load average
are printed and written as JSON (``--out``; default a temporary folder), with the run's provenance
(command, commit, machine, date, load).

    python benchmarks/llm_throughput.py --reps 5 --out benchmarks/results/llm_throughput.json
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault(
    "OMP_WAIT_POLICY", "PASSIVE"
)  # torch threads must not spin on a shared CPU (joint_attack_throughput.py)
import platform
import sys
import tempfile
import time


def _hide_broken_torchvision():
    """A torchvision built for another torch fails on import and breaks transformers' lazy
    imports; hide it (only when it is broken) since no vision code is needed here."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision"] = None


_hide_broken_torchvision()
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax
import numpy as np
from _timing import add_torch_threads_argument, provenance, results_path  # benchmarks/ is on sys.path


def _build_members(m, layers, d, heads, kv_heads, ffn, vocab, tmp):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
    )
    models, paths = [], []
    for i in range(m):
        torch.manual_seed(i)
        mdl = LlamaForCausalLM(cfg).eval()
        for w in mdl.parameters():  # inference and input gradients only: no parameter gradients
            w.requires_grad_(False)
        p = os.path.join(tmp, f"m{i}")
        mdl.save_pretrained(p)
        models.append(mdl)
        paths.append(p)
    return models, paths


def _median_time(fn, reps):
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--candidates", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--prefix-len", type=int, default=24, help="shared prompt tokens before the suffix")
    ap.add_argument("--suffix-len", type=int, default=16, help="candidate suffix tokens")
    ap.add_argument("--target-len", type=int, default=8)
    ap.add_argument("--gen-batch", type=int, default=8)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    add_torch_threads_argument(ap, "transformers")
    ap.add_argument("--out", default=None, help="JSON path (default: a temporary folder, never benchmarks/results/)")
    a = ap.parse_args(argv)
    a.out = str(results_path("llm_throughput.json", a.out))

    import torch

    from sarjax.models.llm import load_model, stack_greedy_generate, stack_params, stack_prefix_cache, stack_target_nll

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        models, paths = _build_members(a.members, a.layers, a.d, 4, 2, int(a.d * 2.6875), a.vocab, tmp)
        loaded = [load_model(p) for p in paths]
    cfg = loaded[0][0]
    params = stack_params([p for _, p in loaded])

    n, tp, ts, tt = a.candidates, a.prefix_len, a.suffix_len, a.target_len
    prefix = rng.integers(3, a.vocab, tp).astype(np.int32)
    suffixes = rng.integers(3, a.vocab, (n, ts)).astype(np.int32)
    target = rng.integers(3, a.vocab, tt).astype(np.int32)
    full = np.concatenate([np.broadcast_to(prefix, (n, tp)), suffixes], 1)
    ones_full = np.ones_like(full)
    ones_suf = np.ones_like(suffixes)

    def jax_full():
        return stack_target_nll(params, cfg, full, ones_full, target).block_until_ready()

    def jax_prefix():
        cache = stack_prefix_cache(params, cfg, prefix)
        return stack_target_nll(params, cfg, suffixes, ones_suf, target, prefix=cache).block_until_ready()

    seq = torch.tensor(np.concatenate([full, np.broadcast_to(target, (n, tt))], 1), dtype=torch.long)
    tgt = torch.tensor(target, dtype=torch.long)

    def torch_loop():
        out = []
        with torch.inference_mode():
            for mdl in models:
                # logits only where the target is predicted (as sarjax does): a fair baseline
                lg = mdl(seq, logits_to_keep=tt + 1).logits[:, :-1].float()
                out.append(
                    torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.repeat(n), reduction="none")
                )
        return torch.stack(out).reshape(len(models), n, tt)

    pre_t = torch.tensor(prefix[None], dtype=torch.long)
    rest = torch.tensor(np.concatenate([suffixes, np.broadcast_to(target, (n, tt))], 1), dtype=torch.long)
    rest_mask = torch.ones((n, tp + ts + tt), dtype=torch.long)

    def torch_prefix_loop():
        out = []
        with torch.inference_mode():
            for mdl in models:
                # the prefix once per member (as sarjax's stack_prefix_cache), repeated over the candidates
                cache = mdl(pre_t, use_cache=True).past_key_values
                cache.batch_repeat_interleave(n)
                lg = mdl(rest, attention_mask=rest_mask, past_key_values=cache, logits_to_keep=tt + 1).logits
                lg = lg[:, :-1].float()
                out.append(
                    torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.repeat(n), reduction="none")
                )
        return torch.stack(out).reshape(len(models), n, tt)

    # correctness first: the two sides agree (and the cached PyTorch loop agrees with the uncached one)
    got = np.asarray(jax_full())
    got_p = np.asarray(jax_prefix())
    want = torch_loop().numpy()
    want_p = torch_prefix_loop().numpy()
    err = float(max(np.abs(got - want).max(), np.abs(got_p - want).max(), np.abs(want_p - want).max()))
    print(f"max |NLL(jax) - NLL(torch)| = {err:.2e}")

    t_full, t_pre = [], []
    t_torch = {th: [] for th in a.threads}
    t_torch_pre = {th: [] for th in a.threads}
    for _ in range(a.reps):  # alternate the contenders
        for th in a.threads:
            torch.set_num_threads(th)
            t_torch[th].append(_median_time(torch_loop, 1))
            t_torch_pre[th].append(_median_time(torch_prefix_loop, 1))
        t_full.append(_median_time(jax_full, 1))
        t_pre.append(_median_time(jax_prefix, 1))
    med = lambda x: float(np.median(x))
    best_th = min(a.threads, key=lambda th: med(t_torch[th]))
    best_pth = min(a.threads, key=lambda th: med(t_torch_pre[th]))
    score = {
        "candidates_per_s_torch_loop_by_threads": {str(th): a.members * n / med(t_torch[th]) for th in a.threads},
        "torch_threads_fastest": best_th,
        "candidates_per_s_torch_loop": a.members * n / med(t_torch[best_th]),
        "candidates_per_s_jax_stack": a.members * n / med(t_full),
        "candidates_per_s_jax_stack_shared_prefix": a.members * n / med(t_pre),
        "candidates_per_s_torch_loop_shared_prefix_by_threads": {
            str(th): a.members * n / med(t_torch_pre[th]) for th in a.threads
        },
        "torch_threads_fastest_shared_prefix": best_pth,
        "candidates_per_s_torch_loop_shared_prefix": a.members * n / med(t_torch_pre[best_pth]),
    }
    score["ratio_jax_vs_torch"] = score["candidates_per_s_jax_stack"] / score["candidates_per_s_torch_loop"]
    # shared prefix: against PyTorch with its own prefix cache (both sides cached)
    score["ratio_jax_prefix_vs_torch_prefix"] = (
        score["candidates_per_s_jax_stack_shared_prefix"] / score["candidates_per_s_torch_loop_shared_prefix"]
    )

    # greedy decoding
    b, g = a.gen_batch, a.gen_tokens
    prompts = rng.integers(3, a.vocab, (b, tp)).astype(np.int32)
    pt = torch.tensor(prompts, dtype=torch.long)

    def jax_gen():
        return stack_greedy_generate(params, cfg, prompts, max_new_tokens=g).block_until_ready()

    def torch_gen():
        with torch.inference_mode():
            return [
                mdl.generate(
                    pt,
                    attention_mask=torch.ones_like(pt),
                    max_new_tokens=g,
                    min_new_tokens=g,
                    do_sample=False,
                    pad_token_id=0,
                )[:, tp:]
                for mdl in models
            ]

    jg = np.asarray(jax_gen())
    tg = np.stack([x.numpy() for x in torch_gen()])
    agree = float((jg == tg).mean())
    print(f"greedy token agreement jax vs torch: {agree:.3f}")
    t_jg = []
    t_tg = {th: [] for th in a.threads}
    for _ in range(a.reps):
        for th in a.threads:
            torch.set_num_threads(th)
            t_tg[th].append(_median_time(torch_gen, 1))
        t_jg.append(_median_time(jax_gen, 1))
    best_gth = min(a.threads, key=lambda th: med(t_tg[th]))
    gen = {
        "tokens_per_s_torch_generate_loop_by_threads": {str(th): a.members * b * g / med(t_tg[th]) for th in a.threads},
        "torch_threads_fastest": best_gth,
        "tokens_per_s_torch_generate_loop": a.members * b * g / med(t_tg[best_gth]),
        "tokens_per_s_jax_stack_greedy": a.members * b * g / med(t_jg),
    }
    gen["ratio_jax_vs_torch"] = gen["tokens_per_s_jax_stack_greedy"] / gen["tokens_per_s_torch_generate_loop"]

    res = {
        "config": vars(a),
        "machine": {
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "load_average_at_end": os.getloadavg(),
            "torch": torch.__version__,
            "jax": jax.__version__,
        },
        "devices": [str(d) for d in jax.devices()],
        "nll_max_abs_diff": err,
        "greedy_agreement": agree,
        "scoring": score,
        "greedy": gen,
        "raw_seconds": {
            "torch_nll": {str(k): v for k, v in t_torch.items()},
            "torch_nll_prefix": {str(k): v for k, v in t_torch_pre.items()},
            "jax_nll": t_full,
            "jax_nll_prefix": t_pre,
            "torch_gen": {str(k): v for k, v in t_tg.items()},
            "jax_gen": t_jg,
        },
    }
    print(
        f"scoring  (M={a.members}, N={n}, T={tp + ts}+{tt}): torch loop ({best_th} thr, fastest) {score['candidates_per_s_torch_loop']:.0f} cand/s | "
        f"jax stack {score['candidates_per_s_jax_stack']:.0f} ({score['ratio_jax_vs_torch']:.2f}x) | "
        f"shared prefix, both cached: torch ({best_pth} thr) {score['candidates_per_s_torch_loop_shared_prefix']:.0f} | "
        f"jax {score['candidates_per_s_jax_stack_shared_prefix']:.0f} ({score['ratio_jax_prefix_vs_torch_prefix']:.2f}x)"
    )
    print(
        f"greedy   (M={a.members}, B={b}, {g} new): torch generate ({best_gth} thr, fastest) {gen['tokens_per_s_torch_generate_loop']:.0f} tok/s | "
        f"jax {gen['tokens_per_s_jax_stack_greedy']:.0f} tok/s ({gen['ratio_jax_vs_torch']:.2f}x)"
    )
    print(f"load average at the end: {os.getloadavg()} (a quiet machine reads well under its core count)")
    res["provenance"] = provenance()  # command, commit, machine, date, load
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as fh:
        json.dump(res, fh, indent=2)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
