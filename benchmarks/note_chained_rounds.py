"""papers/002 (the Note) reproduced: chained rounds vs sarjax's bounded rounds.

Fort (2025) found that an adaptive attack on the multi-resolution self-ensemble ran n rounds of
PGD where each round started from the previous round's OUTPUT and projected into the eps-ball of
THAT start: every round was within eps of its own start, so each round's check passed, while the
perturbation grew to about ``n * eps`` (160/255 instead of 8/255 after 20 rounds) and the
reported robust accuracy fell to near zero. This script runs, for ``n`` in {1, 2, 5, 10, 20}:

* (a) ``chained``: the Note's error, reproduced on purpose (:func:`chained_rounds`): round ``r``
  attacks the previous round's output as if it were the clean input. The attack is built with
  ``audit=False`` EXPLICITLY (the script says so when it runs); the audit is then applied by hand
  against the ORIGINAL input, and its verdict reported;
* (b) ``bounded``: sarjax's :func:`sarjax.attacks.make_rounds` (every round warm-starts from the
  best point so far projected into the eps-ball of the ORIGINAL input; audited).

on two models: the randomized target (the defense zoo's multi-resolution self-ensemble of Fort &
Lakshminarayanan 2024 with ``--zoo DIR`` when it is trained there, attacked with EOT over its
stochastic views; otherwise a STAND-IN: a small MLP trained here behind Gaussian input noise at
inference, ``with_input_noise``, and the output says so) and a PGD-AT control (the zoo's
``pgd-at-linf-0.1``, or a small PGD-AT MLP trained here). Each round is PGD (linf, ``--steps``
steps of ``eps/4`` from a random start; EOT over ``--eot`` draws for the randomized model).

Reported per model, method and n: the realized max (and mean) linf distance of the returned
points to the ORIGINAL inputs (expect ``~ n * eps`` for (a), ``<= eps`` for (b)), the robust
accuracy each method reports (the model's accuracy at the returned points; randomized model:
majority vote over ``--eval-draws`` fresh draws), and the audit's verdict on (a). Table, plot
(``--plot``) and JSON (``--out``) with the machine load.

    python benchmarks/note_chained_rounds.py --quick      # a few minutes on 2 CPU cores
    python benchmarks/note_chained_rounds.py --zoo ZOO    # the zoo's self-ensemble and PGD-AT model
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROUNDS = (1, 2, 5, 10, 20)


def chained_rounds(attack, *, params, x0, y, key, eps, rounds: int) -> list[np.ndarray]:
    """THE NOTE'S ERROR, reproduced on purpose: ``rounds`` rounds of ``attack``, round ``r``
    started from, and projected around, round ``r - 1``'s output (never the original ``x0``).

    Args:
      attack: a sarjax AttackFn built with ``audit=False`` (each round's own audit would compare
        it with its own start, which it satisfies: the error is invisible round by round).
      params, y, eps: as the attack's.
      x0: ``[B, *S]`` the ORIGINAL inputs (round 0's start).
      key: PRNG key (round ``r`` uses ``fold_in(key, r)``).
      rounds: number of rounds.

    Returns:
      The output after each round, ``rounds`` arrays ``[B, *S]``.

    Raises:
      ValueError: if the attack audits its outputs (build it with ``audit=False``).
    """
    if getattr(attack, "_audit", None) is not None:
        raise ValueError("chained_rounds reproduces an error on purpose: build the attack with audit=False")
    x = jnp.asarray(x0)
    outs = []
    for r in range(rounds):
        res = attack(params, x, y, key=jax.random.fold_in(key, r), eps=eps)
        x = res.x_adv
        outs.append(np.asarray(x))
    return outs


def _train(objective: str, x, y, *, eps: float, epochs: int, sigma: float = 0.0):
    from sarjax.defenses import make_objective
    from sarjax.models import zoo
    from sarjax.models.train import MemberConfig, TrainConfig, train_stack

    arch = zoo.mlp((256, 128))
    obj = make_objective(objective, eps=eps, norm="linf") if objective != "standard" else None
    cfg = MemberConfig(seed=0)
    if sigma > 0:  # Gaussian augmentation for the noise stand-in (trained under its own noise)
        rng = np.random.default_rng(0)
        x = np.concatenate([x, np.clip(x + sigma * rng.standard_normal(x.shape).astype(np.float32), 0, 1)])
        y = np.concatenate([y, y])
    stack, _ = train_stack(
        arch, [cfg], x, y, config=TrainConfig(epochs=epochs, patience=0), progress=False, objective=obj
    )
    return arch.apply, jax.tree.map(lambda a: a[0], stack.params)


def _models(args, data):
    """``[(name, apply, params, stochastic_apply or None, note)]``."""
    from sarjax.attacks import with_input_noise

    out = []
    zm = None
    if args.zoo:
        from sarjax.defenses.zoo import load_zoo

        try:
            zm = load_zoo(args.zoo)
        except ValueError as e:
            print(f"--zoo {args.zoo}: {e}; using the stand-ins")
    if zm is not None and "self-ensemble" in zm:
        m = zm["self-ensemble"]
        out.append(("self-ensemble", m.apply, m.params, m.stochastic_apply, "the zoo's multi-resolution self-ensemble"))
    else:
        apply, params = _train("standard", data.x_train, data.y_train, eps=0.0, epochs=args.epochs, sigma=args.sigma)
        note = (
            f"STAND-IN for the self-ensemble (not trained in --zoo): an MLP trained with Gaussian augmentation, "
            f"classifying behind Gaussian input noise sigma={args.sigma} (with_input_noise)"
        )
        print(note)
        out.append(("noise-mlp (stand-in)", apply, params, with_input_noise(apply, args.sigma), note))
    if zm is not None and "pgd-at-linf-0.1" in zm:
        m = zm["pgd-at-linf-0.1"]
        out.append(("pgd-at-linf-0.1", m.apply, m.params, None, "the zoo's PGD-AT CNN (linf 0.1)"))
    else:
        apply, params = _train("pgd-at", data.x_train, data.y_train, eps=args.eps, epochs=args.epochs)
        out.append(("pgd-at-mlp", apply, params, None, f"an MLP trained here with PGD-AT linf {args.eps} (control)"))
    return out


def _accuracy(apply, params, stoch, x, y, key, draws):
    """Share of samples classified correctly (randomized model: majority over fresh draws)."""
    x = jnp.asarray(x)
    if stoch is None:
        return float(np.mean(np.asarray(jnp.argmax(apply(params, x), -1)) == y))
    votes = np.stack(
        [np.asarray(jnp.argmax(stoch(params, x, jax.random.fold_in(key, d)), -1)) == y for d in range(draws)]
    )
    return float(np.mean(votes.mean(0) > 0.5))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zoo", default=None, help="defense zoo directory (sarjax train-defenses --out DIR)")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--eps", type=float, default=0.1, help="linf radius (MNIST's milder standard point)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--eot", type=int, default=8, help="EOT draws per step for the randomized model")
    ap.add_argument("--eval-draws", type=int, default=16)
    ap.add_argument("--sigma", type=float, default=0.3, help="the stand-in's inference noise")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--rounds", default=",".join(map(str, ROUNDS)))
    ap.add_argument("--quick", action="store_true", help="100 samples, 5 steps, 4 EOT draws, 2 epochs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/note_chained_rounds.json")
    ap.add_argument("--plot", default=None, help="PNG path (default: --out with .png)")
    a = ap.parse_args(argv)
    if a.quick:
        a.samples, a.steps, a.eot, a.epochs, a.eval_draws = 100, 5, 4, 2, 8
    rounds = sorted({int(r) for r in a.rounds.split(",")})
    from sarjax.attacks import make_pgd, make_rounds
    from sarjax.attacks.audit import audit
    from sarjax.attacks.threat import Threat
    from sarjax.data.mnist import load_mnist

    data = load_mnist()
    # a fixed random subset: the embedded test split is sorted by class (its first 100 images are zeros)
    sel = np.sort(np.random.default_rng(0).permutation(len(data.x_test))[: a.samples])
    x0 = np.asarray(data.x_test[sel], np.float32)
    y = np.asarray(data.y_test[sel], np.int32)
    key = jax.random.PRNGKey(a.seed)
    eval_key = jax.random.fold_in(key, 0xE7A1)  # never seen by an attack
    rows = []
    notes = {}
    t_all = time.perf_counter()
    for name, apply, params, stoch, note in _models(a, data):
        notes[name] = note
        eot = a.eot if stoch is not None else 1
        f = stoch if stoch is not None else apply
        clean = _accuracy(apply, params, stoch, x0, y, eval_key, a.eval_draws)
        print(f"\n== {name}: {note}; clean accuracy {100 * clean:.1f}%")
        print(
            "(a) chained rounds: the attack is built with audit=False EXPLICITLY (the Note's error is "
            "reproduced on purpose); its outputs are audited afterwards against the ORIGINAL inputs"
        )
        hp = dict(norm="linf", eps=a.eps, steps=a.steps, rel_step=0.25, eot=eot)
        t0 = time.perf_counter()
        chain = chained_rounds(
            make_pgd(f, audit=False, **hp), params=params, x0=x0, y=y, key=key, eps=a.eps, rounds=max(rounds)
        )
        t_chain = time.perf_counter() - t0
        for n in rounds:
            xa = chain[n - 1]
            rep = audit(x0, xa, Threat("linf", a.eps))
            d = np.abs(xa - x0).reshape(len(x0), -1).max(1)
            rows.append(
                dict(
                    model=name,
                    method="chained",
                    rounds=n,
                    max_linf=float(d.max()),
                    mean_linf=float(d.mean()),
                    robust_accuracy=_accuracy(apply, params, stoch, xa, y, eval_key, a.eval_draws),
                    audit_ok=bool(rep.ok),
                    audit_outside=int((~rep.within).sum()),
                    audit=rep.describe(3),
                )
            )
        for n in rounds:
            t0 = time.perf_counter()
            res = make_rounds(make_pgd(f, **hp), n, norm="linf")(params, x0, y, key=key, eps=a.eps)
            xa = np.asarray(res.best_x)
            d = np.abs(xa - x0).reshape(len(x0), -1).max(1)
            rep = audit(x0, xa, Threat("linf", a.eps))
            rows.append(
                dict(
                    model=name,
                    method="bounded",
                    rounds=n,
                    max_linf=float(d.max()),
                    mean_linf=float(d.mean()),
                    robust_accuracy=_accuracy(apply, params, stoch, xa, y, eval_key, a.eval_draws),
                    audit_ok=bool(rep.ok),
                    audit_outside=int((~rep.within).sum()),
                    audit=rep.describe(3),
                    seconds=time.perf_counter() - t0,
                )
            )
        print(f"chained: {t_chain:.1f} s for {max(rounds)} rounds")
        print(
            f"{'method':8s} {'n':>3s} {'max linf':>9s} {'x eps':>6s} {'robust acc':>10s}  audit vs the original input"
        )
        for r in (r for r in rows if r["model"] == name):
            verdict = "ok" if r["audit_ok"] else f"FAILS ({r['audit_outside']}/{len(x0)} outside)"
            print(
                f"{r['method']:8s} {r['rounds']:3d} {r['max_linf']:9.4f} {r['max_linf'] / a.eps:6.2f} "
                f"{100 * r['robust_accuracy']:9.1f}%  {verdict}"
            )
    out = dict(
        benchmark="note_chained_rounds",
        paper="papers/002 (Fort 2025): chained rounds grow the perturbation to n * eps",
        settings=dict(vars(a), rounds=rounds),
        models=notes,
        rows=rows,
        seconds=time.perf_counter() - t_all,
        load=os.getloadavg(),
        machine=platform.platform(),
        jax=jax.__version__,
        backend=jax.default_backend(),
    )
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"\nwrote {a.out} (load {os.getloadavg()[0]:.1f})")
    _plot(rows, a.eps, a.plot or str(Path(a.out).with_suffix(".png")))
    return out


def _plot(rows, eps, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for model in dict.fromkeys(r["model"] for r in rows):
        for method, ls in (("chained", "-"), ("bounded", "--")):
            rr = [r for r in rows if r["model"] == model and r["method"] == method]
            n = [r["rounds"] for r in rr]
            ax[0].plot(n, [r["max_linf"] for r in rr], ls, marker="o", label=f"{model}, {method}")
            ax[1].plot(n, [100 * r["robust_accuracy"] for r in rr], ls, marker="o", label=f"{model}, {method}")
    ns = sorted({r["rounds"] for r in rows})
    ax[0].plot(ns, [eps] * len(ns), "k:", label="eps")
    ax[0].plot(ns, [min(n * eps, 1.0) for n in ns], "k-.", lw=0.8, label="n * eps (capped at 1: the box)")
    ax[0].set(xscale="log", xlabel="rounds n", ylabel="max linf distance to the ORIGINAL input")
    ax[1].set(xscale="log", xlabel="rounds n", ylabel="robust accuracy reported (%)")
    ax[0].legend(fontsize=7)
    ax[1].legend(fontsize=7)
    fig.suptitle("papers/002: chained rounds (the error) vs bounded rounds (sarjax make_rounds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
