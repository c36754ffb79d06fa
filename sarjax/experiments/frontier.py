"""``sarjax frontier``: the attack pool on saved pools, nested ensembles, AOI / DOI tables, JSON, plots.

the frontier paper end to end on MNIST pools saved by ``sarjax train-pool``: every member of every
``--models`` directory is a model.  For each pool directory and each entry of the minimum-norm
attack pool (the norm's attacks of the frontier paper Table 2 plus FAB, each with its random restarts
and top-k targeted runs as separate entries, Section 5.1) one vmapped call attacks every member
on the first ``--samples`` test images and records the trajectory (best distance every 10
queries).  Results are cached per (pool directory, entry) in ``OUT/cache``; a rerun reuses them
and a cache written with other settings is refused (a fingerprint, as ``sarjax sar`` does).
Then Algorithm 1 is fitted on the train models at the nested tiers (``--tiers``), the held-out
AOI is reported beside the train AOI, the DOI of every model at every tier, the rank
instability, and ``OUT/frontier.json`` plus four plots are written.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any

from sarjax.runtime import fingerprint as fingerprints
from sarjax.runtime.compile_cache import release_compiled_near_map_limit
from sarjax.runtime.progress import progress_bar

NORMS = ("l0", "l1", "l2", "linf")
# Which attack supports which norm (docs/minnorm.md); the frontier paper Table 2 plus FAB.
ATTACK_NORMS = {
    "fmn": ("l0", "l1", "l2", "linf"),
    "ddn": ("l2",),
    "alma": ("l1", "l2"),
    "pdgd": ("l2",),
    "pdpgd": ("l0", "l1", "l2", "linf"),
    "sigma_zero": ("l0",),
    "apgd_min_ce": ("l1", "l2", "linf"),
    "apgd_min_dlr": ("l1", "l2", "linf"),
    "fab": ("l1", "l2", "linf"),
}
NO_RESTARTS = ("ddn", "alma")  # the frontier paper Table 2: "-" (unsupported)
# Radius of the random restarts' starting points (ours; the frontier paper does not give one): MNIST scale.
INIT_EPS = {"l0": 10.0, "l1": 5.0, "l2": 1.0, "linf": 0.1}
CACHE_HINT = "pass --overwrite to discard the cached runs or choose another --out"


@dataclass(frozen=True)
class EntrySpec:
    """One pool entry to run: ``attack`` as a base run, restart ``rank`` or targeted run ``rank``."""

    name: str
    attack: str
    kind: str
    rank: int

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "attack": self.attack, "kind": self.kind, "rank": self.rank}


def attack_pool(norm: str, attacks: list[str] | None = None, restarts: int = 5, targeted: int = 9) -> list[EntrySpec]:
    """The entries of the minimum-norm attack pool for a norm.

    the frontier paper Section 5.1: every solver's untargeted run, 5 random restarts (where Table 2
    lists them) and targeted runs at the top-9 most likely wrong classes, each a separate entry.

    Args:
      norm: ``"l0" | "l1" | "l2" | "linf"``.
      attacks: a subset of the norm's attacks (default: all of :data:`ATTACK_NORMS` for it).
      restarts: restarts per attack that supports them.
      targeted: targeted runs per attack (``<= C - 1``).
    """
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    avail = [a for a, ns in ATTACK_NORMS.items() if norm in ns]
    chosen = avail if not attacks else list(attacks)
    bad = [a for a in chosen if a not in avail]
    if bad:
        raise ValueError(f"attacks {bad} do not support {norm} (available: {', '.join(avail)})")
    if restarts < 0 or targeted < 0:
        raise ValueError(f"restarts and targeted must be >= 0, got {restarts} and {targeted}")
    out = []
    for a in chosen:
        out.append(EntrySpec(a, a, "base", 0))
        if a not in NO_RESTARTS:
            out += [EntrySpec(f"{a}/r{r}", a, "restart", r) for r in range(1, restarts + 1)]
        out += [EntrySpec(f"{a}/t{k}", a, "targeted", k) for k in range(1, targeted + 1)]
    return out


def _factory(attack: str, apply, norm: str, cap: int, targeted: bool, stacked: bool = False):
    """A ``MinNormAttackFn`` (audited) for one attack; targeted runs look for any
    misclassification (``success="untargeted"``, the frontier paper Section 5.1)."""
    from sarjax.attacks import alma, apgd_min, ddn, fab, fmn, pdgd, pdpgd, sigma_zero

    kw: dict[str, Any] = {
        "stacked": stacked,
        "norm": norm,
        "max_queries": cap,
        "targeted": targeted,
        "success": "untargeted" if targeted else None,
    }
    makers = {
        "fmn": fmn.make_fmn,
        "ddn": ddn.make_ddn,
        "alma": alma.make_alma,
        "pdgd": pdgd.make_pdgd,
        "pdpgd": pdpgd.make_pdpgd,
        "sigma_zero": sigma_zero.make_sigma_zero,
    }
    if attack in makers:
        return makers[attack](apply, **kw)
    if attack.startswith("apgd_min_"):
        return apgd_min.make_apgd_min(apply, loss=attack.rsplit("_", 1)[1], **kw)
    if attack == "fab":
        return fab.make_fab(apply, fab_t=targeted, **kw)  # targeted entries: FAB-T
    raise ValueError(f"unknown attack {attack!r}")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _apply_of(pool):
    """``(apply, params, stacked, key)``: a one-stack pool runs its stack's one-member apply over
    the stacked params (the Stack protocol's ``member_apply``: each member evaluates only its own
    iterates); zoo pools of one architecture share one compiled kernel (their spec defines the
    function).  Other pools run ``pool.apply``."""
    stacks = getattr(pool, "stacks", ())
    if len(stacks) == 1:
        st = stacks[0]
        fa = getattr(st, "member_apply", None)
        if fa is None and hasattr(getattr(st, "arch", None), "apply"):
            fa = st.arch.apply
        if fa is not None:
            if getattr(st, "kind", None) == "zoo" and hasattr(st, "spec"):
                return fa, st.params, True, ("zoo", json.dumps(st.spec(), sort_keys=True, default=str))
            return fa, st.params, True, ("fn", id(fa))
    return pool.apply, pool.params, False, ("pool", id(pool))


class _FnStack:
    """One member given by a plain ``apply(params, x) -> [B, C]`` (the self-ensemble's plain views)
    in the shape ``run_entry`` and :func:`sarjax.attacks.autoattack.autoattack_pool` read: a
    stacked ``params``, ``member_apply`` and ``arch.apply``."""

    kind = "fn"

    def __init__(self, apply, params, name: str):
        from types import SimpleNamespace

        import jax

        self.member_apply = apply
        self.arch = SimpleNamespace(apply=apply)
        self.params = jax.tree.map(lambda a: a[None], params)
        self.names = (name,)


class _FnPool:
    """A one-member pool of a :class:`_FnStack` (``apply``, ``logits``, ``params``, shapes)."""

    def __init__(self, apply, params, name: str, input_shape=(28, 28, 1), num_classes: int = 10):
        self.stacks = (_FnStack(apply, params, name),)
        self.params = self.stacks[0].params
        self.num_members = 1
        self.input_shape = tuple(input_shape)
        self.num_classes = int(num_classes)
        self._one = apply

    def apply(self, params, x):
        import jax

        return jax.vmap(self._one, (0, None))(params, x)

    def logits(self, x, batch: int = 500):
        import numpy as np

        return np.concatenate(
            [np.asarray(self.apply(self.params, x[s : s + batch])) for s in range(0, len(x), batch)], axis=1
        )


@dataclass
class _Model:
    """One ``--models`` item after loading: a saved pool, or one defense of a defense zoo."""

    label: str  # display prefix of its members' names
    tag: str  # cache folder name under OUT/cache
    group: str  # split stratum (the --models directory)
    pool: Any
    member_names: list[str]


def load_models(models: list[str], defenses: list[str] | None = None) -> list[_Model]:
    """``--models`` directories as pools: a pool saved by ``sarjax train-pool`` (every member a
    model), or a defense zoo written by ``sarjax train-defenses`` (a directory with
    ``zoo.json``: every trained defense a one-member model; the randomized ones are attacked
    deterministically: the noise defense without its inference noise, the self-ensemble through
    its plain views, :func:`sarjax.defenses.zoo_io.load_zoo`).  ``defenses``: only these defenses
    of the zoo directories (all by default; pool directories are always taken whole)."""
    from sarjax.models.checkpoint import load_pool

    out: list[_Model] = []
    seen: set[str] = set()
    for i, d in enumerate(models):
        base = Path(d).name
        if (Path(d) / "zoo.json").is_file():
            from sarjax.defenses.zoo_io import load_zoo

            for name, zm in load_zoo(d).items():
                seen.add(name)
                if defenses is not None and name not in defenses:
                    continue
                pool = zm.pool if zm.pool is not None else _FnPool(zm.apply, zm.params, name)
                out.append(_Model(name, f"zoo-{_safe(base)}-{_safe(name)}", f"{i}-{base}", pool, [name]))
            continue
        pool, _ = load_pool(d)
        member_names = [n for s in pool.stacks for n in s.names] if hasattr(pool, "stacks") else []
        if len(member_names) != pool.num_members:
            member_names = [f"m{j}" for j in range(pool.num_members)]
        names = [f"{base}/{n}" for n in member_names]
        out.append(_Model(base, f"{i}-{_safe(base)}", f"{i}-{base}", pool, names))
    missing = sorted(set(defenses or ()) - seen)
    if missing:
        raise ValueError(f"--defenses {missing} are in none of the zoo directories (they hold: {sorted(seen)})")
    return out


def _random_starts(key, ids, x, radius: float, norm: str):
    """``[b, *S]`` random points of the ``norm`` ball of ``radius`` around each ``x`` (in the box),
    seeded per sample id; one compiled function (eager vmapping compiled every primitive)."""
    return _random_starts_jit()(key, ids, x, radius, norm)


@cache
def _random_starts_jit():
    import jax

    from sarjax.attacks import geometry
    from sarjax.attacks.threat import canonical_norm

    @partial(jax.jit, static_argnums=(4,))
    def f(key, ids, x, radius, norm):
        p = canonical_norm(norm)
        return jax.vmap(lambda i, xi: geometry.random_in_ball(jax.random.fold_in(key, i), xi, radius, p))(ids, x)

    return f


def run_entry(fns: dict, pool, entry: EntrySpec, x, y, correct, targets, *, norm, cap, init_eps, key, batch):
    """Run one entry on every member of ``pool``: ``(norm [B, M], trajectory [B, M, cap // 10],
    queries [B, M])`` as numpy, misclassified (sample, member) pairs at distance 0."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    tg = entry.kind == "targeted"
    apply, params, stacked, arch_key = _apply_of(pool)
    k = (entry.attack, tg, arch_key)
    if k not in fns:  # one compiled kernel per (attack, targeted, architecture), shared by pools
        fns[k] = _factory(entry.attack, apply, norm, cap, tg, stacked)
    fn = fns[k]
    B = x.shape[0]
    ekey = jax.random.fold_in(key, {"base": 0, "restart": 1000, "targeted": 2000}[entry.kind] + entry.rank)
    outs = []
    for s in range(0, B, batch):
        sl = slice(s, min(B, s + batch))
        ids = np.arange(sl.start, sl.stop, dtype=np.int32)
        mask = correct[sl].astype(np.float32)  # [b, M]: misclassified pairs need no attack
        kw: dict[str, Any] = {"sample_ids": ids}
        ref = y[sl]
        if tg:
            ref = targets[sl, :, entry.rank - 1]
            kw["labels"] = y[sl]
        if entry.kind == "restart":  # the frontier paper: "5 independent initializations sampled from the lp ball"
            kw["x_init"] = _random_starts(ekey, jnp.asarray(ids), jnp.asarray(x[sl]), float(init_eps), norm)
        if not mask.any():
            m = correct.shape[1]
            outs.append(
                (np.zeros((len(ids), m)), np.zeros((len(ids), m, cap // 10)), np.zeros((len(ids), m), np.int64))
            )
            continue
        res = fn(params, x[sl], ref, key=ekey, mask=mask, **kw)
        ok = correct[sl]
        n = np.where(ok, np.asarray(res.norm, np.float64), 0.0)
        t = np.where(ok[..., None], np.asarray(res.trajectory, np.float64), 0.0)
        outs.append((n, t, np.asarray(res.queries, np.int64)))
    return tuple(np.concatenate([o[i] for o in outs]) for i in range(3))


def _open_cache(directory: Path, fp: dict[str, Any], overwrite: bool) -> None:

    has = directory.is_dir() and any(directory.glob("*.npz"))
    if overwrite and directory.is_dir():
        fingerprints.remove_paths(directory, ["*.npz", fingerprints.FINGERPRINT_FILE])
        has = False
    try:
        stored = fingerprints.check_fingerprint(directory, fp, hint=CACHE_HINT, holds_results=has)
    except fingerprints.FingerprintMismatch as e:
        raise ValueError(f"{e.reason}; {CACHE_HINT}") from None
    if stored is None:
        fingerprints.write_fingerprint(directory, fp)


def run_frontier(
    models: list[str],
    norm: str,
    *,
    out: str,
    tiers=(4000, 8000, 12000),
    heldout: float = 13 / 30,
    samples: int = 1000,
    cap: int = 1000,
    restarts: int = 5,
    targeted: int = 9,
    attacks: list[str] | None = None,
    init_eps: float | None = None,
    batch: int = 250,
    data_dir: str | None = None,
    seed: int = 0,
    overwrite: bool = False,
    progress: bool = True,
    autoattack: bool = False,
    eps_ref: float | None = None,
    aa_attacks: list[str] | None = None,
    aa_iter: int = 100,
    aa_square: int = 5000,
    defenses: list[str] | None = None,
    chains: bool = False,
):
    """The whole ``sarjax frontier`` run (see the module doc); returns the
    :class:`~sarjax.frontier.report.FrontierReport`.

    With ``autoattack=True`` AutoAttack (:mod:`sarjax.attacks.autoattack`, standard version or
    the ``aa_attacks`` stages, ``aa_iter`` APGD/FAB iterations, ``aa_square`` Square queries)
    also runs on every pool at an eps grid (the percentiles of the pool's frontier distances
    plus ``eps_ref``, :func:`sarjax.frontier.eps_grid`; one grid per pool directory rather than
    per model, since one AutoAttack call attacks every member at one eps) and is scored as a
    curve per model (the frontier paper Section 5.1, Tables 4 and 6).  ``chains=True`` fits Algorithm 1
    with completed updates (:func:`sarjax.frontier.greedy_allocation`; default: as published)."""
    import jax
    import numpy as np

    from sarjax.attacks.minnorm import top_k_targets
    from sarjax.data.mnist import load_mnist
    from sarjax.frontier import PoolEntry, TrajectoryPool, build_report
    from sarjax.frontier import plots as fplots

    entries = attack_pool(norm, attacks, restarts, targeted)
    if cap < 10 or cap % 10:
        raise ValueError(
            f"--cap must be a positive multiple of 10 (the trajectory records every 10 queries), got {cap}"
        )
    if samples < 1:
        raise ValueError(f"--samples must be >= 1, got {samples}")
    ts = [int(t) for t in tiers]
    if not ts or any(b <= a for a, b in zip(ts, ts[1:])) or ts[0] < 1:
        raise ValueError(f"--tiers must be increasing positive budgets, got {ts}")
    if not 0 <= heldout < 1:
        raise ValueError(f"--heldout must be in [0, 1), got {heldout}")
    eps0 = INIT_EPS[norm] if init_eps is None else float(init_eps)
    if autoattack and norm == "l0":
        raise ValueError("AutoAttack has no l0 version (the frontier paper Table 5: no baseline on l0)")
    if eps_ref is not None and not (eps_ref > 0 and math.isfinite(eps_ref)):
        raise ValueError(f"--eps-ref must be a finite number > 0, got {eps_ref}")
    data = load_mnist(data_dir)
    if samples > len(data.x_test):
        raise ValueError(f"--samples must be at most {len(data.x_test)} (the test images in {data.source})")
    x = np.asarray(data.x_test[:samples], np.float32)
    y = np.asarray(data.y_test[:samples], np.int32)
    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    key = jax.random.key(seed)
    names, groups, trajs, timings, ran = [], [], [], {}, []
    loaded = load_models(models, defenses)
    for mdl in loaded:
        pool = mdl.pool
        if tuple(pool.input_shape) != x.shape[1:]:
            raise ValueError(
                f"{mdl.label}: the pool takes inputs of shape {pool.input_shape}, the data has {x.shape[1:]}"
            )
        if targeted > pool.num_classes - 1:
            raise ValueError(f"--targeted {targeted} exceeds the {pool.num_classes - 1} wrong classes of {mdl.label}")
    pools = [mdl.pool for mdl in loaded]
    total = len(pools) * len(entries)
    fns: dict = {}
    with progress_bar(progress) as bar:
        task = bar.add_task(f"frontier {norm}", total=total)
        for mdl in loaded:
            pool, tag = mdl.pool, mdl.tag
            cdir = outp / "cache" / tag
            fp = {
                "kind": "frontier",
                "sarjax_version": fingerprints.sarjax_version(),
                **fingerprints.pool_fingerprint(pool),
                "data": data.source,
                "samples": samples,
                "images": fingerprints.array_digest(x, y),
                "norm": norm,
                "cap": cap,
                "init_eps": eps0,
                "seed": seed,
            }
            _open_cache(cdir, fp, overwrite)
            logits = np.asarray(pool.logits(x))  # [M, B, C]
            correct = (logits.argmax(-1) == y[None]).T  # [B, M]
            tk = np.stack([np.asarray(top_k_targets(lg, y, max(targeted, 1))) for lg in logits], axis=1)  # [B, M, k]
            per_entry = []
            for e in entries:
                f = cdir / f"{_safe(e.name)}.npz"
                spec = json.dumps(e.as_dict(), sort_keys=True)
                if f.is_file():
                    z = np.load(f)
                    if str(z["entry"]) != spec:
                        raise ValueError(f"{f} holds another entry ({z['entry']}); {CACHE_HINT}")
                    traj = z["trajectory"]
                    timings[f"{tag}:{e.name}"] = float(z["seconds"])  # as measured when it ran
                else:
                    bar.update(task, description=f"{mdl.label}: {e.name}")
                    t0 = time.time()
                    n, traj, q = run_entry(
                        fns, pool, e, x, y, correct, tk, norm=norm, cap=cap, init_eps=eps0, key=key, batch=batch
                    )
                    dt = time.time() - t0
                    tmp = f.with_suffix(".tmp.npz")
                    np.savez(tmp, norm=n, trajectory=traj, queries=q, entry=np.array(spec), seconds=np.array(dt))
                    tmp.replace(f)
                    timings[f"{tag}:{e.name}"] = dt
                    ran.append(f"{tag}:{e.name}")
                    release_compiled_near_map_limit(log=bar.console.print if progress else None)
                per_entry.append(traj)  # [B, M, L]
                bar.advance(task)
            arr = np.stack(per_entry)  # [A, B, M, L]
            trajs.append(np.transpose(arr, (2, 0, 1, 3)))  # [M, A, B, L]
            names += mdl.member_names
            groups += [mdl.group] * pool.num_members
    pool_entries = tuple(PoolEntry(e.name, e.kind, None if e.kind == "base" else e.attack, e.rank) for e in entries)
    tp = TrajectoryPool(np.concatenate(trajs), pool_entries, cap=cap, every=10, models=tuple(names))
    report = build_report(tp, norm=norm, tiers=ts, heldout=heldout, groups=groups, seed=seed, chains=chains)
    report.extra = {
        "models_dirs": [str(m) for m in models],
        "data": data.source,
        "init_eps": eps0,
        "attack_seconds": timings,  # every entry's run time (read back from the cache for cached entries)
        "ran": ran,  # the entries this invocation ran (the others came from the cache)
        "attack_seconds_by_attack": _by_attack(timings),
    }
    aa_aoi = None
    if autoattack:
        aa_cfg = {"attacks": aa_attacks, "n_iter": aa_iter, "square_queries": aa_square, "eps_ref": eps_ref}
        aa, aa_secs = _run_autoattack(loaded, tp, x, y, norm=norm, key=key, cfg=aa_cfg, out=outp, progress=progress)
        report.extra["autoattack"] = _compare_autoattack(report, tp, aa, eps_ref)
        report.extra["autoattack"]["seconds"] = aa_secs  # per pool directory or zoo defense
        aa_aoi = [report.extra["autoattack"]["models"][n]["aoi"] for n in names]
    report.to_json(outp / "frontier.json")
    last = report.tiers[-1]
    fplots.plot_curves(tp.distances(last.q), names, last.doi, outp / "curves.png", norm=norm[1:])
    fplots.plot_aoi_vs_budget(
        [t.budget for t in report.tiers],
        [t.train_aoi for t in report.tiers],
        [t.heldout_aoi for t in report.tiers],
        outp / "aoi_vs_budget.png",
    )
    fplots.plot_ensemble_vs_fixed_eps(
        names,
        [t.budget for t in report.tiers],
        [t.model_aoi for t in report.tiers],
        outp / "ensemble_per_tier.png",
        fixed_eps_aoi=aa_aoi,
    )
    if report.rank is not None:
        fplots.plot_rank_bump(report.rank.eps, report.rank.ranks, names, outp / "rank_bump.png")
    print(format_tables(report))
    print(f"wrote {outp / 'frontier.json'} and plots to {outp}")
    return report


def _run_autoattack(loaded, tp, x, y, *, norm, key, cfg, out: Path, progress: bool) -> tuple[dict[str, Any], dict]:
    """AutoAttack on every pool at its eps grid, cached per (pool, eps) next to the trajectories.

    Returns ``({model name: (eps [E], accuracy [E], queries [E, B], frontier distances [B])},
    {pool tag: wall seconds of its AutoAttack runs (as measured when they ran; None for caches
    written before the time was recorded)})``."""
    import jax
    import numpy as np

    from sarjax.attacks.autoattack import autoattack_pool
    from sarjax.frontier import eps_grid

    front = tp.frontier()  # [M_total, B]
    res: dict[str, Any] = {}
    secs: dict[str, float | None] = {}
    row = 0
    with progress_bar(progress) as bar:
        task = bar.add_task("autoattack", total=len(loaded))
        for mdl in loaded:
            pool = mdl.pool
            m = pool.num_members
            rows = slice(row, row + m)
            row += m
            grid = eps_grid(front[rows].ravel(), cfg["eps_ref"])
            cdir = out / "cache" / mdl.tag
            spec = json.dumps({**cfg, "eps": grid.tolist()}, sort_keys=True)
            f = cdir / "autoattack.npz"
            if f.is_file():
                z = np.load(f)
                if str(z["config"]) != spec:
                    raise ValueError(f"{f} holds AutoAttack runs with other settings ({z['config']}); {CACHE_HINT}")
                robust, queries = z["robust"], z["queries"]
                secs[mdl.tag] = float(z["seconds"]) if "seconds" in z.files else None
            else:
                rob, qs = [], []
                t0 = time.time()
                for k, e in enumerate(grid):
                    bar.update(task, description=f"autoattack {mdl.label} eps={e:.4g}")
                    kw: dict[str, Any] = {"n_iter": cfg["n_iter"], "fab_iter": cfg["n_iter"]}
                    kw["square_queries"] = cfg["square_queries"]
                    if cfg["attacks"]:
                        kw["attacks"] = cfg["attacks"]
                    r = autoattack_pool(
                        pool, x, y, norm=norm, eps=float(e), key=jax.random.fold_in(key, 7000 + k), log=False, **kw
                    )
                    rob.append(np.asarray(r.robust))
                    qs.append(np.asarray(r.queries))
                    release_compiled_near_map_limit(log=bar.console.print if progress else None)
                robust, queries = np.stack(rob), np.stack(qs)  # [E, B, M]
                secs[mdl.tag] = time.time() - t0
                tmp = f.with_suffix(".tmp.npz")
                np.savez(
                    tmp,
                    robust=robust,
                    queries=queries,
                    eps=grid,
                    config=np.array(spec),
                    seconds=np.array(secs[mdl.tag]),
                )
                tmp.replace(f)
            for j in range(m):
                name = tp.models[rows.start + j]
                res[name] = (grid, robust[:, :, j].mean(axis=1), queries[:, :, j], front[rows.start + j])
            bar.advance(task)
    return res, secs


def _compare_autoattack(report, tp, aa: dict[str, Any], eps_ref: float | None) -> dict[str, Any]:
    """AutoAttack's curve per model (its AOI and cost) beside the ensembles of every tier:
    the frontier paper Table 4 (AOI) and Table 6 (robust accuracy at ``eps_ref``)."""
    import numpy as np

    from sarjax.frontier import StepCurve, fixed_eps_curve

    per: dict[str, Any] = {}
    for name, (grid, acc, queries, front) in aa.items():
        fc = fixed_eps_curve(grid, acc, front, queries=queries, eps_ref=eps_ref)
        per[name] = {
            "eps": grid.tolist(),
            "accuracy": acc.tolist(),
            "aoi": fc.aoi,
            "queries": fc.queries.tolist(),
            "cost_ref": fc.cost_ref,
            "cost_total": fc.cost_total,
        }
    tiers = []
    for t in report.tiers:
        dist = tp.distances(t.q)
        aoi_ge = [t.model_aoi[i] >= per[n]["aoi"] for i, n in enumerate(report.models)]
        row: dict[str, Any] = {"budget": t.budget, "aoi_matches_or_exceeds": int(np.sum(aoi_ge))}
        row["heldout_aoi_matches_or_exceeds"] = int(sum(aoi_ge[i] for i in report.heldout))
        if eps_ref is not None:
            ens = [float(StepCurve.from_distances(dist[i])(eps_ref)) for i in range(len(report.models))]
            aa_ref = [float(per[n]["accuracy"][int(np.argmin(np.abs(np.asarray(per[n]["eps"]) - eps_ref)))])
                      for n in report.models]  # fmt: skip
            row["ensemble_accuracy_at_ref"] = ens
            row["accuracy_matches_or_exceeds"] = int(sum(e <= a for e, a in zip(ens, aa_ref)))
        tiers.append(row)
    return {"eps_ref": eps_ref, "models": per, "tiers": tiers}


def _by_attack(timings: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in timings.items():
        a = k.split(":", 1)[1].split("/", 1)[0]
        out[a] = out.get(a, 0.0) + v
    return out


def format_tables(report) -> str:
    """The AOI / DOI tables of a :class:`~sarjax.frontier.report.FrontierReport` as text."""
    names = report.entry_names
    lines = [
        f"norm {report.norm}: {len(report.models)} models ({len(report.train)} train, "
        f"{len(report.heldout)} held-out), {report.samples} samples, {len(names)} pool entries, cap {report.cap}"
        + ("; Algorithm 1 with completed updates (--chain-updates)" if getattr(report, "chains", False) else "")
    ]
    lines.append(f"{'tier':>6} {'used':>6} {'train AOI':>10} {'held-out AOI':>13}  ensemble")
    for t in report.tiers:
        h = "-" if t.heldout_aoi is None else f"{100 * t.heldout_aoi:.2f}"
        ens = ", ".join(f"{k}:{v}" for k, v in t.ensemble(names).items())
        lines.append(f"{t.budget:>6} {t.used:>6} {100 * t.train_aoi:>10.2f} {h:>13}  {ens}")
    head = " ".join(f"{'AOI@' + str(t.budget):>10}" for t in report.tiers)
    dhead = " ".join(f"{'DOI@' + str(t.budget):>10}" for t in report.tiers)
    w = max(12, max(len(m) for m in report.models))
    lines.append(f"{'model':<{w}} {'split':>8} {'clean':>6} {'eps_min':>8} {head} {dhead}")
    held = set(report.heldout)
    for i, m in enumerate(report.models):
        aois = " ".join(f"{100 * t.model_aoi[i]:>10.2f}" for t in report.tiers)
        dois = " ".join(f"{t.doi[i]:>10.3f}" for t in report.tiers)
        split = "held-out" if i in held else "train"
        lines.append(f"{m:<{w}} {split:>8} {report.clean_accuracy[i]:>6.3f} {report.eps_min[i]:>8.4g} {aois} {dois}")
    aa = report.extra.get("autoattack")
    if aa:
        lines.append(f"AutoAttack as a curve (eps_ref {aa['eps_ref']}):")
        for i, m in enumerate(report.models):
            a = aa["models"][m]
            lines.append(
                f"  {m:<{w}} AA AOI {100 * a['aoi']:6.2f}  queries at eps_ref {a['cost_ref']:.0f}, "
                f"whole grid {a['cost_total']:.0f}; ensemble AOI "
                + " ".join(f"{100 * t.model_aoi[i]:.2f}@{t.budget}" for t in report.tiers)
            )
        for row in aa["tiers"]:
            acc = row.get("accuracy_matches_or_exceeds")
            lines.append(
                f"  tier {row['budget']}: ensemble AOI >= AutoAttack's on {row['aoi_matches_or_exceeds']} of "
                f"{len(report.models)} models ({row['heldout_aoi_matches_or_exceeds']} of {len(report.heldout)} "
                f"held-out)" + ("" if acc is None else f"; robust accuracy at eps_ref <= AutoAttack's on {acc}")
            )
    if len(report.tiers) >= 2:
        tau = report.doi_tau[0][-1]
        lines.append(
            f"DOI ranking, Kendall tau between tiers {report.tiers[0].budget} and {report.tiers[-1].budget}: {tau:.3f}"
        )
    if report.rank is not None:
        r = report.rank
        taus = [v for i, row in enumerate(r.tau) for j, v in enumerate(row) if j > i and not math.isnan(v)]
        lines.append(
            f"single-eps rankings over {len(r.eps)} eps ({r.source}): largest rank change {max(r.shift)}, "
            f"{sum(s >= 2 for s in r.shift)} models move by >= 2 ranks, min Kendall tau between grid points "
            f"{min(taus) if taus else float('nan'):.3f}"
        )
    return "\n".join(lines)
