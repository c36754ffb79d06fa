"""AutoAttack in sarjax vs torchattacks' ``AutoAttack`` on the same weights: robust accuracy and speed.

The model: a defense of the zoo (``--zoo DIR --defense NAME``, e.g. ``/work/zoo/mnist``
``pgd-at-linf-0.3``; a ``cnn`` or ``mlp`` zoo architecture), the first member of ``--pool DIR``,
or a small CNN (``zoo.cnn((8, 16), dense=64)``) trained here on the embedded MNIST (PGD-AT linf
``--train-eps`` with ``--pgd-at``, else standard training). Its weights are copied into the
equivalent ``torch.nn`` module (the twins of ``benchmarks/train_throughput.py``; the logits are
checked to agree). Both AutoAttacks then run the standard version (``--norm`` linf or l2,
``--eps``) on the same ``--samples`` test images, ALTERNATED for ``--repeats`` rounds (sarjax,
torch, sarjax, torch, ...; the first sarjax call compiles and is timed separately), and the
script reports each one's robust accuracy, their agreement, the wall time per 1,000 images and
per stage. torchattacks' ``AutoAttack`` is its ``MultiAttack`` over APGD, APGD-T, FAB-T and
Square; the script runs that loop itself (the same code: each attack on the images still
classified correctly, its successes kept) to time every stage. torchattacks runs once per
``--threads`` count in every round (default 1 and 2 intra-op threads); the speed ratio is against
the fastest of them (median over the rounds).

torchattacks' defaults differ from AutoAttack's reference code (fra31/auto-attack,
``autoattack.py``): its ``AutoAttack`` builds APGD, APGD-T and FAB with their class defaults of
``steps = 10`` iterations (the reference: 100) and Square with ``resc_schedule=True`` (the
reference's AutoAttack: False); the targets (9), restarts (1), Square's 5,000 queries and
``p_init = 0.8`` agree. The peer comparison therefore runs sarjax at torchattacks' 10 iterations
(``--iters``, default 10: the same work) and with torchattacks' rescaled Square schedule
(``square_rescale_schedule=True``; sarjax's AutoAttack default is the reference's False);
``--reference`` adds a sarjax run at the reference's 100 iterations and Square schedule (robust
accuracy only, for the record). ``--apgd-alone`` compares APGD-CE and APGD-T run alone: the
reference, torchattacks and sarjax with either l2 projection, and sarjax started from the
reference's own random points. ``--arbiter`` also runs AutoAttack's own APGD-CE and then APGD-T
(the reference code, pip ``pyautoattack``, ``autopgd_base.py``) at ``--iters`` on the same torch
twin and images: the robust accuracy after each of the two stages, to tell whose APGD differs
from the reference when sarjax and torchattacks disagree (robust accuracy only, not timed).

l2: sarjax's APGD uses the reference's l2 rule (rescale onto the ball, then clip to the box;
``make_apgd(schedule=APGDSchedule(projection="reference"))``, the default); before, it projected exactly onto the
ball ∩ box, a stronger attack, and disagreed with both peers (docs/autoattack.md). torchattacks
3.5.1's ``APGDT`` takes the l2 gradient step with ``step_size[0]`` (``apgdt.py``, the L2 branch):
every row moves with the first row's step size, not its own.

``--repeats 0``: the compiling sarjax call is its only round and torchattacks runs once (sarjax's
wall time then includes compilation).

    python benchmarks/autoattack_vs_torch.py --quick     # 32 images, a minute or two (JSON to a temporary folder)
    python benchmarks/autoattack_vs_torch.py --zoo /work/zoo/mnist --defense pgd-at-linf-0.3 --eps 0.3
    python benchmarks/autoattack_vs_torch.py --zoo /work/zoo/mnist --defense pgd-at-l2-1.5 --norm l2 --eps 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see benchmarks/train_throughput.py

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import add_torch_threads_argument, provenance, results_path  # noqa: E402
from train_throughput import load_jax_params, torch_module  # noqa: E402  (the torch twins)


def _model(a, data):
    from sarjax.models import zoo

    if a.zoo:
        from sarjax.defenses.zoo_io import load_zoo

        zm = load_zoo(a.zoo, [a.defense])[a.defense]
        if zm.pool is None or zm.stochastic:
            raise SystemExit(f"{a.defense}: a deterministic zoo-architecture defense is needed (cnn or mlp)")
        stack = zm.pool.stacks[0]
        return stack.arch, jax.tree.map(lambda v: v[0], stack.params), f"{a.zoo} {a.defense} ({stack.arch.name})"
    if a.pool:
        from sarjax.models.checkpoint import load_pool

        pool, _ = load_pool(a.pool)
        stack = pool.stacks[0]
        return stack.arch, jax.tree.map(lambda v: v[0], stack.params), f"{a.pool} member 0 ({stack.names[0]})"
    from sarjax.defenses import make_objective
    from sarjax.models.train import MemberConfig, TrainConfig, TrainMonitor, train_stack

    arch = zoo.cnn((8, 16), dense=64)
    obj = make_objective("pgd-at", eps=a.train_eps, norm="linf") if a.pgd_at else None
    stack, _ = train_stack(
        arch,
        [MemberConfig(seed=a.seed)],
        data.x_train,
        data.y_train,
        config=TrainConfig(epochs=a.epochs, patience=0),
        monitor=TrainMonitor(progress=False),
        objective=obj,
    )
    what = f"zoo.cnn((8, 16), dense=64), {'PGD-AT linf ' + str(a.train_eps) if a.pgd_at else 'standard'}, {a.epochs} epochs"
    return arch, jax.tree.map(lambda v: v[0], stack.params), what


def _correct(tm, x, y) -> np.ndarray:
    """``[n]`` bool: the torch twin classifies ``x`` as ``y``."""
    import torch

    with torch.no_grad():
        return (tm(x).argmax(1) == y).numpy()


def _arbiter(a, tm, xt, yt) -> dict:
    """AutoAttack's reference APGD-CE, then APGD-T on the points it leaves robust (pyautoattack,
    ``autopgd_base.py``, ``--iters`` iterations, seed ``--seed``): robust accuracy after each."""
    from pyautoattack.autopgd_base import APGDAttack, APGDAttack_targeted

    tnorm = {"linf": "Linf", "l2": "L2"}[a.norm]
    robust = _correct(tm, xt, yt)
    out = {}
    for name, cls in (("apgd-ce", APGDAttack), ("apgd-t", APGDAttack_targeted)):
        idx = np.flatnonzero(robust)
        if len(idx):
            atk = cls(tm, n_iter=a.iters, norm=tnorm, eps=a.eps, seed=a.seed, device="cpu")
            robust[idx] = _correct(tm, atk.perturb(xt[idx], yt[idx]), yt[idx])
        out[name] = float(robust.mean())
    out["robust"] = np.flatnonzero(robust).tolist()
    return out


def _apgd_alone(a, arch, params, tm, x, y, xt, yt) -> dict:
    """APGD-CE and APGD-T alone (``--iters``, the correctly classified images): how many images each
    implementation leaves robust. The reference (pyautoattack) at seeds ``--seed`` .. ``--seed + 2``;
    torchattacks; sarjax with each l2 ``projection`` at keys ``--seed``, ``--seed + 1``; sarjax's
    APGD-CE from the reference's own random start (``x_init``), compared per image; and
    torchattacks' ``APGDT`` with its ``step_size[0]`` (l2 branch) replaced by ``step_size``."""
    import inspect
    import types

    import torch
    import torchattacks
    import torchattacks.attacks.apgdt as ta_apgdt
    from pyautoattack.autopgd_base import APGDAttack, APGDAttack_targeted

    from sarjax.attacks.apgd import APGDSchedule, make_apgd, make_apgd_t

    tnorm = {"linf": "Linf", "l2": "L2"}[a.norm]
    idx = np.flatnonzero(_correct(tm, xt, yt))
    xs, ys = xt[idx], yt[idx]

    def robust(adv):
        return _correct(tm, adv, ys)

    out = {"images": len(idx)}
    seeds = [a.seed + k for k in range(3)]
    ref_ce = {
        sd: robust(APGDAttack(tm, n_iter=a.iters, norm=tnorm, eps=a.eps, seed=sd, device="cpu").perturb(xs, ys))
        for sd in seeds
    }
    out["reference apgd-ce"] = [int(ref_ce[sd].sum()) for sd in seeds]
    out["reference apgd-t"] = [
        int(
            robust(
                APGDAttack_targeted(tm, n_iter=a.iters, norm=tnorm, eps=a.eps, seed=sd, device="cpu").perturb(xs, ys)
            ).sum()
        )
        for sd in seeds
    ]
    out["torchattacks apgd-ce"] = int(
        robust(torchattacks.APGD(tm, norm=tnorm, eps=a.eps, steps=a.iters, seed=a.seed)(xs, ys)).sum()
    )
    out["torchattacks apgd-t"] = int(
        robust(torchattacks.APGDT(tm, norm=tnorm, eps=a.eps, steps=a.iters, seed=a.seed, n_classes=10)(xs, ys)).sum()
    )
    src = inspect.getsource(ta_apgdt)
    if "step_size[0] * grad" in src:  # torchattacks 3.5.1: every row steps with row 0's step size
        fixed = types.ModuleType("apgdt_step_size_fixed")
        fixed.__package__ = ta_apgdt.__package__
        exec(
            compile(src.replace("step_size[0] * grad", "step_size * grad"), "apgdt_step_size_fixed", "exec"),
            fixed.__dict__,
        )
        out["torchattacks apgd-t, step_size[0] -> step_size"] = int(
            robust(fixed.APGDT(tm, norm=tnorm, eps=a.eps, steps=a.iters, seed=a.seed, n_classes=10)(xs, ys)).sum()
        )
    x0j, yj = jnp.asarray(x[idx]), jnp.asarray(y[idx])
    for proj in ("reference", "exact"):
        for name, make in (("apgd-ce", make_apgd), ("apgd-t", make_apgd_t)):
            fn = make(arch.apply, norm=a.norm, eps=a.eps, n_iter=a.iters, schedule=APGDSchedule(projection=proj))
            out[f"sarjax {name} projection={proj}"] = [
                int((~np.asarray(fn(params, x0j, yj, key=jax.random.PRNGKey(k)).best_success).reshape(-1)).sum())
                for k in (a.seed, a.seed + 1)
            ]
    # the reference's start for these rows: its first draw after torch.manual_seed(seed)
    torch.manual_seed(a.seed)
    if a.norm == "l2":
        t = torch.randn(xs.shape)
        start = xs + a.eps * t / (t.flatten(1).norm(dim=1).view(-1, 1, 1, 1) + 1e-12)
    else:  # the reference's first draw is torch.rand (a randn before it would shift the stream)
        t = 2 * torch.rand(xs.shape) - 1
        start = xs + a.eps * t / t.flatten(1).abs().amax(1).view(-1, 1, 1, 1)
    start = jnp.asarray(start.clamp(0, 1).numpy().transpose(0, 2, 3, 1))
    for proj in ("reference", "exact"):
        fn = make_apgd(arch.apply, norm=a.norm, eps=a.eps, n_iter=a.iters, schedule=APGDSchedule(projection=proj))
        r = ~np.asarray(fn(params, x0j, yj, key=jax.random.PRNGKey(a.seed), x_init=start).best_success).reshape(-1)
        out[f"sarjax apgd-ce projection={proj} from the reference's start"] = int(r.sum())
        out[f"  projection={proj}: images robust for only one of it and the reference (seed {a.seed})"] = int(
            (r != ref_ce[a.seed]).sum()
        )
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--eps", type=float, default=0.1)
    ap.add_argument("--norm", choices=["linf", "l2"], default="linf")
    ap.add_argument("--zoo", default=None, help="a defense zoo directory (sarjax train-defenses)")
    ap.add_argument("--defense", default="pgd-at-linf-0.3", help="the zoo defense to attack (with --zoo)")
    ap.add_argument("--iters", type=int, default=10, help="APGD / FAB iterations of both (torchattacks: 10)")
    ap.add_argument("--square-queries", type=int, default=5000)
    ap.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="alternated rounds after the compiling call (0: the compiling call is sarjax's only round, "
        "torchattacks runs once; sarjax's time then includes compilation)",
    )
    ap.add_argument(
        "--batch-size",
        type=int,
        default=250,
        help="sarjax rows per compiled call (AutoAttack's bs; still-robust rows are packed)",
    )
    add_torch_threads_argument(ap, "torchattacks")
    ap.add_argument("--pool", default=None, help="a saved pool: attack its first member (a CNN or MLP)")
    ap.add_argument("--pgd-at", action="store_true", help="train the CNN with PGD-AT (else standard)")
    ap.add_argument("--train-eps", type=float, default=0.1)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--reference", action="store_true", help="also run sarjax at the reference's 100 iterations")
    ap.add_argument(
        "--arbiter", action="store_true", help="also run the reference's (pyautoattack) APGD-CE and APGD-T at --iters"
    )
    ap.add_argument(
        "--apgd-alone",
        action="store_true",
        help="also APGD-CE / APGD-T alone: reference (pyautoattack), torchattacks and sarjax (both l2 projections)",
    )
    ap.add_argument("--quick", action="store_true", help="32 images, 1 repeat, 500 Square queries, 1 epoch, batch 16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON path (default: a temporary folder, never benchmarks/results/)")
    from sarjax.runtime.compile_cache import add_compile_cache_argument, enable_compile_cache

    add_compile_cache_argument(ap)  # a warm cache makes the first sarjax call load, not compile
    a = ap.parse_args(argv)
    a.out = str(results_path("autoattack_vs_torch.json", a.out, quick=a.quick))
    if a.compile_cache:
        enable_compile_cache(a.compile_cache)
    if a.quick:
        a.samples, a.repeats, a.square_queries, a.epochs, a.batch_size = 32, 1, 500, 1, 16
    import torch
    import torchattacks

    from sarjax.attacks.autoattack import AutoAttackSettings, autoattack, autoattack_config
    from sarjax.data.mnist import load_mnist

    torch.set_num_threads(max(a.threads))
    data = load_mnist()
    arch, params, what = _model(a, data)
    # a fixed random subset of the embedded test split (the same images as the earlier runs)
    sel = np.sort(np.random.default_rng(0).permutation(len(data.x_test))[: a.samples])
    x = np.asarray(data.x_test[sel], np.float32)
    y = np.asarray(data.y_test[sel], np.int32)
    tm = torch_module(arch).eval()
    load_jax_params(arch, params, tm)
    xt, yt = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()), torch.from_numpy(y.astype(np.int64))
    with torch.no_grad():
        zt = tm(xt).numpy()
    zj = np.asarray(arch.apply(params, jnp.asarray(x)))
    twin = float(np.max(np.abs(zt - zj)))
    print(f"model: {what}; torch twin max |logit diff| {twin:.2e}")
    if twin > 1e-3 * (1 + np.abs(zj).max()):
        raise SystemExit("the torch twin disagrees with the JAX model")
    clean = float(np.mean(np.argmax(zj, 1) == y))

    def run_sarjax(n_iter=a.iters, rescale=True):
        cfg = autoattack_config(
            a.norm, a.eps, n_iter=n_iter, fab_iter=n_iter, square_queries=a.square_queries,
            square_rescale_schedule=rescale,  # torchattacks' Square default: True; the reference's AutoAttack: False
        )  # fmt: skip
        quiet = AutoAttackSettings(log=False, checks=False, batch_size=a.batch_size)
        res = autoattack(arch.apply, params, x, y, attack=cfg, key=jax.random.PRNGKey(a.seed), settings=quiet)
        return float(res.robust_accuracy[0]), res

    def run_torch():
        tnorm = {"linf": "Linf", "l2": "L2"}[a.norm]
        atk = torchattacks.AutoAttack(tm, norm=tnorm, eps=a.eps, version="standard", n_classes=10, seed=a.seed)
        subs = atk._autoattack.attacks
        for sub in subs:  # the same budget as sarjax's run
            if hasattr(sub, "steps"):
                sub.steps = a.iters
            if hasattr(sub, "n_queries"):
                sub.n_queries = a.square_queries
        # torchattacks.MultiAttack.forward, timed per attack: each attack on the images still correct
        fails = torch.arange(len(yt))
        xa = xt.clone()
        stage_s = []
        for sub in subs:
            t0 = time.perf_counter()
            adv = sub(xt[fails], yt[fails])
            with torch.no_grad():
                corrects = tm(adv).argmax(1) == yt[fails]
            xa[fails[~corrects]] = adv[~corrects]
            fails = fails[corrects]
            stage_s.append((type(sub).__name__, time.perf_counter() - t0, len(fails) / len(yt)))
            if len(fails) == 0:
                break
        with torch.no_grad():
            pred = tm(xa).argmax(1).numpy()
        d = (xa - xt).flatten(1)
        dist = float((d.abs().amax(1) if a.norm == "linf" else d.norm(dim=1)).max().item())
        run_torch.robust = pred == y
        run_torch.stages = stage_s
        return float(np.mean(pred == y)), dist

    t0 = time.perf_counter()
    acc_s, res = run_sarjax()  # compile + run
    first = time.perf_counter() - t0
    print(f"sarjax first call (compiles): {first:.1f} s, robust accuracy {100 * acc_s:.1f}%")
    contenders = [f"torchattacks_{t}t" for t in a.threads]
    times = {k: [] for k in ["sarjax", *contenders]}
    stage_rows = []
    accs = {k: [] for k in ["sarjax", *contenders]}
    robust_t, stages_t = {}, {}
    if a.repeats < 0:
        raise SystemExit("--repeats must be >= 0")
    for r in range(max(a.repeats, 1)):
        if a.repeats == 0:  # the compiling call is sarjax's round (its time includes compilation)
            acc, t_s = acc_s, first
        else:
            t0 = time.perf_counter()
            acc, res = run_sarjax()
            t_s = time.perf_counter() - t0
        times["sarjax"].append(t_s)
        accs["sarjax"].append(acc)
        line = f"round {r}: sarjax {times['sarjax'][-1]:.1f} s ({100 * acc:.1f}%)"
        for th, name in zip(a.threads, contenders):
            torch.set_num_threads(th)
            t0 = time.perf_counter()
            acc_t, dist_t = run_torch()
            times[name].append(time.perf_counter() - t0)
            accs[name].append(acc_t)
            robust_t[name], stages_t[name] = run_torch.robust, run_torch.stages
            line += f", {name} {times[name][-1]:.1f} s ({100 * acc_t:.1f}%, max {a.norm} {dist_t:.4f})"
        print(f"{line}; load {os.getloadavg()[0]:.1f}")
        stage_rows.append(
            dict(
                sarjax=[
                    dict(name=s.name, seconds=s.seconds, robust_accuracy=float(s.robust_accuracy[0])) for s in res.log
                ],
                **{
                    name: [dict(name=n, seconds=t, robust_accuracy=r) for n, t, r in stages_t[name]]
                    for name in contenders
                },
                load=os.getloadavg(),
            )
        )
        for name in contenders:
            print(
                f"  per stage (s) vs {name}: "
                + ", ".join(
                    f"{ss.name} {ss.seconds:.1f} vs {tn} {tt:.1f}" for ss, (tn, tt, _) in zip(res.log, stages_t[name])
                )
            )
    med = {k: float(np.median(v)) for k, v in times.items()}
    per_k = {k: 1000.0 * v / a.samples for k, v in med.items()}
    baseline = min(contenders, key=lambda k: med[k])  # the fastest torchattacks thread count
    ratio = med[baseline] / med["sarjax"]
    run_torch.robust, run_torch.stages = robust_t[baseline], stages_t[baseline]
    diff = 100 * (np.median(accs["sarjax"]) - np.median(accs[baseline]))
    print(f"\nclean accuracy {100 * clean:.1f}%  {a.norm} eps {a.eps}  {a.samples} images  iterations {a.iters}")
    print(
        f"robust accuracy: sarjax {100 * np.median(accs['sarjax']):.2f}%  {baseline} {100 * np.median(accs[baseline]):.2f}%  (diff {diff:+.2f} points)"
    )
    print(
        f"seconds per 1,000 images: sarjax {per_k['sarjax']:.1f}  "
        + "  ".join(f"{k} {per_k[k]:.1f}" for k in contenders)
        + f"  speed ratio vs the fastest ({baseline}) {ratio:.2f}x"
    )
    print("sarjax stages: " + ", ".join(f"{s.name} {100 * s.robust_accuracy[0]:.1f}%" for s in res.log))
    only_s = np.flatnonzero(res.robust[:, 0] & ~run_torch.robust).tolist()
    only_t = np.flatnonzero(~res.robust[:, 0] & run_torch.robust).tolist()
    print(f"robust for sarjax only: {only_s}; robust for torchattacks only: {only_t} (last round)")
    arbiter = None
    if a.arbiter:
        arbiter = _arbiter(a, tm, xt, yt)
        print(
            f"reference (pyautoattack) at {a.iters} iterations: after APGD-CE {100 * arbiter['apgd-ce']:.1f}%, "
            f"after APGD-T {100 * arbiter['apgd-t']:.1f}% (sarjax: "
            + ", ".join(f"{s.name} {100 * s.robust_accuracy[0]:.1f}%" for s in res.log[:2])
            + "; torchattacks: "
            + ", ".join(f"{n} {100 * r:.1f}%" for n, _, r in run_torch.stages[:2])
            + ")"
        )
    alone = None
    if a.apgd_alone:
        alone = _apgd_alone(a, arch, params, tm, x, y, xt, yt)
        print(f"APGD alone, {a.iters} iterations, images left robust of {alone['images']}:")
        for k, v in alone.items():
            if k != "images":
                print(f"  {k}: {v}")
    ref = None
    if a.reference:
        t0 = time.perf_counter()
        acc_ref, res_ref = run_sarjax(100, rescale=False)  # the reference's iterations and Square schedule
        ref = dict(
            robust_accuracy=acc_ref, seconds=time.perf_counter() - t0, queries_mean=float(res_ref.queries.mean())
        )
        print(f"sarjax at the reference's 100 iterations: robust accuracy {100 * acc_ref:.2f}%")
    out = dict(
        benchmark="autoattack_vs_torch",
        model=what,
        settings=vars(a),
        torch_twin_max_abs_diff=twin,
        clean_accuracy=clean,
        robust_accuracy={k: v for k, v in accs.items()},
        robust_accuracy_diff_points=float(diff),
        robust_only_sarjax=only_s,
        robust_only_torchattacks=only_t,
        seconds=times,
        stage_seconds=stage_rows,
        seconds_per_1000_images=per_k,
        speed_ratio_torch_over_sarjax=ratio,
        baseline=baseline,
        sarjax_first_call_seconds=first,
        sarjax_seconds_include_compilation=a.repeats == 0,
        sarjax_stages=[
            dict(name=s.name, robust_accuracy=float(s.robust_accuracy[0]), queries=s.queries) for s in res.log
        ],
        sarjax_queries_per_image=float(res.queries.mean()),
        reference_100_iterations=ref,
        arbiter_pyautoattack=arbiter,
        apgd_alone=alone,
        defaults_note=(
            "torchattacks.AutoAttack builds APGD/APGD-T/FAB with steps=10 (reference: 100) and Square with "
            "resc_schedule=True (reference: False); both run here at --iters and sarjax's Square with the rescaled "
            "schedule (square_rescale_schedule=True) for the peer comparison; sarjax's "
            "Square draws window positions over every position that fits (the reference: never the last row/column)"
        ),
        load=os.getloadavg(),
        machine=platform.platform(),
        torch=torch.__version__,
        torchattacks=torchattacks.__version__,
        jax=jax.__version__,
        provenance=provenance(),  # command, commit, machine, date, load
    )
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out}")
    return out


if __name__ == "__main__":
    main()
