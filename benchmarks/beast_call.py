"""Joint BEAST on the llm-demo pool: wall time of one 15,000-query call, and candidates scored per
second by sarjax vs a transformers (PyTorch) loop over the members.

1. One joint BEAST call with the SAR paper Table 2's settings (beam width 10, suffix 30 tokens,
   temperature 1, ``max_queries=15,000``) on one held-out behavior against all M = 6 members of the
   demo pool (``sarjax llm-demo``: three Llama d=64 and three Qwen2 d=48, two stacks). The first
   call (compile included) and the next ``--reps`` calls (other keys) are timed.
2. BEAST's inner loop: the per-member target NLL of the ``k1 * k2 = 100`` candidate prompts of one
   step (request | 30-token suffix | template tail, target "Sure, here is") on every member.
   sarjax: one compiled call over both stacks (the attack's own ``member_losses``); transformers:
   a loop over the members' checkpoints, one batched forward each (``logits_to_keep``: logits only
   where the target is predicted), at 1 and 2 threads in the same rotation; the ratio is taken
   against the faster. The contenders alternate; NLLs are checked to agree first.

The pool: ``--pool-dir OUT/pool_before`` of a finished ``sarjax llm-demo`` (default
``sarjax-llm-demo/pool_before``); without it, members of the demo's architectures with random
weights are written to a temporary folder (the cost per query does not depend on the weights).
JSON (with the run's provenance: command, commit, machine, date, load) goes to ``--out`` (default: a
temporary folder; ``--out benchmarks/results/beast_call.json`` replaces the committed result).

    python benchmarks/beast_call.py --pool-dir sarjax-llm-demo/pool_before
    python benchmarks/beast_call.py --quick      # 2,000 queries, suffix 10, 1 rep
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch threads must not spin on a shared CPU

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sarjax.cli.llm_sar import hide_broken_torchvision  # noqa: E402

hide_broken_torchvision()
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from _timing import provenance, results_path  # noqa: E402  # benchmarks/ is on sys.path when run as a script

HB = os.environ.get("SARJAX_HARMBENCH_DIR", "/work/shared/data/harmbench")


def _pool_dirs(a, tmp):
    from sarjax.experiments import llm_demo as D

    if a.pool_dir and Path(a.pool_dir).is_dir():
        return [str(Path(a.pool_dir) / s.name) for s in D.MEMBERS], "demo checkpoints " + str(a.pool_dir)
    from sarjax.models.llm.decoder import init_params

    corpus = D.build_corpus(
        os.path.join(HB, "harmbench_behaviors_text_test.csv"), os.path.join(HB, "harmbench_behaviors_text_val.csv")
    )
    tok = D.build_tokenizer(corpus)
    out = []
    for s in D.MEMBERS:
        hf = D.hf_config(s, len(tok))
        params = init_params(D.decoder_config(hf), jax.random.key(s.seed))
        out.append(str(D.save_checkpoint(Path(tmp) / s.name, hf, params, tok)))
    return out, "demo architectures, random weights"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool-dir", default="sarjax-llm-demo/pool_before")
    ap.add_argument("--max-queries", type=int, default=15_000)
    ap.add_argument("--suffix-len", type=int, default=30)
    ap.add_argument("--beam-width", type=int, default=10)
    ap.add_argument("--reps", type=int, default=2, help="timed BEAST calls after the first")
    ap.add_argument("--score-reps", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--quick", action="store_true", help="2,000 queries, suffix 10, 1 rep")
    ap.add_argument(
        "--out",
        default=None,
        help="JSON path (default: a temporary folder, never benchmarks/results/)",
    )
    a = ap.parse_args(argv)
    # without --out, a run never overwrites benchmarks/results/
    a.out = str(results_path("beast_call.json", a.out, quick=a.quick))
    if a.quick:
        a.max_queries, a.suffix_len, a.reps, a.score_reps = 2_000, 10, 1, 2

    import torch

    from sarjax.attacks.text import losses as TL
    from sarjax.attacks.text import model as TM
    from sarjax.attacks.text import requests as TR
    from sarjax.attacks.text import retokenize as TK
    from sarjax.attacks.text.beast import make_beast
    from sarjax.sar.llm_requests import behavior_batch, load_llm_pool

    res = {
        "argv": sys.argv[1:],
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_avg_start": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        dirs, source = _pool_dirs(a, tmp)
        pool = load_llm_pool(dirs)
        from transformers import AutoModelForCausalLM

        torch_models = [AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").eval() for d in dirs]
    res["pool"] = source
    tok = pool.stacks[0].tokenizer
    cfgs = tuple(s.cfg for s in pool.stacks)
    params = tuple(s.params for s in pool.stacks)
    model = TM.llm_text_model(cfgs)
    v = cfgs[0].vocab_size
    m = pool.size
    from sarjax.experiments import llm_demo as D

    corpus = D.build_corpus(
        os.path.join(HB, "harmbench_behaviors_text_test.csv"), os.path.join(HB, "harmbench_behaviors_text_val.csv")
    )
    batch = behavior_batch(tok, corpus.eval_harmful[:1], "Sure, here is")
    texts = TR.slot_texts(tok, corpus.eval_harmful[:1])  # the audited call re-tokenizes the sent prompt
    allowed = TK.allowed_vocab(tok, v)
    fn = make_beast(model, vocab_size=v, suffix_len=a.suffix_len, beam_width=a.beam_width, tokenizer=tok)

    # 1. whole calls
    t = time.perf_counter()
    r = fn(params, batch, None, key=jax.random.key(0), max_queries=a.max_queries, allowed=allowed, texts=texts)
    first = time.perf_counter() - t
    calls = []
    for i in range(a.reps):
        t = time.perf_counter()
        r = fn(params, batch, None, key=jax.random.key(i + 1), max_queries=a.max_queries, allowed=allowed, texts=texts)
        calls.append(time.perf_counter() - t)
    q = int(np.asarray(r.queries)[0].sum())  # [B, M]: every member's queries on request 0
    res["beast_call"] = {
        "members": m,
        "max_queries": a.max_queries,
        "suffix_len": a.suffix_len,
        "beam_width": a.beam_width,
        "queries_spent": q,
        "first_call_s_with_compile": first,
        "call_s": calls,
        "median_call_s": float(np.median(calls)) if calls else None,
        "queries_per_s": q / float(np.median(calls)) if calls else None,
    }
    print(f"one BEAST call: {q} queries, first {first:.1f} s (compile), then {calls} s")

    # 2. candidate scoring (one BEAST step's k1 * k2 candidates)
    rng = np.random.default_rng(0)
    n = a.beam_width * a.beam_width
    ok = np.flatnonzero(allowed)
    sufs = rng.choice(ok, (n, a.suffix_len)).astype(np.int32)
    row = TR.row(TR.TextBatch(*(np.asarray(x) for x in batch)), 0)
    score = jax.jit(lambda p, s: TM.member_losses(model, TL.target_loss, p, row, s, np.ones(a.suffix_len, np.int32)))
    ours = np.asarray(score(params, sufs))  # [M, N]
    before = np.asarray(row.before)[np.asarray(row.before_mask) == 1]
    after = np.asarray(row.after)[np.asarray(row.after_mask) == 1]
    target = np.asarray(row.target)[np.asarray(row.target_mask) == 1]
    seq = torch.tensor(
        np.concatenate(
            [
                np.broadcast_to(before, (n, len(before))),
                sufs,
                np.broadcast_to(after, (n, len(after))),
                np.broadcast_to(target, (n, len(target))),
            ],
            1,
        ),
        dtype=torch.long,
    )
    tgt = torch.tensor(target, dtype=torch.long)
    tt = len(target)

    def torch_loop():
        out = []
        with torch.inference_mode():
            for mdl in torch_models:
                lg = mdl(seq, logits_to_keep=tt + 1).logits[:, :-1].float()
                nll = torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.repeat(n), reduction="none")
                out.append(nll.reshape(n, tt).mean(-1))
        return torch.stack(out).numpy()

    err = float(np.abs(torch_loop() - ours).max())
    print(f"max |loss(sarjax) - loss(transformers)| = {err:.2e}")

    def jax_call():
        return score(params, sufs).block_until_ready()

    tj, tt_ = [], {th: [] for th in a.threads}
    for _ in range(a.score_reps):
        for th in a.threads:
            torch.set_num_threads(th)
            t = time.perf_counter()
            torch_loop()
            tt_[th].append(time.perf_counter() - t)
        t = time.perf_counter()
        jax_call()
        tj.append(time.perf_counter() - t)
    med = lambda x: float(np.median(x))  # noqa: E731
    best = min(a.threads, key=lambda th: med(tt_[th]))
    res["scoring"] = {
        "candidates": n,
        "prompt_tokens": int(seq.shape[1] - tt),
        "target_tokens": tt,
        "max_abs_loss_diff": err,
        "candidates_per_s_sarjax": m * n / med(tj),
        "candidates_per_s_torch_by_threads": {str(th): m * n / med(tt_[th]) for th in a.threads},
        "torch_threads_fastest": best,
        "ratio_sarjax_vs_torch": med(tt_[best]) / med(tj),
    }
    res["load_avg_end"] = os.getloadavg()
    print(json.dumps(res["scoring"], indent=1))
    print(f"load average {res['load_avg_end']}")
    res["provenance"] = provenance()  # command, commit, machine, date, load
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
