"""EOT against a randomized defense: joint PGD on a pool behind Gaussian input noise.

The pool (the demo's cached diversity preset, trained if missing) classifies under input noise
``N(0, sigma^2 I)`` (``sarjax.attacks.with_input_noise``).  Four attacks with the same joint-PGD
budget (linf eps, Table 1's step eps/16, ``--steps`` steps, one restart, labels = true labels):

  * ``none``: the clean inputs;
  * ``noiseless``: joint PGD on the pool WITHOUT the noise (the defense ignored), then transferred;
  * ``one_draw``: joint PGD on the noisy pool with ONE fixed noise draw per input (``eot=1`` on a
    fixed key: the attack optimises against a single realisation of the randomness);
  * ``one_draw_equal_queries``: the same with ``--steps * --eot`` steps (EOT's query budget);
  * ``eot``: joint PGD with ``--eot`` fresh draws per step (Athalye et al. 2018).

Each output is judged on ``--eval-draws`` FRESH noise draws (keys never seen by any attack): the
mean share of (member, draw) pairs that misclassify, per attack.  Ratios are against ``one_draw``.

    python benchmarks/eot_noise_defense.py            # JSON to a temporary folder (or --out PATH)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from _timing import provenance, results_path  # benchmarks/ is on sys.path when run as a script

from sarjax.attacks import JointPGDStep, make_joint_pgd, with_input_noise
from sarjax.data.mnist import load_mnist
from sarjax.experiments.demo import DemoSettings, get_pool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="high")
    ap.add_argument("--members", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--sigma", type=float, default=0.3)
    ap.add_argument("--eps", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--eot", type=int, default=10)
    ap.add_argument("--eval-draws", type=int, default=32)
    ap.add_argument("--cache", default="sarjax-demo/pools")
    ap.add_argument("--out", default=None, help="JSON path (default: a temporary folder, never benchmarks/results/)")
    a = ap.parse_args()
    a.out = str(results_path("eot_noise_defense.json", a.out))

    data = load_mnist()
    pool, _ = get_pool(a.preset, data, DemoSettings(members=a.members, epochs=a.epochs), Path(a.cache))
    x0 = jnp.asarray(data.x_test[: a.samples])
    y = jnp.asarray(data.y_test[: a.samples]).astype(jnp.int32)
    noisy = with_input_noise(pool.apply, a.sigma)
    fixed = jax.random.PRNGKey(1234)
    attacks = {
        "noiseless": (make_joint_pgd(pool.apply, eps=a.eps, steps=a.steps, step=JointPGDStep(restarts=1)), 0),
        "one_draw": (
            make_joint_pgd(lambda p, x: noisy(p, x, fixed), eps=a.eps, steps=a.steps, step=JointPGDStep(restarts=1)),
            0,
        ),
        "one_draw_equal_queries": (
            make_joint_pgd(
                lambda p, x: noisy(p, x, fixed), eps=a.eps, steps=a.steps * a.eot, step=JointPGDStep(restarts=1)
            ),
            0,
        ),
        "eot": (make_joint_pgd(noisy, eps=a.eps, steps=a.steps, step=JointPGDStep(restarts=1), eot=a.eot), 0),
    }
    judge = jax.jit(lambda p, x, k: jnp.mean(jnp.argmax(noisy(p, x, k), -1) != y[None], axis=0))  # [B]

    def fooled_share(x):
        keys = jax.random.split(jax.random.PRNGKey(98765), a.eval_draws)  # never used by an attack
        return np.mean([np.asarray(judge(pool.params, x, k)) for k in keys], axis=0)  # [B]

    res = {"none": {"fooled_share": fooled_share(x0), "seconds": 0.0, "queries_per_sample": 0}}
    for name, (atk, _) in attacks.items():
        t = time.time()
        r = atk(pool.params, x0, y, key=jax.random.PRNGKey(7))
        jax.block_until_ready(r.x_adv)
        dt = time.time() - t
        linf = float(jnp.max(jnp.abs(r.x_adv - x0)))
        assert linf <= a.eps * (1 + 1e-6), linf
        res[name] = {
            "fooled_share": fooled_share(r.x_adv),
            "seconds": dt,
            "queries_per_sample": int(np.asarray(r.queries)[0]),
            "linf_max": linf,
        }
        print(
            f"{name:22s} fooled {res[name]['fooled_share'].mean():.3f}  ({dt:.0f}s, "
            f"{res[name]['queries_per_sample']} queries/sample, max linf {linf:.4f})",
            flush=True,
        )
    base = res["one_draw"]["fooled_share"].mean()
    summary = {
        k: {
            "mean_fooled_share": float(v["fooled_share"].mean()),
            "stderr": float(v["fooled_share"].std(ddof=1) / np.sqrt(len(v["fooled_share"]))),
            "ratio_vs_one_draw": float(v["fooled_share"].mean() / base) if base > 0 else None,
            "seconds": v["seconds"],
            "queries_per_sample": v["queries_per_sample"],
        }
        for k, v in res.items()
    }
    print("ratios vs one_draw: " + ", ".join(f"{k} {s['ratio_vs_one_draw']:.2f}x" for k, s in summary.items()))
    doc = {
        "settings": vars(a),
        "pool": a.preset,
        "members": pool.num_members,
        "clean_accuracy_noiseless": float(pool.accuracy(data.x_test, data.y_test).mean()),
        "jax": jax.__version__,
        "device": str(jax.devices()[0]),
        "summary": summary,
        "per_sample_fooled_share": {k: v["fooled_share"].tolist() for k, v in res.items()},
        "provenance": provenance(),  # command, commit, machine, date, load
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=2))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
