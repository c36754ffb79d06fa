"""The known-answer registry: a digest of every public attack's output on fixed problems.

Refactors of the public surface must keep behaviour bit for bit. This script runs every image
attack (fixed-budget, joint, member mode, rounds, minimum-norm, AutoAttack) on fixed affine pools
with fixed keys and masks, and prints one SHA-256 per attack over its returned points, success
flags, per-sample queries and (minimum-norm) norms. Run it before and after a change and compare:

    python scripts/known_answer_registry.py --out /tmp/before.json
    ... change ...
    python scripts/known_answer_registry.py --out /tmp/after.json --compare /tmp/before.json

Queries are digested as the per-sample total (the sum over members where a result reports them
per member), so the digest compares across a change of the query field's shape. About 2 minutes
on 2 CPU cores (each attack compiles once).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

D, C, M, B = 12, 4, 3, 5


def pool_apply(params, x):
    """Stacked affine members: logits [M, B, C]."""
    return jnp.einsum("bd,mdc->mbc", x.reshape(x.shape[0], -1), params["W"]) + params["b"][:, None]


def single_apply(params, x):
    """One affine model: logits [B, C]."""
    return x.reshape(x.shape[0], -1) @ params["W"] + params["b"]


def problem(seed: int = 0):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(M, D, C)).astype(np.float32)
    b = (0.1 * rng.normal(size=(M, C))).astype(np.float32)
    x0 = rng.uniform(0.2, 0.8, (B, D)).astype(np.float32)
    logits = np.einsum("bd,mdc->mbc", x0, W) + b[:, None]
    x0 = x0.reshape(B, 2, 2, 3)  # images [B, H, W, C] (Square needs them)
    y = logits[0].argmax(-1).astype(np.int32)  # member 0's prediction: at least one member right
    mask = np.ones((B, M), np.float32)
    mask[1, 2] = 0.0
    mask[3, 0] = 0.0
    params = {"W": jnp.asarray(W), "b": jnp.asarray(b)}
    return params, jnp.asarray(x0), jnp.asarray(y), jnp.asarray(mask)


def digest(result, fields) -> str:
    h = hashlib.sha256()
    for f in fields:
        a = np.asarray(getattr(result, f))
        if f == "queries" and a.ndim == 2:
            a = a.sum(-1)
        if a.dtype == np.bool_:
            a = a.astype(np.uint8)
        if f == "queries":
            a = a.astype(np.int64)
        h.update(f.encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def cases():
    from sarjax import attacks as A
    from sarjax.attacks import alma, apgd_min, ddn, fab, fmn, pdgd, pdpgd, sigma_zero

    fixed = ("x_adv", "success", "queries", "best_x", "best_success")
    fixed_eps = {"linf": 0.08, "l2": 0.3, "l1": 1.0}
    for norm in ("linf", "l2", "l1"):
        e = fixed_eps[norm]
        yield f"pgd-{norm}", A.make_pgd(pool_apply, norm=norm, steps=10, step=A.PGDStep(restarts=2)), {"eps": e}, fixed
        yield f"apgd-ce-{norm}", A.make_apgd(pool_apply, norm=norm, n_iter=10), {"eps": e}, fixed
        yield f"apgd-dlr-{norm}", A.make_apgd(pool_apply, norm=norm, n_iter=10, loss="dlr"), {"eps": e}, fixed
        if norm != "l1":
            yield f"fgsm-{norm}", A.make_fgsm(pool_apply, norm=norm), {"eps": e}, fixed
            yield f"mifgsm-{norm}", A.make_mifgsm(pool_apply, norm=norm, steps=10), {"eps": e}, fixed
            yield f"apgd-t-{norm}", A.make_apgd_t(pool_apply, norm=norm, n_iter=10, n_targets=2), {"eps": e}, fixed
        yield f"square-{norm}", A.make_square(pool_apply, norm=norm, n_queries=60), {"eps": e}, fixed
    yield "joint-pgd", A.make_joint_pgd(pool_apply, steps=10, step=A.JointPGDStep(restarts=2)), {"eps": 0.08}, fixed
    mn_fields = ("x_adv", "success", "queries", "norm")
    for name, mod, norms in (
        ("fmn", fmn, (0, 1, 2, math.inf)),
        ("ddn", ddn, (2,)),
        ("alma", alma, (1, 2)),
        ("apgd_min", apgd_min, (1, 2, math.inf)),
        ("pdgd", pdgd, (2,)),
        ("pdpgd", pdpgd, (0, 1, 2, math.inf)),
        ("sigma_zero", sigma_zero, (0,)),
        ("fab", fab, (1, 2, math.inf)),
    ):
        make = getattr(mod, f"make_{name}")
        for p in norms:
            yield f"{name}-l{p}", make(pool_apply, norm=p, max_queries=80), {}, mn_fields


def member_cases():
    """Member mode and rounds (single-model apply)."""
    from sarjax import attacks as A

    fixed = ("x_adv", "success", "queries")
    yield "rounds-pgd", A.make_rounds(A.make_pgd(single_apply, steps=5), 3, norm="linf"), {"eps": 0.08}, fixed


def run(which: str | None = None) -> dict:
    params, x0, y, mask = problem()
    key = jax.random.PRNGKey(7)
    out = {}
    for name, fn, call, fields in cases():
        if which and which not in name:
            continue
        t = time.perf_counter()
        r = fn(params, x0, y, key=key, mask=mask, **call)
        out[name] = digest(r, fields)
        print(f"{name:22s} {out[name]}  ({time.perf_counter() - t:.1f} s)", flush=True)
    p0 = {"W": params["W"][0], "b": params["b"][0]}
    for name, fn, call, fields in member_cases():
        if which and which not in name:
            continue
        r = fn(p0, x0, y, key=key, **call)
        out[name] = digest(r, fields)
        print(f"{name:22s} {out[name]}", flush=True)
    # member mode: every member attacked alone, on the stacked params
    from sarjax import attacks as A

    if not which or "members" in which:
        try:
            member = A.make_member_attack(A.make_pgd(single_apply, norm="linf", steps=5))
        except TypeError:  # before the one-call-shape change: make_member_attack(apply, factory, **hp)
            member = A.make_member_attack(single_apply, A.make_pgd, norm="linf", steps=5)
        r = member(params, x0, y, key=key, eps=0.08)
        res = r
        x_adv = np.asarray(res.x_adv)
        if x_adv.shape[0] == M and x_adv.shape[1] == B:  # member-first [M, B, ...] (before the change)
            x_adv = np.swapaxes(x_adv, 0, 1)
        succ = np.asarray(res.success)
        succ = succ.T if succ.shape == (M, B) else succ
        h = hashlib.sha256(x_adv.tobytes() + succ.astype(np.uint8).tobytes()).hexdigest()[:16]
        out["members-pgd"] = h
        print(f"{'members-pgd':22s} {h}", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the digests as JSON here")
    ap.add_argument("--compare", help="a JSON written by an earlier run: exit 1 on any difference")
    ap.add_argument("--only", help="run only the cases whose name contains this")
    a = ap.parse_args(argv)
    out = run(a.only)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
    if a.compare:
        with open(a.compare) as f:
            before = json.load(f)
        diff = sorted(k for k in before if k in out and before[k] != out[k])
        missing = sorted(set(before) - set(out)) if not a.only else []
        print(f"{len(out)} cases; {len(diff)} differ: {diff}; missing: {missing}")
        return 1 if diff or missing else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
