"""``sarjax frontier``: the attack pool on pools, nested ensembles, AOI / DOI tables, JSON, plots.

the frontier paper end to end. :func:`run_frontier` takes pools in memory and the images as
arrays; :func:`run_frontier_on_dirs` (the command) loads the ``--models`` directories (pools saved
by ``sarjax train-pool``, defense zoos), the ``--model PKG.MODULE:FUNCTION`` builders and the
images (the first ``--samples`` MNIST test images, or ``--images FILE.npz``) and calls it. For each
pool and each entry of the minimum-norm attack pool (the norm's attacks of the frontier paper
Table 2 plus FAB, each with its random restarts and top-k targeted runs as separate entries,
Section 5.1) one vmapped call attacks every member on the images and records the trajectory
(best distance every 10 queries) and the best adversarial point per (sample, member). Results
are cached per (pool, entry) in ``OUT/cache``; a rerun reuses them and a cache written with other
settings is refused (a fingerprint, as ``sarjax sar`` does). Then Algorithm 1 is fitted on the
train models at the nested tiers (``--tiers``), the held-out AOI is reported beside the train
AOI, the DOI of every model at every tier, the rank instability, and ``OUT/frontier.json`` plus
four plots are written (``frontier.json``'s ``extra["compile"]``: the run's XLA compilations,
:meth:`sarjax.runtime.compile_stats.CompileStats.to_json`); :func:`sarjax.experiments.frontier_io.load_points`
reads the adversarial points back. The run's configuration (the attack pool, AutoAttack, the
settings) is :mod:`sarjax.experiments.frontier_config`; its inputs and outputs (the pools, the
cache files, the points, the tables) are :mod:`sarjax.experiments.frontier_io`.

Across processes (JAX's distributed runtime, ``--coordinator``): every process runs every
(pool, entry) on its share of the samples, in whole attack batches
(:func:`sarjax.runtime.distributed.process_blocks`), so every batch is the one a single process
would run and the results are bit-identical to one process. Each process caches its rows in its
own folder ``OUT/cache/<pool>/rows-<a>-<b>/`` (resumable per process); the rows are gathered
after every entry and process 0 writes the merged cache files (the one-process layout), the
report and the plots.
"""

import json
import sys
import time
from collections.abc import Sequence
from functools import cache, partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.data import mnist  # the module: tests replace load_mnist
from sarjax.data.images import check_ids, check_images, load_images
from sarjax.experiments.frontier_config import (
    EntrySpec,
    FrontierAttacks,
    FrontierAutoAttack,
    FrontierSettings,
)
from sarjax.experiments.frontier_io import (
    CACHE_HINT,
    FrontierModel,
    as_models,
    format_tables,
    load_models,
    member_names,
    open_cache,
    read_entry,
    safe_name,
    save_entry,
)
from sarjax.frontier import PoolEntry, StepCurve, TrajectoryPool, build_report, eps_grid, fixed_eps_curve
from sarjax.frontier import plots as fplots
from sarjax.models.builders import load_model
from sarjax.runtime import compile_cache, distributed  # the modules: tests replace their functions
from sarjax.runtime import fingerprint as fingerprints
from sarjax.runtime.compile_stats import count_compiles
from sarjax.runtime.progress import progress_bar
from sarjax.runtime.provenance import provenance


def _factory(attack: str, apply, norm: str, cap: int, targeted: bool, stacked: bool = False):
    """A ``MinNormAttackFn`` (audited) for one attack; targeted runs look for any
    misclassification (``success="untargeted"``, the frontier paper Section 5.1)."""
    # deferred: sarjax --help imports this module (cli/frontier's NORMS); sarjax.attacks adds 0.23 s, measured
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


def _random_starts(key, ids, x, radius: float, norm: str):
    """``[b, *S]`` random points of the ``norm`` ball of ``radius`` around each ``x`` (in the box),
    seeded per sample id; one compiled function (eager vmapping compiled every primitive)."""
    return _random_starts_jit()(key, ids, x, radius, norm)


@cache
def _random_starts_jit():
    # deferred: sarjax --help imports this module (cli/frontier's NORMS); sarjax.attacks adds 0.23 s, measured
    from sarjax.attacks import geometry
    from sarjax.attacks.threat import canonical_norm

    @partial(jax.jit, static_argnums=(4,))
    def f(key, ids, x, radius, norm):
        p = canonical_norm(norm)
        return jax.vmap(lambda i, xi: geometry.random_in_ball(jax.random.fold_in(key, i), xi, radius, p))(ids, x)

    return f


def run_entry(
    pool,
    entry: EntrySpec,
    x,
    y,
    correct,
    targets,
    *,
    attacks: FrontierAttacks,
    settings: FrontierSettings | None = None,
    ids=None,
    fns: dict | None = None,
):
    """Run one entry on every member of ``pool``: ``(norm [B, M], trajectory [B, M, cap // 10],
    queries [B, M])`` as numpy, misclassified (sample, member) pairs at distance 0; with
    ``settings.keep_points`` also the best adversarial points ``x_adv [B, M, *S]`` (float32; the
    clean image where the pair is misclassified clean or no point was found).

    Args:
      pool: the pool (every member attacked).
      entry: the entry to run (one of ``attacks.entries``).
      x: ``[B, *S]`` images; y: ``[B]`` labels.
      correct: ``[B, M]`` bool, the pairs classified correctly (the others are not attacked).
      targets: ``[B, M, k]`` each pair's top-k wrong classes (targeted entries use column
        ``rank - 1``).
      attacks: the attack pool (its ``norm``, ``cap`` and ``init_eps``).
      settings: ``batch`` (samples per call), ``seed`` (the key) and ``keep_points`` (default
        :class:`sarjax.experiments.frontier_config.FrontierSettings`).
      ids: the samples' ids ``[B]`` (they seed the per-sample random streams; default
        ``arange(B)``).
      fns: compiled attacks by (attack, targeted, architecture), shared across calls (default: a
        fresh dict).
    """
    st = FrontierSettings() if settings is None else settings
    fns = {} if fns is None else fns
    norm, cap, init_eps = attacks.norm, attacks.cap, attacks.init_eps
    batch, points, key = st.batch, st.keep_points, jax.random.key(st.seed)
    tg = entry.kind == "targeted"
    apply, params, stacked, arch_key = _apply_of(pool)
    k = (entry.attack, tg, arch_key)
    if k not in fns:  # one compiled kernel per (attack, targeted, architecture), shared by pools
        fns[k] = _factory(entry.attack, apply, norm, cap, tg, stacked)
    fn = fns[k]
    B = x.shape[0]
    sid = np.arange(B) if ids is None else np.asarray(ids)
    ekey = jax.random.fold_in(key, {"base": 0, "restart": 1000, "targeted": 2000}[entry.kind] + entry.rank)
    outs = []
    for s in range(0, B, batch):
        sl = slice(s, min(B, s + batch))
        ids_b = sid[sl].astype(np.int32)
        mask = correct[sl].astype(np.float32)  # [b, M]: misclassified pairs need no attack
        kw: dict[str, Any] = {"sample_ids": ids_b}
        ref = y[sl]
        if tg:
            ref = targets[sl, :, entry.rank - 1]
            kw["labels"] = y[sl]
        if entry.kind == "restart":  # the frontier paper: "5 independent initializations sampled from the lp ball"
            kw["x_init"] = _random_starts(ekey, jnp.asarray(ids_b), jnp.asarray(x[sl]), float(init_eps), norm)
        m = correct.shape[1]
        if not mask.any():
            b = len(ids_b)
            o = (np.zeros((b, m)), np.zeros((b, m, cap // 10)), np.zeros((b, m), np.int64))
            if points:
                o += (np.broadcast_to(np.asarray(x[sl], np.float32)[:, None], (b, m, *x.shape[1:])),)
            outs.append(o)
            continue
        res = fn(params, x[sl], ref, key=ekey, mask=mask, **kw)
        ok = correct[sl]
        n = np.where(ok, np.asarray(res.norm, np.float64), 0.0)
        t = np.where(ok[..., None], np.asarray(res.trajectory, np.float64), 0.0)
        o = (n, t, np.asarray(res.queries, np.int64))
        if points:  # the attacks return x0 for masked (misclassified) pairs and where nothing was found
            o += (np.asarray(res.x_adv, np.float32),)
        outs.append(o)
    return tuple(np.concatenate([o[i] for o in outs]) for i in range(len(outs[0])))


def _check_ids(ids, n: int):
    """``(ids as int64, whether they are the default arange(n))``."""
    if ids is None:
        return np.arange(n, dtype=np.int64), True
    a = check_ids(ids, n, what="ids")
    if n and a.max() > np.iinfo(np.int32).max:
        raise ValueError(f"ids must be below 2**31 (the attacks take int32 sample ids), got {a.max()}")
    return a, bool(np.array_equal(a, np.arange(n)))


def _log(bar, progress: bool, msg: str) -> None:
    if progress:
        bar.console.print(msg)
    else:
        print(msg, file=sys.stderr)


def run_frontier(
    pools,
    x,
    y,
    attacks: FrontierAttacks,
    *,
    out: str,
    ids=None,
    source: str = "arrays",
    meta: dict[str, Any] | None = None,
    autoattack: FrontierAutoAttack | None = None,
    settings: FrontierSettings | None = None,
):
    """The frontier of pools in memory on images given as arrays (see the module doc); returns the
    :class:`~sarjax.frontier.report.FrontierReport` (on every process).

    Args:
      pools: a list of :class:`sarjax.models.Pool`, a dict ``label -> Pool`` or the
        :class:`sarjax.experiments.frontier_io.FrontierModel` items of
        :func:`sarjax.experiments.frontier_io.load_models`
        (:func:`sarjax.experiments.frontier_io.as_models`); every member of every pool is a model.
      x: ``[N, H, W, C]`` images in ``[0, 1]``; y: ``[N]`` labels (checked against every pool
        with :func:`sarjax.data.images.check_images`).
      attacks: the attack pool, its norm and budget
        (:func:`sarjax.experiments.frontier_config.frontier_attacks`; ``frontier_attacks(norm)`` is
        the frontier paper's).
      out: output directory (``frontier.json``, plots, ``cache/``).
      ids: ``[N]`` distinct sample ids seeding each sample's random streams (default
        ``arange(N)``: the first N images of a data set keep their streams in any subset).
      source: where the images come from (recorded in the report, and in a new cache's fingerprint for
        information: the cache is identified by the images' content, so the same arrays from
        another source reuse it).
      meta: entries put first into the report's ``extra`` (the directory form records its
        directories; default ``{"models": [pool labels]}``).
      autoattack: also run AutoAttack (:func:`sarjax.experiments.frontier_config.frontier_autoattack`;
        default None: not).
      settings: tiers, held-out share, batch, seed, cache and report options
        (:class:`sarjax.experiments.frontier_config.FrontierSettings`; default: the frontier
        paper's, ``sarjax frontier``'s defaults).

    With ``autoattack`` AutoAttack (:mod:`sarjax.attacks.autoattack`, standard version or
    its ``attacks`` stages, ``n_iter`` APGD/FAB iterations, ``square_queries`` Square queries)
    also runs on every pool at an eps grid (the percentiles of the pool's frontier distances
    plus ``eps_ref``, :func:`sarjax.frontier.eps_grid`; one grid per pool rather than
    per model, since one AutoAttack call attacks every member at one eps) and is scored as a
    curve per model (the frontier paper Section 5.1, Tables 4 and 6).  ``settings.chains`` fits
    Algorithm 1 with completed updates (:func:`sarjax.frontier.greedy_allocation`; default: as
    published).

    Across processes (after :func:`sarjax.runtime.distributed.initialize`), every process calls
    this with the same arguments; each runs its whole ``batch``-row blocks of the samples and
    only process 0 writes ``frontier.json``, the plots and the merged cache files.

    Raises:
      TypeError: ``attacks``, ``autoattack`` or ``settings`` of another type.
      ValueError: bad images or ids, more targeted runs than a pool has wrong classes,
        AutoAttack on l0 or across processes, a cache written with other settings.
    """
    # deferred: sarjax --help imports this module (cli/frontier's NORMS); sarjax.attacks adds 0.23 s, measured
    from sarjax.attacks.minnorm import top_k_targets

    compiles = count_compiles()  # frontier.json's "compile": this run's XLA programs
    if not isinstance(attacks, FrontierAttacks):
        raise TypeError(f"attacks must be a FrontierAttacks (frontier_attacks(norm)), got {type(attacks).__name__}")
    if autoattack is not None and not isinstance(autoattack, FrontierAutoAttack):
        raise TypeError(f"autoattack must be None or a FrontierAutoAttack, got {type(autoattack).__name__}")
    st = FrontierSettings() if settings is None else settings
    if not isinstance(st, FrontierSettings):
        raise TypeError(f"settings must be None or a FrontierSettings, got {type(st).__name__}")
    norm, entries, cap, eps0, targeted = (
        attacks.norm,
        list(attacks.entries),
        attacks.cap,
        attacks.init_eps,
        attacks.targeted,
    )
    ts, heldout, batch, seed = list(st.tiers), st.heldout, st.batch, st.seed
    overwrite, progress, chains, keep_points = st.overwrite, st.progress, st.chains, st.keep_points
    if autoattack is not None and norm == "l0":
        raise ValueError("AutoAttack has no l0 version (the frontier paper Table 5: no baseline on l0)")
    loaded = as_models(pools)
    for mdl in loaded:
        pool = mdl.pool
        x, y = check_images(
            x, y, input_shape=tuple(pool.input_shape), num_classes=int(pool.num_classes), what=f"images for {mdl.label}"
        )
        if targeted > pool.num_classes - 1:
            raise ValueError(f"--targeted {targeted} exceeds the {pool.num_classes - 1} wrong classes of {mdl.label}")
    N = len(x)
    sample_ids, default_ids = _check_ids(ids, N)
    nproc = distributed.process_count()
    multi = nproc > 1
    if autoattack is not None and multi:
        raise ValueError(
            "--autoattack runs in one process: run the frontier across processes first, then once more in one "
            "process with --autoattack (it reads the merged cache process 0 wrote)"
        )
    main_proc = distributed.is_main()
    rows = np.asarray(distributed.process_blocks(N, batch)) if multi else np.arange(N)
    if multi and len(rows) and not np.array_equal(rows, np.arange(rows[0], rows[-1] + 1)):
        raise ValueError(f"process_blocks gave non-contiguous rows {rows.tolist()}")
    part = f"rows-{rows[0]}-{rows[-1] + 1}" if len(rows) else None
    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    key = jax.random.key(seed)
    digest = fingerprints.array_digest(x, y)
    err = None
    try:  # every fingerprint is checked before anything runs
        for mdl in loaded:
            fp = {
                "kind": "frontier",
                "sarjax_version": fingerprints.sarjax_version(),
                **fingerprints.pool_fingerprint(mdl.pool),
                "data": source,  # for information only (_INFO_FIELDS): the content below is the identity
                "samples": N,
                "images": digest,
                "norm": norm,
                "cap": cap,
                "init_eps": eps0,
                "seed": seed,
            }
            if not default_ids:
                fp["ids"] = fingerprints.array_digest(sample_ids)
            cdir = outp / "cache" / mdl.tag
            if main_proc or not multi:
                open_cache(cdir, fp, overwrite)
            if multi and part is not None:
                open_cache(cdir / part, {**fp, "rows": [int(rows[0]), int(rows[-1]) + 1]}, overwrite)
    except ValueError as e:
        err = e
    if multi and not distributed.all_ok(err is None):
        raise err or ValueError("another process refused its cache folder (see its log); " + CACHE_HINT)
    if err is not None:
        raise err
    names, groups, trajs, timings, ran = [], [], [], {}, []
    total = len(loaded) * len(entries)
    fns: dict = {}
    L = cap // 10
    with progress_bar(progress) as bar:
        task = bar.add_task(
            f"frontier {norm}" + (f" (process {distributed.process_index()} of {nproc})" if multi else ""), total=total
        )
        for mdl in loaded:
            pool, tag = mdl.pool, mdl.tag
            cdir = outp / "cache" / tag
            pdir = cdir / part if multi and part is not None else cdir
            M = pool.num_members
            logits = np.asarray(pool.logits(x))  # [M, B, C]
            correct = (logits.argmax(-1) == y[None]).T  # [B, M]
            tk = [np.asarray(top_k_targets(lg, y, max(targeted, 1))) for lg in logits]  # pyright: ignore[reportArgumentType]
            tk = np.stack(tk, axis=1)  # [B, M, k]
            xr, yr, cr, tkr, idr = x[rows], y[rows], correct[rows], tk[rows], sample_ids[rows]
            per_entry = []
            for e in entries:
                f = pdir / f"{safe_name(e.name)}.npz"
                spec = json.dumps(e.as_dict(), sort_keys=True)
                got, why = read_entry(f, spec, e.name, keep_points, arrays=multi) if len(rows) else (None, None)
                if why:
                    _log(bar, progress, why)
                ran_here = False
                if got is not None:
                    dt = got.pop("seconds")  # as measured when it ran
                elif len(rows):
                    bar.update(task, description=f"{mdl.label}: {e.name}")
                    t0 = time.time()
                    res = run_entry(pool, e, xr, yr, cr, tkr, attacks=attacks, settings=st, ids=idr, fns=fns)
                    dt = time.time() - t0
                    got = dict(zip(("norm", "trajectory", "queries", "x_adv"), res))
                    save_entry(f, spec, dt, got)
                    ran_here = True
                    compile_cache.release_compiled_near_map_limit(log=bar.console.print if progress else None)
                else:  # a process without rows
                    dt = 0.0
                    got = {
                        "norm": np.zeros((0, M)),
                        "trajectory": np.zeros((0, M, L)),
                        "queries": np.zeros((0, M), np.int64),
                    }
                    if keep_points:
                        got["x_adv"] = np.zeros((0, M, *x.shape[1:]), np.float32)
                if multi:
                    arrays = {k: got[k] for k in ("norm", "trajectory", "queries", "x_adv") if k in got}
                    got = distributed.allgather_rows(arrays)
                    s = distributed.allgather_rows({"seconds": np.array([dt]), "ran": np.array([ran_here])})
                    dt, ran_here = float(s["seconds"].sum()), bool(s["ran"].any())  # the work of all processes
                    merged = cdir / f"{safe_name(e.name)}.npz"
                    if main_proc and (ran_here or read_entry(merged, spec, e.name, keep_points, False)[0] is None):
                        save_entry(merged, spec, dt, got)
                timings[f"{tag}:{e.name}"] = dt
                if ran_here:
                    ran.append(f"{tag}:{e.name}")
                per_entry.append(got["trajectory"])  # [B, M, L]
                bar.advance(task)
            arr = np.stack(per_entry)  # [A, B, M, L]
            trajs.append(np.transpose(arr, (2, 0, 1, 3)))  # [M, A, B, L]
            names += mdl.member_names
            groups += [mdl.group] * pool.num_members
    pool_entries = tuple(PoolEntry(e.name, e.kind, None if e.kind == "base" else e.attack, e.rank) for e in entries)
    tp = TrajectoryPool(np.concatenate(trajs), pool_entries, cap=cap, every=10, models=tuple(names))
    report = build_report(tp, norm=norm, tiers=ts, heldout=heldout, groups=groups, seed=seed, chains=chains)
    report.extra = {
        **(meta if meta is not None else {"models": [m.label for m in loaded]}),
        "data": source,
        "init_eps": eps0,
        "attack_seconds": timings,  # every entry's run time (read back from the cache for cached entries)
        "ran": ran,  # the entries this invocation ran (the others came from the cache)
        "attack_seconds_by_attack": _by_attack(timings),
        "pools": {m.label: {"cache": m.tag, "members": list(m.member_names)} for m in loaded},  # load_points
        "points": bool(keep_points),
        "processes": nproc,
    }
    aa_aoi = None
    if autoattack is not None:
        aa_cfg = autoattack.config()
        aa, aa_secs = _run_autoattack(loaded, tp, x, y, norm=norm, key=key, cfg=aa_cfg, out=outp, progress=progress)
        report.extra["autoattack"] = _compare_autoattack(report, tp, aa, autoattack.eps_ref)
        report.extra["autoattack"]["seconds"] = aa_secs  # per pool directory or zoo defense
        aa_aoi = [report.extra["autoattack"]["models"][n]["aoi"] for n in names]
    if not main_proc:
        return report
    report.extra["compile"] = compiles.stop().to_json()  # process 0's (CompileStats.to_json)
    report.extra["provenance"] = provenance()  # command, commit, machine, date, load
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


def run_frontier_on_dirs(
    models: Sequence[str],
    attacks: FrontierAttacks,
    *,
    out: str,
    model_specs: Sequence[str] | None = None,
    images: str | None = None,
    samples: int | None = None,
    data_dir: str | None = None,
    defenses: list[str] | None = None,
    autoattack: FrontierAutoAttack | None = None,
    settings: FrontierSettings | None = None,
):
    """The whole ``sarjax frontier`` run: loads the pools and the images and calls :func:`run_frontier`.

    Args:
      models: ``--models`` directories (pools saved by ``sarjax train-pool``, defense zoos;
        :func:`sarjax.experiments.frontier_io.load_models`).
      model_specs: ``--model PKG.MODULE:FUNCTION`` builders, each a function returning a
        :class:`sarjax.models.Pool` (:func:`sarjax.models.builders.load_model`); pool label and
        member prefix: the spec.
      images: ``--images FILE.npz`` (``x`` [N, H, W, C] in [0, 1], ``y`` [N], optional ``ids``;
        :func:`sarjax.data.images.load_images`) instead of MNIST.
      samples: the first ``samples`` images (default: 1000 MNIST test images; every image of
        ``images``).
      data_dir: MNIST IDX directory (default: the embedded split).
      defenses: only these defenses of the zoo directories.
      attacks, autoattack, settings: as :func:`run_frontier`.
    """
    if not isinstance(attacks, FrontierAttacks):
        raise TypeError(f"attacks must be a FrontierAttacks (frontier_attacks(norm)), got {type(attacks).__name__}")
    specs = list(model_specs or ())
    if not models and not specs:
        raise ValueError("no models: give --models DIR ... and / or --model PKG.MODULE:FUNCTION")
    if images is not None and data_dir is not None:
        raise ValueError(f"--images {images} and --data-dir {data_dir} both name the images: give one")
    if samples is not None and samples < 1:
        raise ValueError(f"--samples must be >= 1, got {samples}")
    if images is not None:
        data = load_images(images)
        n = len(data.x) if samples is None else samples
        if n > len(data.x):
            raise ValueError(f"--samples {n} is more than the {len(data.x)} images in {images}")
        x, y, ids, source = data.x[:n], data.y[:n], data.ids[:n], data.source
    else:
        split = mnist.load_mnist(data_dir)
        n = 1000 if samples is None else samples
        if n > len(split.x_test):
            raise ValueError(f"--samples must be at most {len(split.x_test)} (the test images in {split.source})")
        x, y, ids = np.asarray(split.x_test[:n], np.float32), np.asarray(split.y_test[:n], np.int32), None
        source = split.source
    loaded = load_models(list(models), defenses)
    if specs:
        for j, spec in enumerate(specs):
            pool = load_model(spec)
            i = len(models) + j
            names = [f"{spec}/{m}" for m in member_names(pool)]
            loaded.append(FrontierModel(spec, f"{i}-{safe_name(spec)}", f"{i}-{spec}", pool, names))
    meta: dict[str, Any] = {"models_dirs": [str(m) for m in models]}
    if specs:
        meta["model_specs"] = specs
    return run_frontier(
        loaded, x, y, attacks, out=out, ids=ids, source=source, meta=meta, autoattack=autoattack, settings=settings
    )


def _run_autoattack(loaded, tp, x, y, *, norm, key, cfg, out: Path, progress: bool) -> tuple[dict[str, Any], dict]:
    """AutoAttack on every pool at its eps grid, cached per (pool, eps) next to the trajectories.

    Returns ``({model name: (eps [E], accuracy [E], queries [E, B], frontier distances [B])},
    {pool tag: wall seconds of its AutoAttack runs (as measured when they ran; None for caches
    written before the time was recorded)})``."""
    # deferred: sarjax --help imports this module (cli/frontier's NORMS); sarjax.attacks adds 0.23 s, measured
    from sarjax.attacks.autoattack import AutoAttackSettings, autoattack_config, autoattack_pool

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
                    attack = autoattack_config(
                        norm,
                        float(e),
                        attacks=cfg["attacks"] or None,
                        n_iter=cfg["n_iter"],
                        fab_iter=cfg["n_iter"],
                        square_queries=cfg["square_queries"],
                    )
                    r = autoattack_pool(
                        pool,
                        x,
                        y,
                        attack=attack,
                        key=jax.random.fold_in(key, 7000 + k),
                        settings=AutoAttackSettings(log=False),
                    )
                    rob.append(np.asarray(r.robust))
                    qs.append(np.asarray(r.queries))
                    compile_cache.release_compiled_near_map_limit(log=bar.console.print if progress else None)
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
