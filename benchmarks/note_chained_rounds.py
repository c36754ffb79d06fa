"""the Note reproduced: chained rounds vs sarjax's bounded rounds.

Fort (2025) found that an adaptive attack on the multi-resolution self-ensemble ran n rounds of
PGD where each round started from the previous round's OUTPUT and projected into the eps-ball of
THAT start: every round was within eps of its own start, so each round's check passed, while the
perturbation grew to about ``n * eps`` (160/255 instead of 8/255 after 20 rounds) and the
reported robust accuracy fell to near zero. This script runs, for ``n`` in {1, 2, 5, 10, 20}:

* (a) ``chained``: the Note's error, reproduced on purpose (:func:`sarjax.attacks.rounds.chained_rounds`): round ``r``
  attacks the previous round's output as if it were the clean input. The attack is built with
  ``audit=False`` EXPLICITLY (the script says so when it runs); the audit is then applied by hand
  against the ORIGINAL input, and its verdict reported;
* (b) ``bounded``: sarjax's :func:`sarjax.attacks.make_rounds` (every round warm-starts from the
  best point so far projected into the eps-ball of the ORIGINAL input; audited).

on the randomized target (the defense zoo's multi-resolution self-ensemble of Fort &
Lakshminarayanan 2024 when a ``--zoo DIR`` holds it, attacked with EOT over its stochastic views;
otherwise a STAND-IN: a small MLP trained here behind Gaussian input noise at inference,
``with_input_noise``, and the output says so) and deterministic PGD-AT controls (``--control``, default
the zoo's ``pgd-at-linf-0.1`` and ``pgd-at-linf-0.3``; a small PGD-AT MLP trained here when no zoo has
them). ``--zoo`` is repeatable (e.g. the self-ensemble's zoo and the main one). Each round is PGD
(linf, ``--steps`` steps of ``eps/4`` from a random start; EOT over ``--eot`` draws for the randomized
model, default 10 as the Note's ``num_eot=10``). Each method runs ONCE for ``max(n)`` rounds and
reports its prefixes: chained round ``n``'s output, and the start that ``make_rounds`` hands to round
``n + 1`` (its best point after ``n`` rounds, which equals ``make_rounds(attack, n)``'s ``best_x``: same
keys, same combination; checked on the PGD-AT control).

Radii (``--eps``, comma-separated, fractions allowed): the Note attacks at CIFAR's standard linf
8/255; MNIST's standard points are linf 0.3 (Madry et al. 2018) and the milder 0.1 (the zoo's table).

Reported per model, radius, method and n: the realized max (and mean) linf distance of the returned
points to the ORIGINAL inputs (expect ``~ n * eps`` for (a), capped by the box, ``<= eps`` for (b)), the
robust accuracy each method reports (the model's accuracy at the returned points; randomized model:
majority vote over ``--eval-draws`` fresh draws), and the audit's verdict. Table, plot (``--plot``) and
JSON (``--out``, rewritten after every model and radius) with the machine load.

    python benchmarks/note_chained_rounds.py --quick      # stand-ins, a few minutes on 2 CPU cores (writes to a temp folder)
    python benchmarks/note_chained_rounds.py --zoo /work/zoo/se --zoo /work/zoo/mnist --samples 100 --eps 0.1,0.3
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
from _timing import provenance, results_path  # benchmarks/ is on sys.path when run as a script

from sarjax.attacks.rounds import chained_rounds

ROUNDS = (1, 2, 5, 10, 20)


def _train(objective: str, x, y, *, eps: float, epochs: int, sigma: float = 0.0):
    from sarjax.defenses import make_objective
    from sarjax.models import zoo
    from sarjax.models.train import MemberConfig, TrainConfig, TrainMonitor, train_stack

    arch = zoo.mlp((256, 128))
    obj = make_objective(objective, eps=eps, norm="linf") if objective != "standard" else None
    cfg = MemberConfig(seed=0)
    if sigma > 0:  # Gaussian augmentation for the noise stand-in (trained under its own noise)
        rng = np.random.default_rng(0)
        x = np.concatenate([x, np.clip(x + sigma * rng.standard_normal(x.shape).astype(np.float32), 0, 1)])
        y = np.concatenate([y, y])
    stack, _ = train_stack(
        arch,
        [cfg],
        x,
        y,
        config=TrainConfig(epochs=epochs, patience=0),
        monitor=TrainMonitor(progress=False),
        objective=obj,
    )
    return arch.apply, jax.tree.map(lambda a: a[0], stack.params)


def _load(zoos) -> dict:
    """``{name: ZooModel}`` of every defense trained in the ``--zoo`` directories (first one wins)."""
    from sarjax.defenses.zoo_io import load_zoo

    found: dict = {}
    for z in zoos or ():
        try:
            for name, m in load_zoo(z).items():
                found.setdefault(name, (m, z))
        except ValueError as e:
            print(f"--zoo {z}: {e}")
    return found


def _models(args, data):
    """``[(name, apply, params, stochastic_apply or None, note)]``: the self-ensemble (or its
    stand-in) first, then each ``--control`` (or the PGD-AT MLP stand-in when none is trained)."""
    from sarjax.attacks import with_input_noise

    zm = _load(args.zoo)
    out = []
    if "self-ensemble" in zm:
        m, z = zm["self-ensemble"]
        note = f"the zoo's multi-resolution self-ensemble ({z}); EOT over its stochastic views"
        out.append(("self-ensemble", m.apply, m.params, m.stochastic_apply, note))
    else:
        apply, params = _train("standard", data.x_train, data.y_train, eps=0.0, epochs=args.epochs, sigma=args.sigma)
        note = (
            f"STAND-IN for the self-ensemble (not trained in --zoo): an MLP trained with Gaussian augmentation, "
            f"classifying behind Gaussian input noise sigma={args.sigma} (with_input_noise)"
        )
        print(note)
        out.append(("noise-mlp (stand-in)", apply, params, with_input_noise(apply, args.sigma), note))
    controls = [c for c in args.control if c in zm]
    for c in controls:
        m, z = zm[c]
        out.append((c, m.apply, m.params, m.stochastic_apply, f"the zoo's {c} ({z}), the control"))
    if not controls and not args.stronger_only:  # --stronger-only attacks the randomized model alone
        eps = max(args.eps)
        apply, params = _train("pgd-at", data.x_train, data.y_train, eps=eps, epochs=args.epochs)
        note = f"an MLP trained here with PGD-AT linf {eps} (control; none of {args.control} is in --zoo)"
        print(note)
        out.append(("pgd-at-mlp (stand-in)", apply, params, None, note))
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


def _row(x0, xa, eps, acc, **fields) -> dict:
    """One table row: the realized linf distances of ``xa`` to the ORIGINAL ``x0``, the robust
    accuracy ``acc`` reported at ``xa``, and the audit's verdict against ``x0`` at ``eps``."""
    from sarjax.attacks.audit import audit
    from sarjax.attacks.threat import Threat

    d = np.abs(xa - x0).reshape(len(x0), -1).max(1)
    rep = audit(x0, xa, Threat("linf", eps))
    return dict(
        fields,
        eps=eps,
        max_linf=float(d.max()),
        mean_linf=float(d.mean()),
        robust_accuracy=acc,
        audit_ok=bool(rep.ok),
        audit_outside=int((~rep.within).sum()),
        audit=rep.describe(3),
    )


def _attack_model(name, apply, params, stoch, *, x0, y, eps, a, rounds, key, eval_key) -> list[dict]:
    """Rows of one model at one eps: (a) chained and (b) bounded for every n, each from ONE run of
    max(n) rounds (its prefixes; ``seconds``: the time up to round n)."""
    from sarjax.attacks import PGDStep, make_pgd, make_rounds

    f = stoch if stoch is not None else apply
    hp = dict(norm="linf", eps=eps, steps=a.steps, step=PGDStep(rel_step=0.25), eot=a.eot if stoch is not None else 1)

    def acc(xa):
        return _accuracy(apply, params, stoch, xa, y, eval_key, a.eval_draws)

    print(
        "(a) chained rounds: the attack is built with audit=False EXPLICITLY (the Note's error is "
        "reproduced on purpose); its outputs are audited afterwards against the ORIGINAL inputs"
    )
    t0 = time.perf_counter()
    chain = chained_rounds(
        make_pgd(f, audit=False, **hp), params=params, x0=x0, y=y, key=key, eps=eps, rounds=max(rounds)
    )
    t_chain = time.perf_counter() - t0
    rows = [
        _row(x0, chain[n - 1], eps, acc(chain[n - 1]), model=name, method="chained", rounds=n, seconds=None)
        for n in rounds
    ]
    rows[-1]["seconds"] = t_chain  # the whole chain of max(n) rounds
    # (b) ONE make_rounds call of max(n) rounds: round r (0-based) starts from the best point of
    # rounds 0..r-1, i.e. make_rounds(attack, r)'s best_x (same keys fold_in(key, r), same
    # combination), so the starts seen by the wrapped attack ARE the n-round results
    starts: dict[int, tuple] = {}
    t0 = time.perf_counter()

    def recorded(params, x0_, ref, *, key, mask=None, x_init=None, **kw):
        key_ = key
        if x_init is not None:
            starts[len(starts) + 1] = (np.asarray(x_init), time.perf_counter() - t0)
        else:
            starts.clear()
        return bounded(params, x0_, ref, key=key_, mask=mask, x_init=x_init, **kw)

    bounded = make_pgd(f, **hp)
    res = make_rounds(recorded, max(rounds), norm="linf")(params, x0, y, key=key, eps=eps)
    starts[max(rounds)] = (np.asarray(res.best_x), time.perf_counter() - t0)
    for n in rounds:
        xa, dt = starts[n]
        rows.append(_row(x0, xa, eps, acc(xa), model=name, method="bounded", rounds=n, seconds=dt))
    return rows


def _stronger(name, apply, params, stoch, *, x0, y, eps, a, key, eval_key) -> list[dict]:
    """Is the bounded attack's robust accuracy on the randomized model an artefact of a weak attack?
    Other bounded attacks (``--stronger-methods``), audited against ``x0``: ``transfer``, PGD of 100
    steps of eps/16 on the noise-off model (a transfer to the deployed, randomized one: no gradient
    through the randomness); ``apgd``, APGD-CE (Croce & Hein 2020) with EOT over ``--eot`` draws for
    ``--stronger-iter`` iterations; ``square``, the gradient-free Square attack (Andriushchenko et al.
    2020, p_init 0.8) with ``--square-queries`` queries on the noise-off model (a check for gradient
    masking: it needs no gradient).
    Each row also has the noise-off model's accuracy at the same points (``robust_accuracy_noise_off``;
    for the transfer attack: white-box robust accuracy of the noise-off model)."""
    from sarjax.attacks import PGDStep, make_apgd, make_pgd
    from sarjax.attacks.square import make_square

    attacks = {
        "transfer": (
            "transfer-pgd100",
            lambda: make_pgd(apply, norm="linf", eps=eps, steps=100, step=PGDStep(rel_step=1 / 16)),
        ),
        "apgd": (
            f"apgd-ce-eot{a.eot}-{a.stronger_iter}it",
            lambda: make_apgd(stoch, norm="linf", n_iter=a.stronger_iter, eot=a.eot),
        ),
        "square": (
            f"square-noise-off-{a.square_queries}q",
            lambda: make_square(apply, norm="linf", n_queries=a.square_queries),
        ),
    }
    rows = []
    for m in a.stronger_methods.split(","):
        method, build = attacks[m]
        atk = build()
        t0 = time.perf_counter()
        res = atk(params, x0, y, key=jax.random.fold_in(key, 0x57), eps=eps)
        xa = np.asarray(res.x_adv)
        acc = _accuracy(apply, params, stoch, xa, y, eval_key, a.eval_draws)
        det = _accuracy(apply, params, None, xa, y, eval_key, 0)  # the noise-off model at the same points
        rows.append(
            _row(
                x0,
                xa,
                eps,
                acc,
                model=name,
                method=method,
                rounds=1,
                seconds=time.perf_counter() - t0,
                robust_accuracy_noise_off=det,
            )
        )
    return rows


def _table(rows, n_samples) -> None:
    print(f"{'method':8s} {'n':>3s} {'max linf':>9s} {'x eps':>6s} {'robust acc':>10s}  audit vs the original input")
    for r in rows:
        verdict = "ok" if r["audit_ok"] else f"FAILS ({r['audit_outside']}/{n_samples} outside)"
        print(
            f"{r['method']:8s} {r['rounds']:3d} {r['max_linf']:9.4f} {r['max_linf'] / r['eps']:6.2f} "
            f"{100 * r['robust_accuracy']:9.1f}%  {verdict}"
        )


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--zoo",
        action="append",
        default=None,
        help="defense zoo directory (sarjax train-defenses --out DIR); repeatable",
    )
    ap.add_argument(
        "--control",
        action="append",
        default=None,
        help="zoo defense(s) attacked as the deterministic control (default: pgd-at-linf-0.1 and pgd-at-linf-0.3)",
    )
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument(
        "--eps",
        default="0.1",
        help="linf radius or radii, comma-separated (default 0.1, MNIST's milder standard point; the Note's own is 8/255)",
    )
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument(
        "--eot", type=int, default=10, help="EOT draws per step for the randomized model (the Note: num_eot=10)"
    )
    ap.add_argument("--eval-draws", type=int, default=16)
    ap.add_argument("--sigma", type=float, default=0.3, help="the stand-in's inference noise")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--rounds", default=",".join(map(str, ROUNDS)))
    ap.add_argument(
        "--stronger",
        action="store_true",
        help="also attack the randomized model with PGD-100 transferred from its noise-off view and APGD-CE + EOT",
    )
    ap.add_argument("--stronger-only", action="store_true", help="only --stronger's attacks (no rounds, no controls)")
    ap.add_argument("--stronger-iter", type=int, default=20, help="APGD-CE iterations of --stronger")
    ap.add_argument("--stronger-methods", default="transfer,apgd,square", help="--stronger's attacks (comma-separated)")
    ap.add_argument("--square-queries", type=int, default=1000, help="Square's queries in --stronger")
    ap.add_argument("--quick", action="store_true", help="100 samples, 5 steps, 4 EOT draws, 2 epochs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out",
        default=None,
        help="JSON path (default: a temporary folder, never benchmarks/results/)",
    )
    ap.add_argument("--plot", default=None, help="PNG path (default: --out with .png)")
    ap.add_argument("--replot", default=None, metavar="JSON", help="only draw the plot of a JSON this script wrote")
    a = ap.parse_args(argv)
    if a.replot:
        done = json.loads(Path(a.replot).read_text())
        _plot(done["rows"], a.plot or str(Path(a.replot).with_suffix(".png")))
        return done
    if a.quick:
        a.samples, a.steps, a.eot, a.epochs, a.eval_draws = 100, 5, 4, 2, 8
    a.control = a.control or ["pgd-at-linf-0.1", "pgd-at-linf-0.3"]
    a.eps = [_radius(e) for e in str(a.eps).split(",")]
    rounds = sorted({int(r) for r in a.rounds.split(",")})
    from sarjax.data.mnist import load_mnist

    data = load_mnist()
    # a fixed random subset (chosen while the embedded test split was class-sorted; kept for comparability)
    sel = np.sort(np.random.default_rng(0).permutation(len(data.x_test))[: a.samples])
    x0 = np.asarray(data.x_test[sel], np.float32)
    y = np.asarray(data.y_test[sel], np.int32)
    key = jax.random.PRNGKey(a.seed)
    eval_key = jax.random.fold_in(key, 0xE7A1)  # never seen by an attack
    rows = []
    notes = {}
    clean = {}
    t_all = time.perf_counter()
    out_path = results_path("note_chained_rounds.json", a.out, quick=a.quick)
    a.out = str(out_path)
    started = provenance()  # command, commit, machine, date and load at the start

    def dump() -> dict:
        out = dict(
            benchmark="note_chained_rounds",
            paper="the Note (Fort 2025): chained rounds grow the perturbation to n * eps",
            settings=dict(vars(a), rounds=rounds),
            samples=len(x0),
            models=notes,
            clean_accuracy=clean,
            rows=rows,
            seconds=time.perf_counter() - t_all,
            load=os.getloadavg(),
            machine=platform.platform(),
            jax=jax.__version__,
            backend=jax.default_backend(),
            provenance=started,
            command=started["command"],
            commit=started["commit"],
            date=started["date"],
            load_before=started["load"],
        )
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(out, indent=1))
        return out

    models = _models(a, data)
    for name, apply, params, stoch, note in models:
        notes[name] = note
        clean[name] = _accuracy(apply, params, stoch, x0, y, eval_key, a.eval_draws)
        print(f"{name}: {note}; clean accuracy {100 * clean[name]:.1f}% on {len(x0)} test images")
    for eps in a.eps:  # radius outer: a long run has every model at the first radius first
        for name, apply, params, stoch, _ in models:
            if a.stronger_only and stoch is None:
                continue
            print(f"\n== {name}, eps {eps:.4f}")
            new = []
            if not a.stronger_only:
                new += _attack_model(
                    name, apply, params, stoch, x0=x0, y=y, eps=eps, a=a, rounds=rounds, key=key, eval_key=eval_key
                )
            if (a.stronger or a.stronger_only) and stoch is not None:
                new += _stronger(name, apply, params, stoch, x0=x0, y=y, eps=eps, a=a, key=key, eval_key=eval_key)
            rows.extend(new)
            _table(new, len(x0))
            dump()  # after every model and radius: a long run keeps what it measured
    out = dump()
    print(f"\nwrote {a.out} (load {os.getloadavg()[0]:.1f})")
    if any(r["method"] in ("chained", "bounded") for r in rows):
        _plot(rows, a.plot or str(out_path.with_suffix(".png")))
    return out


def _radius(text: str) -> float:
    """``"0.1"`` or a fraction ``"8/255"`` -> float."""
    num, _, den = text.strip().partition("/")
    return float(num) / float(den) if den else float(num)


def _plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    radii = sorted({r["eps"] for r in rows})
    fig, ax = plt.subplots(len(radii), 2, figsize=(10, 4 * len(radii)), squeeze=False)
    for i, eps in enumerate(radii):
        rr_eps = [r for r in rows if r["eps"] == eps]
        for model in dict.fromkeys(r["model"] for r in rr_eps):
            for method, ls in (("chained", "-"), ("bounded", "--")):
                rr = [r for r in rr_eps if r["model"] == model and r["method"] == method]
                n = [r["rounds"] for r in rr]
                ax[i, 0].plot(n, [r["max_linf"] for r in rr], ls, marker="o", label=f"{model}, {method}")
                ax[i, 1].plot(n, [100 * r["robust_accuracy"] for r in rr], ls, marker="o", label=f"{model}, {method}")
        ns = sorted({r["rounds"] for r in rr_eps})
        ax[i, 0].plot(ns, [eps] * len(ns), "k:", label="eps")
        ax[i, 0].plot(ns, [min(n * eps, 1.0) for n in ns], "k-.", lw=0.8, label="n * eps (capped at 1: the box)")
        ax[i, 0].set(xscale="log", xlabel="rounds n", ylabel="max linf distance to the ORIGINAL input")
        ax[i, 1].set(xscale="log", xlabel="rounds n", ylabel="robust accuracy reported (%)")
        ax[i, 0].set_title(f"eps = {eps:.4g}", fontsize=9)
        ax[i, 0].legend(fontsize=7)
        ax[i, 1].legend(fontsize=7)
    fig.suptitle("the Note: chained rounds (the error) vs bounded rounds (sarjax make_rounds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
