"""Joint GCG step throughput: sarjax (``make_gcg``: one compiled ``lax.scan``, members stacked and
vmapped) vs a PyTorch transformers loop written the same way, on the same weights.

One joint GCG step (the SAR paper; Zou et al. 2023) on a pool of M tiny Llamas and one request:
the one-hot token gradient of the joint refusal loss (one backward pass per member), the top-k
substitutions per suffix position, ``candidates`` single-token candidates, every candidate scored
by every member, the move to the best candidate. The PyTorch side does exactly this with a Python
loop over the members (``torch.autograd.grad`` through ``inputs_embeds = one_hot @ E``, then one
batched forward of the candidates per member, logits only where the target is predicted).

Both sides run the request's ``before`` block once per member and call and read it from a KV
cache in the gradient pass and when scoring candidates (sarjax's ``make_gcg``; nanoGCG's prefix
cache), and neither feeds the last target token (no scored position reads it); PyTorch is also
timed on full prompts. Both sides are timed alternately in one run (PyTorch at every ``--threads`` count and both prompt
variants in the same rotation; the ratio is taken against the fastest PyTorch variant). Before timing, the two sides' per-member losses
of the same candidates are compared. The load average is recorded: the machine may be shared.

    python benchmarks/gcg_throughput.py --out benchmarks/results/gcg_throughput.json
    python benchmarks/gcg_throughput.py --quick   # a smoke run: 2 reps, 3 steps per call
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch threads must not spin on a shared CPU

# the torchvision guard and the tiny-Llama builder are shared with llm_throughput.py (same folder)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_throughput import _build_members  # noqa: E402  (also hides a broken torchvision)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from _timing import provenance, results_path  # noqa: E402  # benchmarks/ is on sys.path when run as a script


def _torch_gcg(models, before, after, target, suffix0, steps, topk, nc, seed, cache=True):
    """GCG with the joint refusal loss, a Python loop over members (the reference). ``cache``: the
    ``before`` block is run once per member and call and both the gradient pass and the
    candidates read it from its KV cache (as sarjax's ``make_gcg`` and nanoGCG's prefix cache do);
    False: full prompts. Either way the last target token is not fed (no scored position reads
    it; sarjax's candidate scoring does the same)."""
    import copy

    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(seed)
    m = len(models)
    v = models[0].config.vocab_size
    ls, tt = suffix0.shape[0], target.shape[0]
    embeds = [mdl.get_input_embeddings().weight for mdl in models]
    tin = target[:-1]  # the target tokens that are inputs of a scored position
    if cache:
        with torch.no_grad():  # no_grad (not inference_mode): the gradient pass reads these tensors
            prefix = [mdl(before[None], use_cache=True).past_key_values for mdl in models]

    def losses(cands):  # [N, Ls] -> joint refusal loss [N]
        n = cands.shape[0]
        rest = torch.cat([cands, after.expand(n, -1), tin.expand(n, -1)], 1)
        seq = torch.cat([before.expand(n, -1), rest], 1)
        total = torch.zeros(n)
        with torch.inference_mode():
            for i, mdl in enumerate(models):
                if cache:
                    kv = copy.deepcopy(prefix[i])
                    kv.batch_repeat_interleave(n)
                    lg = mdl(rest, past_key_values=kv, logits_to_keep=tt).logits.float()
                else:
                    lg = mdl(seq, logits_to_keep=tt).logits.float()
                nll = F.cross_entropy(lg.reshape(-1, v), target.repeat(n), reduction="none").reshape(n, tt)
                total -= nll.mean(1)  # refusal loss: minus the mean NLL
        return total / m

    suffix = suffix0.clone()
    best = float(losses(suffix[None])[0])
    for _ in range(steps):
        grad = torch.zeros(ls, v)
        for i, (mdl, e) in enumerate(zip(models, embeds)):
            oh = F.one_hot(suffix, v).float().requires_grad_(True)
            if cache:
                x = torch.cat([oh @ e, e[after], e[tin]])[None]
                kw = dict(past_key_values=copy.deepcopy(prefix[i]))
            else:
                x = torch.cat([e[before], oh @ e, e[after], e[tin]])[None]
                kw = {}
            lg = mdl(inputs_embeds=x, logits_to_keep=tt, **kw).logits[0].float()
            loss = -F.cross_entropy(lg, target)
            (g,) = torch.autograd.grad(loss, oh)
            grad += g / m
        top = (-grad).topk(min(topk, v), dim=1).indices
        pos = torch.randint(0, ls, (nc,), generator=gen)
        tok = top[pos, torch.randint(0, top.shape[1], (nc,), generator=gen)]
        cands = suffix.repeat(nc, 1)
        cands[torch.arange(nc), pos] = tok
        jl = losses(cands)
        i = int(torch.argmin(jl))
        suffix = cands[i]
        best = min(best, float(jl[i]))
    return suffix, best


def _scoring_matmuls(params, n_rows, n_target_rows):
    """The candidate scoring's weight matrix products alone, at its shapes: per layer q, k, v, o,
    gate, up and down over ``n_rows`` token rows per member, and the LM head over
    ``n_target_rows``; a floor for the scoring on this machine (XLA's own matmul speed, nothing
    else). The attention's score and value products are left out, so the floor is if anything low."""
    import jax.numpy as jnp

    lay = params["layers"]
    m, d = params["embed"].shape[0], params["embed"].shape[-1]
    x0 = jnp.ones((m, n_rows, d), jnp.float32) * 0.01

    def mm(a, b):
        return jnp.einsum("mrd,mdf->mrf", a, b)

    def run(lay, head):
        x, acc = x0, 0.0
        for i in range(lay["wq"].shape[1]):
            w = {k: a[:, i] for k, a in lay.items()}
            q, k, v = mm(x, w["wq"]), mm(x, w["wk"]), mm(x, w["wv"])
            x = x + mm(q, w["wo"])
            x = x + mm(mm(x, w["w_gate"]) * mm(x, w["w_up"]), w["w_down"])
            acc = acc + k.sum() + v.sum()
        return acc + jnp.einsum("mrd,mdv->mrv", x[:, :n_target_rows], head).sum()

    f = jax.jit(run)
    return lambda: f(lay, params["lm_head"]).block_until_ready()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--candidates", type=int, default=64, help="candidates per step (64, the SAR paper Table 3)")
    ap.add_argument("--topk", type=int, default=256, help="substitutions per position (256, the SAR paper Table 3)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--before-len", type=int, default=24, help="template head + request tokens")
    ap.add_argument("--suffix-len", type=int, default=20, help="suffix tokens (20, Zou et al. 2023)")
    ap.add_argument("--after-len", type=int, default=4, help="template tail tokens")
    ap.add_argument("--target-len", type=int, default=8, help="refusal tokens")
    ap.add_argument("--steps", type=int, default=5, help="GCG steps per timed call")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts (fastest taken)")
    ap.add_argument("--quick", action="store_true", help="2 reps of 3 steps (a smoke run)")
    ap.add_argument(
        "--out",
        default=None,
        help="JSON path (default: a temporary folder, never benchmarks/results/)",
    )
    a = ap.parse_args(argv)
    # without --out, a run never overwrites benchmarks/results/
    a.out = str(results_path("gcg_throughput.json", a.out, quick=a.quick))
    if a.quick:
        a.reps, a.steps = 2, 3

    import torch

    from sarjax.attacks.text import llm_text_model, make_gcg, text_batch
    from sarjax.attacks.text import losses as TL
    from sarjax.attacks.text import model as TM
    from sarjax.attacks.text import requests as TR
    from sarjax.models.llm import load_model, stack_params

    load_start = os.getloadavg()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        models, paths = _build_members(a.members, a.layers, a.d, 4, 2, int(a.d * 2.6875), a.vocab, tmp)
        loaded = [load_model(p) for p in paths]
    cfg = loaded[0][0]
    params = stack_params([p for _, p in loaded])
    model = llm_text_model(cfg)
    v = a.vocab
    before = rng.integers(3, v, a.before_len).astype(np.int32)
    after = rng.integers(3, v, a.after_len).astype(np.int32)
    target = rng.integers(3, v, a.target_len).astype(np.int32)
    suffix0 = rng.integers(3, v, a.suffix_len).astype(np.int32)
    batch = text_batch([before.tolist()], [after.tolist()], [target.tolist()])
    fn = make_gcg(
        model, vocab_size=v, num_steps=a.steps, suffix_len=a.suffix_len, topk=a.topk, num_candidates=a.candidates
    )
    tb = [torch.tensor(x, dtype=torch.long) for x in (before, after, target, suffix0)]

    # correctness first: the same candidates, every member, both sides
    cands = rng.integers(3, v, (a.candidates, a.suffix_len)).astype(np.int32)
    r0 = TR.row(TR.TextBatch(*(np.asarray(x) for x in batch)), 0)
    ml = np.asarray(
        jax.jit(TM.member_losses, static_argnums=(0, 1))(
            model, TL.refusal_loss, params, r0, cands, np.ones(a.suffix_len, np.int32)
        )
    )
    want = []
    with torch.inference_mode():
        seq = torch.cat([tb[0].expand(a.candidates, -1), torch.tensor(cands, dtype=torch.long)], 1)
        seq = torch.cat([seq, tb[1].expand(a.candidates, -1), tb[2].expand(a.candidates, -1)], 1)
        for mdl in models:
            lg = mdl(seq, logits_to_keep=a.target_len + 1).logits[:, :-1].float()
            nll = torch.nn.functional.cross_entropy(lg.reshape(-1, v), tb[2].repeat(a.candidates), reduction="none")
            want.append(-nll.reshape(a.candidates, -1).mean(1).numpy())
    err = float(np.abs(ml - np.stack(want)).max())
    print(f"max |member loss (jax) - (torch)| over {a.candidates} candidates x {a.members} members = {err:.2e}")

    def jax_call():
        r = fn(params, batch, None, key=jax.random.key(0), suffix_init=suffix0)
        return float(np.asarray(r.loss)[0])

    def torch_call(cache):
        return _torch_gcg(models, *tb[:3], tb[3], a.steps, a.topk, a.candidates, 0, cache)[1]

    # where sarjax's step goes: the candidate scoring alone, and its matmuls alone (the floor)
    jb = TR.TextBatch(*(jax.numpy.asarray(x) for x in batch))
    score = jax.jit(
        lambda p, c: TM.member_losses_cached(model, TL.refusal_loss, p, TR.row(jb, 0), c, np.ones(a.suffix_len))
    )
    score_call = lambda: score(params, cands).block_until_ready()  # noqa: E731
    tp = a.suffix_len + a.after_len + a.target_len - 1  # the scored rows per candidate (last target token not run)
    gemm_call = _scoring_matmuls(params, a.candidates * tp, a.candidates * a.target_len)
    score_call(), gemm_call()

    variants = [(th, c) for th in a.threads for c in (True, False)]
    vname = lambda v: f"{v[0]}thr_{'prefix_cache' if v[1] else 'full_prompt'}"  # noqa: E731

    t0 = time.perf_counter()
    jax_best = jax_call()  # compile
    compile_s = time.perf_counter() - t0
    torch_best = {c: torch_call(c) for c in (True, False)}
    t_jax, t_torch = [], {vname(v): [] for v in variants}
    c_jax, c_torch = [], {vname(v): [] for v in variants}  # process CPU seconds (all threads)
    t_score, t_gemm = [], []
    for _ in range(a.reps):  # alternate the contenders
        for v in variants:
            torch.set_num_threads(v[0])
            t, c = time.perf_counter(), time.process_time()
            torch_call(v[1])
            t_torch[vname(v)].append((time.perf_counter() - t) / a.steps)
            c_torch[vname(v)].append((time.process_time() - c) / a.steps)
        t, c = time.perf_counter(), time.process_time()
        jax_call()
        t_jax.append((time.perf_counter() - t) / a.steps)
        c_jax.append((time.process_time() - c) / a.steps)
        for fn_, out in ((score_call, t_score), (gemm_call, t_gemm)):
            t = time.perf_counter()
            for _ in range(a.steps):
                fn_()
            out.append((time.perf_counter() - t) / a.steps)
    med = lambda x: float(np.median(x))  # noqa: E731
    best_th = min(t_torch, key=lambda k: med(t_torch[k]))
    ratio = med(t_torch[best_th]) / med(t_jax)
    res = {
        "config": vars(a),
        "machine": {
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "load_average_at_start": load_start,
            "load_average_at_end": os.getloadavg(),
            "torch": torch.__version__,
            "jax": jax.__version__,
        },
        "devices": [str(d) for d in jax.devices()],
        "member_loss_max_abs_diff": err,
        "best_joint_loss_after_steps": {
            "jax": jax_best,
            "torch_prefix_cache": torch_best[True],
            "torch_full": torch_best[False],
        },
        "jax_compile_plus_first_call_s": compile_s,
        "seconds_per_step_jax": med(t_jax),
        "seconds_per_step_torch_by_variant": {k: med(x) for k, x in t_torch.items()},
        "torch_variant_fastest": best_th,
        "speedup_jax_vs_fastest_torch": ratio,
        "target_speedup": 2.0,
        "cpu_seconds_per_step": {"jax": med(c_jax), **{f"torch_{k}": med(x) for k, x in c_torch.items()}},
        "jax_breakdown_seconds": {
            "candidate_scoring": med(t_score),
            "candidate_scoring_matmuls_only": med(t_gemm),
            "rest_of_step": med(t_jax) - med(t_score),
        },
        "raw_seconds_per_step": {"jax": t_jax, "torch": t_torch},
        "note": "seconds per step include the start-suffix scoring (1 forward per member) spread over "
        "the steps of a call, and, for sarjax, the host validation and audit of the entry; "
        "cpu_seconds_per_step counts every thread of the process (cpu = wall: one core busy); "
        "jax_breakdown_seconds: the candidate scoring alone (jitted member_losses_cached on the "
        "candidates) and its matrix products alone at the same shapes (XLA's matmul floor)",
    }
    print(
        f"joint GCG step (M={a.members}, {a.candidates} candidates, top-{a.topk}, T={a.before_len}+{a.suffix_len}"
        f"+{a.after_len}+{a.target_len}): torch loop ({best_th}, the fastest variant) {med(t_torch[best_th]) * 1e3:.1f} ms | "
        f"sarjax {med(t_jax) * 1e3:.1f} ms -> {ratio:.2f}x (target 2x)"
    )
    print(
        f"sarjax step: candidate scoring {med(t_score) * 1e3:.1f} ms (its matmuls alone {med(t_gemm) * 1e3:.1f} ms), "
        f"the rest {(med(t_jax) - med(t_score)) * 1e3:.1f} ms; cpu/wall per step: sarjax "
        f"{med(c_jax) / med(t_jax):.2f}, torch {best_th} {med(c_torch[best_th]) / med(t_torch[best_th]):.2f}"
    )
    print(f"load average start {load_start}, end {os.getloadavg()} (2 cores: a quiet machine reads < 2)")
    res["provenance"] = provenance()  # command, commit, machine, date, load
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as fh:
        json.dump(res, fh, indent=2)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
