"""The inputs and outputs of a frontier run (:func:`sarjax.experiments.frontier.run_frontier`).

The pools (:func:`as_models` for pools in memory, :func:`load_models` for ``--models``
directories and defense zoos), the per-(pool, entry) cache files under ``OUT/cache`` with their
fingerprints (:func:`open_cache`, :func:`read_entry`, :func:`save_entry`), the adversarial points
read back from a finished run (:func:`load_points`) and the printed AOI / DOI tables
(:func:`format_tables`).
"""

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from sarjax.models.pool import Pool
from sarjax.runtime import fingerprint as fingerprints

CACHE_HINT = "pass --overwrite to discard the cached runs or choose another --out"


def safe_name(name: str) -> str:
    """``name`` as a file or folder name: every run of characters outside ``[A-Za-z0-9_.-]`` becomes ``_``
    (the cache's ``<entry>.npz`` files and ``<i>-<label>`` folders)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


@dataclass
class FrontierModel:
    """One pool of a frontier run: a saved pool, a pool in memory, or one defense of a defense zoo."""

    label: str  # display prefix of its members' names
    tag: str  # cache folder name under OUT/cache
    group: str  # split stratum (the --models directory)
    pool: Any
    member_names: list[str]


def member_names(pool) -> list[str]:
    """The member names of ``pool`` (its stacks' ``names``), or ``m0, m1, ...`` when they are missing
    or do not count ``pool.num_members``."""
    names = [n for s in pool.stacks for n in s.names] if hasattr(pool, "stacks") else []
    if len(names) != pool.num_members:
        names = [f"m{j}" for j in range(pool.num_members)]
    return names


def _is_pool(p) -> bool:
    return all(hasattr(p, a) for a in ("apply", "params", "num_members", "input_shape", "num_classes", "logits"))


def as_models(pools) -> list[FrontierModel]:
    """The pools of :func:`sarjax.experiments.frontier.run_frontier` as :class:`FrontierModel` items.

    ``pools``: a list of :class:`sarjax.models.Pool` (labels ``pool0``, ``pool1``, ...), a dict
    ``label -> Pool``, or a list of :class:`FrontierModel` (what :func:`load_models` returns).
    Member ``n`` of the pool labelled ``L`` is the model ``L/n``; pool ``i``'s cache folder is
    ``OUT/cache/<i>-<L>``.
    """
    if isinstance(pools, Mapping):
        items = [(str(k), v) for k, v in pools.items()]
    elif isinstance(pools, (list, tuple)):
        items = [(None, v) for v in pools]
    else:
        raise TypeError(f"pools must be a list of Pool or a dict label -> Pool, got {type(pools).__name__}")
    if not items:
        raise ValueError("pools is empty: give at least one pool")
    out = []
    for i, (label, p) in enumerate(items):
        if isinstance(p, FrontierModel):
            out.append(p)
            continue
        if not _is_pool(p):
            raise TypeError(
                f"pool {label or i}: expected a sarjax.models.Pool (apply, params, num_members, input_shape, "
                f"num_classes, logits), got {type(p).__name__}"
            )
        label = f"pool{i}" if label is None else label
        names = [f"{label}/{n}" for n in member_names(p)]
        out.append(FrontierModel(label, f"{i}-{safe_name(label)}", f"{i}-{label}", p, names))
    return out


ZOO_INPUT_SHAPE = (28, 28, 1)  # a defense zoo's models take MNIST images (sarjax.defenses.zoo_io.ZooModel.apply)


def zoo_member_pool(zm: Any) -> Pool:
    """The one-member :class:`~sarjax.models.pool.Pool` of a defense zoo's model (the frontier's view of it).

    Args:
      zm: a :class:`sarjax.defenses.zoo_io.ZooModel`: its ``pool`` (what :func:`sarjax.defenses.zoo_io.load_zoo`
        gives: the deterministic model), or, for a model without one, its plain ``apply(params,
        x [B, 28, 28, 1]) -> [B, C]`` and ``params`` (one model's) as a
        :class:`~sarjax.models.stack.FunctionStack` named ``zm.name`` (:meth:`Pool.from_functions`).

    Raises:
      TypeError: ``zm.pool`` is neither None nor a Pool; an apply that does not return float32 ``[B, C]``.
    """
    if zm.pool is not None:
        if not isinstance(zm.pool, Pool):
            raise TypeError(
                f"defense {zm.name}: pool must be a sarjax.models.Pool or None, got {type(zm.pool).__name__}"
            )
        return zm.pool
    return Pool.from_functions([(zm.apply, zm.params)], [zm.name], input_shape=ZOO_INPUT_SHAPE)


def load_models(models: list[str], defenses: list[str] | None = None) -> list[FrontierModel]:
    """``--models`` directories as pools: a pool saved by ``sarjax train-pool`` (every member a
    model), or a defense zoo written by ``sarjax train-defenses`` (a directory with
    ``zoo.json``: every trained defense a one-member model; the randomized ones are attacked
    deterministically: the noise defense without its inference noise, the self-ensemble through
    its plain views, :func:`sarjax.defenses.zoo_io.load_zoo`).  ``defenses``: only these defenses
    of the zoo directories (all by default; pool directories are always taken whole)."""
    # deferred: sarjax --help imports this module (cli/frontier's NORMS); orbax adds 0.34 s, measured
    from sarjax.models.checkpoint import load_pool

    out: list[FrontierModel] = []
    seen: set[str] = set()
    for i, d in enumerate(models):
        base = Path(d).name
        if (Path(d) / "zoo.json").is_file():
            from sarjax.defenses.zoo_io import load_zoo  # deferred: as load_pool above (orbax, optax)

            for name, zm in load_zoo(d).items():
                seen.add(name)
                if defenses is not None and name not in defenses:
                    continue
                pool = zoo_member_pool(zm)
                out.append(FrontierModel(name, f"zoo-{safe_name(base)}-{safe_name(name)}", f"{i}-{base}", pool, [name]))
            continue
        pool, _ = load_pool(d)
        names = [f"{base}/{n}" for n in member_names(pool)]
        out.append(FrontierModel(base, f"{i}-{safe_name(base)}", f"{i}-{base}", pool, names))
    missing = sorted(set(defenses or ()) - seen)
    if missing:
        raise ValueError(f"--defenses {missing} are in none of the zoo directories (they hold: {sorted(seen)})")
    return out


# Fingerprint fields recorded for information only, never compared: ``data`` names where the images
# of the run that wrote the cache came from (a file's path, "arrays", the MNIST split). The cache's
# identity is the images' content (``images``: x and y, ``ids``), so the same arrays from another path,
# or from Python, share it; caches written while ``data`` was compared (it always was there) still read.
_INFO_FIELDS = ("data",)


def open_cache(directory: Path, fp: dict[str, Any], overwrite: bool) -> None:
    """Check ``directory``'s fingerprint against ``fp`` (all fields but :data:`_INFO_FIELDS`), or write it."""
    has = directory.is_dir() and any(directory.glob("*.npz"))
    if overwrite and directory.is_dir():
        fingerprints.remove_paths(directory, ["*.npz", fingerprints.FINGERPRINT_FILE])
        has = False
    try:
        stored = fingerprints.check_fingerprint(directory, fp, hint=CACHE_HINT, holds_results=has, allow=_INFO_FIELDS)
    except fingerprints.FingerprintMismatch as e:
        raise ValueError(f"{e.reason}; {CACHE_HINT}") from None
    if stored is None:
        fingerprints.write_fingerprint(directory, fp)


def read_entry(f: Path, spec: str, name: str, points: bool, arrays: bool):
    """A cached entry: ``(dict of its arrays and seconds, None)``, ``(None, reason)`` when it must run
    again, ``(None, None)`` when there is none. ``arrays``: read norm / queries / points too."""
    if not f.is_file():
        return None, None
    with np.load(f) as z:
        if str(z["entry"]) != spec:
            raise ValueError(f"{f} holds another entry ({z['entry']}); {CACHE_HINT}")
        if points and "x_adv" not in z.files:
            return None, f"{f} holds no adversarial points (written before the cache kept them): running {name} again"
        keys = ["trajectory"] + (["norm", "queries"] + (["x_adv"] if points else []) if arrays else [])
        got = {k: z[k] for k in keys}
        got["seconds"] = float(z["seconds"])
    return got, None


def save_entry(f: Path, spec: str, seconds: float, arrays: dict) -> None:
    """Write an entry's cache file ``f`` (``arrays``, the entry's ``spec`` and its run time in
    ``seconds``) through a temporary file, so an interrupted write never leaves a partial ``f``."""
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **arrays, entry=np.array(spec), seconds=np.array(seconds))  # pyright: ignore[reportArgumentType]
    tmp.replace(f)


class FrontierPoints(NamedTuple):
    """The adversarial points of one (pool, entry) of a frontier run (:func:`load_points`).

    Attributes:
      members: the models (member names as in ``frontier.json``), ``M`` of them.
      x_adv: ``[B, M, *S]`` float32: member m's best adversarial point for sample b found by the
        entry; the clean image where the pair was misclassified clean (``norm`` 0) or the entry
        found nothing (``norm`` inf).
      norm: ``[B, M]`` the lp distance of ``x_adv`` to the clean image (as the attack measured it in
        float32), 0 on misclassified pairs, inf where nothing was found.
      queries: ``[B, M]`` queries the entry spent.
    """

    members: tuple[str, ...]
    x_adv: Any
    norm: Any
    queries: Any


def load_points(out: str | Path, model: str, entry: str) -> FrontierPoints:
    """The adversarial points an entry found on a pool (or one member) of a finished frontier run.

    Args:
      out: the run's ``--out`` directory (reads ``frontier.json`` and ``cache/``).
      model: a pool label (a ``--models`` directory's name, a ``--model`` spec, a key of the
        ``pools`` dict) for all its members, or one member's name (e.g. ``"p0/m1"``).
      entry: a pool entry's name (``"fmn"``, ``"fmn/r1"``, ``"fmn/t3"``: ``frontier.json``'s
        ``entry_names``).

    Raises:
      ValueError: no such run, pool, member or entry, or the run kept no points (``--no-points``).
    """
    outp = Path(out)
    fj = outp / "frontier.json"
    if not fj.is_file():
        raise ValueError(f"{fj} does not exist: load_points reads a finished sarjax frontier run")
    rep = json.loads(fj.read_text())
    pools = rep.get("extra", {}).get("pools")
    if not pools:
        raise ValueError(f"{fj} lists no cache folders (written by an older sarjax): run sarjax frontier again")
    cols: slice | list[int] = slice(None)
    if model in pools:
        info = pools[model]
        members = tuple(info["members"])
    else:
        hit = [(lab, p) for lab, p in pools.items() if model in p["members"]]
        if not hit:
            raise ValueError(f"{model!r} is neither a pool ({', '.join(pools)}) nor a member of one in {fj}")
        info = hit[0][1]
        cols = [info["members"].index(model)]
        members = (model,)
    entry_names = [e["name"] for e in rep["entries"]]
    if entry not in entry_names:
        raise ValueError(f"{entry!r} is not an entry of {fj} (entries: {', '.join(entry_names)})")
    f = outp / "cache" / info["cache"] / f"{safe_name(entry)}.npz"
    if not f.is_file():
        raise ValueError(f"{f} does not exist (the cache of {model!r}, entry {entry!r})")
    with np.load(f) as z:
        if "x_adv" not in z.files:
            raise ValueError(f"{f} holds no adversarial points (run with --no-points / keep_points=False)")
        return FrontierPoints(members, z["x_adv"][:, cols], z["norm"][:, cols], z["queries"][:, cols])


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
