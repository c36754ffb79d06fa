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
:meth:`sarjax.runtime.compile_stats.CompileStats.to_json`); :func:`load_points` reads the adversarial points back.

Across processes (JAX's distributed runtime, ``--coordinator``): every process runs every
(pool, entry) on its share of the samples, in whole attack batches
(:func:`sarjax.runtime.distributed.process_blocks`), so every batch is the one a single process
would run and the results are bit-identical to one process. Each process caches its rows in its
own folder ``OUT/cache/<pool>/rows-<a>-<b>/`` (resumable per process); the rows are gathered
after every entry and process 0 writes the merged cache files (the one-process layout), the
report and the plots.
"""

import json
import math
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.data import mnist  # the module: tests replace load_mnist
from sarjax.data.images import check_ids, check_images, load_images
from sarjax.frontier import PoolEntry, StepCurve, TrajectoryPool, build_report, eps_grid, fixed_eps_curve
from sarjax.frontier import plots as fplots
from sarjax.models.builders import load_model
from sarjax.runtime import compile_cache, distributed  # the modules: tests replace their functions
from sarjax.runtime import fingerprint as fingerprints
from sarjax.runtime.compile_stats import count_compiles
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


def _is_int(v: object) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, np.integer))


@dataclass(frozen=True)
class FrontierAttacks:
    """The minimum-norm attack pool of a frontier run (build it with :func:`frontier_attacks`).

    Attributes:
      norm: ``"l0" | "l1" | "l2" | "linf"``: the threat model.
      entries: the pool's entries (:func:`attack_pool`), each one cached run per pool.
      cap: every entry's budget in queries, a positive multiple of 10 (the trajectory records
        the best distance every 10 queries). Recorded in the cache fingerprint.
      init_eps: radius of the restarts' random starts, a finite float > 0. Recorded in the cache
        fingerprint.

    Raises:
      ValueError: an unknown norm, no entries or an entry whose attack does not support the norm,
        ``cap`` not a positive multiple of 10, ``init_eps`` not a finite number > 0.
      TypeError: an entry that is not an :class:`EntrySpec`.
    """

    norm: str
    entries: tuple[EntrySpec, ...]
    cap: int = 1000
    init_eps: float = 1.0

    def __post_init__(self) -> None:
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        if not isinstance(self.entries, tuple) or not self.entries:
            raise ValueError(f"entries must be a non-empty tuple of EntrySpec, got {self.entries!r}")
        for e in self.entries:
            if not isinstance(e, EntrySpec):
                raise TypeError(f"entries must be EntrySpec items (attack_pool), got {type(e).__name__}")
            if self.norm not in ATTACK_NORMS.get(e.attack, ()):
                raise ValueError(f"entry {e.name}: attack {e.attack!r} does not support {self.norm}")
        if not _is_int(self.cap) or self.cap < 10 or self.cap % 10:
            raise ValueError(
                f"--cap must be a positive multiple of 10 (the trajectory records every 10 queries), got {self.cap}"
            )
        if isinstance(self.init_eps, bool) or not isinstance(self.init_eps, (int, float, np.floating, np.integer)):
            raise TypeError(f"init_eps must be a number, got {type(self.init_eps).__name__}")
        if not (self.init_eps > 0 and math.isfinite(self.init_eps)):
            raise ValueError(f"--init-eps must be a finite number > 0, got {self.init_eps}")

    @property
    def targeted(self) -> int:
        """The most likely wrong classes the targeted entries use (0 without targeted entries)."""
        return max((e.rank for e in self.entries if e.kind == "targeted"), default=0)


def frontier_attacks(
    norm: str,
    *,
    attacks: Sequence[str] | None = None,
    restarts: int = 5,
    targeted: int = 9,
    cap: int = 1000,
    init_eps: float | None = None,
) -> FrontierAttacks:
    """The attack pool of a frontier run; ``frontier_attacks(norm)`` is the frontier paper's (Section 5.1).

    Args:
      norm: ``"l0" | "l1" | "l2" | "linf"``.
      attacks: a subset of the norm's attacks (default: all of :data:`ATTACK_NORMS` for it).
      restarts: random restarts per attack that supports them (the frontier paper: 5).
      targeted: targeted runs per attack, at the top-k most likely wrong classes (the frontier
        paper: 9; at most ``C - 1``, checked against each pool by :func:`run_frontier`).
      cap: every entry's budget in queries (the frontier paper: 1000), a positive multiple of 10.
      init_eps: radius of the restarts' random starts (default :data:`INIT_EPS` of the norm).

    Raises:
      ValueError: as :func:`attack_pool` and :class:`FrontierAttacks`.
    """
    entries = attack_pool(norm, list(attacks) if attacks else None, restarts, targeted)
    eps0 = INIT_EPS[norm] if init_eps is None else float(init_eps)
    return FrontierAttacks(norm, tuple(entries), cap=cap, init_eps=eps0)


@dataclass(frozen=True)
class FrontierAutoAttack:
    """AutoAttack scored as a curve beside the ensembles (build it with :func:`frontier_autoattack`).

    Attributes:
      attacks: AutoAttack's stages (e.g. ``("apgd-ce", "apgd-t")``; None: the standard version).
      n_iter: APGD / FAB iterations (AutoAttack: 100), an int >= 1.
      square_queries: Square queries (AutoAttack: 5000), an int >= 1.
      eps_ref: the reference eps added to the grid (None: none), a finite number > 0.

    The four fields are the AutoAttack cache's config (``cache/<pool>/autoattack.npz``): a cache
    written with others is refused.

    Raises:
      ValueError: ``n_iter`` / ``square_queries`` not an int >= 1, ``eps_ref`` not None or a
        finite number > 0, an empty stage name.
    """

    attacks: tuple[str, ...] | None = None
    n_iter: int = 100
    square_queries: int = 5000
    eps_ref: float | None = None

    def __post_init__(self) -> None:
        if self.attacks is not None and (
            not isinstance(self.attacks, tuple) or not all(isinstance(a, str) and a for a in self.attacks)
        ):
            raise ValueError(f"attacks must be None or a tuple of stage names, got {self.attacks!r}")
        for name in ("n_iter", "square_queries"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise ValueError(f"FrontierAutoAttack.{name} must be an int >= 1, got {v!r}")
        e = self.eps_ref
        if e is not None and (
            isinstance(e, bool) or not isinstance(e, (int, float, np.floating)) or not (e > 0 and math.isfinite(e))
        ):
            raise ValueError(f"--eps-ref must be a finite number > 0, got {e}")

    def config(self) -> dict[str, Any]:
        """The cache's config: ``attacks`` (a list or None), ``n_iter``, ``square_queries``, ``eps_ref``."""
        return {
            "attacks": list(self.attacks) if self.attacks else None,
            "n_iter": self.n_iter,
            "square_queries": self.square_queries,
            "eps_ref": self.eps_ref,
        }


def frontier_autoattack(
    *,
    attacks: Sequence[str] | None = None,
    n_iter: int = 100,
    square_queries: int = 5000,
    eps_ref: float | None = None,
) -> FrontierAutoAttack:
    """AutoAttack for :func:`run_frontier` (``--autoattack``): the standard version, or the ``attacks``
    stages, with ``n_iter`` APGD / FAB iterations and ``square_queries`` Square queries, on each
    pool's eps grid plus ``eps_ref`` (see :class:`FrontierAutoAttack`)."""
    return FrontierAutoAttack(
        tuple(attacks) if attacks else None,
        n_iter=n_iter,
        square_queries=square_queries,
        eps_ref=eps_ref,
    )


@dataclass(frozen=True)
class FrontierSettings:
    """How :func:`run_frontier` runs and reports (not what it attacks with: :class:`FrontierAttacks`).

    Attributes:
      tiers: the nested budget tiers Q, increasing positive ints (the frontier paper: 4k, 8k, 12k).
      heldout: the held-out share of the models, in ``[0, 1)`` (the frontier paper: 13 of 30).
      batch: samples per attack call, an int >= 1 (across processes: the rows' block size).
      seed: the run's key (``jax.random.key(seed)``); recorded in the cache fingerprint.
      overwrite: discard the cached runs of the pools (default False: reuse them).
      progress: show a progress bar (default True).
      chains: fit Algorithm 1 with completed updates (:func:`sarjax.frontier.greedy_allocation`;
        default False: as published).
      keep_points: store each entry's best adversarial points ``x_adv [N, M, *S]`` in its cache
        file (:func:`load_points`); False for huge runs. A cache file without points is run again
        when points are wanted.

    Raises:
      ValueError: ``tiers`` not increasing positive ints, ``heldout`` outside ``[0, 1)``, ``batch``
        or ``seed`` not an int (``batch >= 1``).
      TypeError: a flag that is not a bool.
    """

    tiers: tuple[int, ...] = (4000, 8000, 12000)
    heldout: float = 13 / 30
    batch: int = 250
    seed: int = 0
    overwrite: bool = False
    progress: bool = True
    chains: bool = False
    keep_points: bool = True

    def __post_init__(self) -> None:
        ts = tuple(self.tiers) if isinstance(self.tiers, (tuple, list)) else None
        if (
            ts is None
            or not ts
            or not all(_is_int(t) for t in ts)
            or ts[0] < 1
            or any(b <= a for a, b in zip(ts, ts[1:]))
        ):
            raise ValueError(f"--tiers must be increasing positive budgets, got {self.tiers!r}")
        object.__setattr__(self, "tiers", tuple(int(t) for t in ts))
        if isinstance(self.heldout, bool) or not isinstance(self.heldout, (int, float, np.floating)):
            raise ValueError(f"--heldout must be a number in [0, 1), got {self.heldout!r}")
        if not 0 <= self.heldout < 1:
            raise ValueError(f"--heldout must be in [0, 1), got {self.heldout}")
        if not _is_int(self.batch) or self.batch < 1:
            raise ValueError(f"--batch must be an int >= 1, got {self.batch!r}")
        if not _is_int(self.seed):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        object.__setattr__(self, "batch", int(self.batch))
        object.__setattr__(self, "seed", int(self.seed))
        for name in ("overwrite", "progress", "chains", "keep_points"):
            v = getattr(self, name)
            if not isinstance(v, (bool, np.bool_)):
                raise TypeError(f"FrontierSettings.{name} must be a bool, got {type(v).__name__} {v!r}")


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
        return jax.vmap(self._one, (0, None))(params, x)

    def logits(self, x, batch: int = 500):
        return np.concatenate(
            [np.asarray(self.apply(self.params, x[s : s + batch])) for s in range(0, len(x), batch)], axis=1
        )


@dataclass
class FrontierModel:
    """One pool of a frontier run: a saved pool, a pool in memory, or one defense of a defense zoo."""

    label: str  # display prefix of its members' names
    tag: str  # cache folder name under OUT/cache
    group: str  # split stratum (the --models directory)
    pool: Any
    member_names: list[str]


def _member_names(pool) -> list[str]:
    names = [n for s in pool.stacks for n in s.names] if hasattr(pool, "stacks") else []
    if len(names) != pool.num_members:
        names = [f"m{j}" for j in range(pool.num_members)]
    return names


def _is_pool(p) -> bool:
    return all(hasattr(p, a) for a in ("apply", "params", "num_members", "input_shape", "num_classes", "logits"))


def as_models(pools) -> list[FrontierModel]:
    """The pools of :func:`run_frontier` as :class:`FrontierModel` items.

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
        names = [f"{label}/{n}" for n in _member_names(p)]
        out.append(FrontierModel(label, f"{i}-{_safe(label)}", f"{i}-{label}", p, names))
    return out


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
                pool = zm.pool if zm.pool is not None else _FnPool(zm.apply, zm.params, name)
                out.append(FrontierModel(name, f"zoo-{_safe(base)}-{_safe(name)}", f"{i}-{base}", pool, [name]))
            continue
        pool, _ = load_pool(d)
        names = [f"{base}/{n}" for n in _member_names(pool)]
        out.append(FrontierModel(base, f"{i}-{_safe(base)}", f"{i}-{base}", pool, names))
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
        :class:`FrontierSettings`).
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


# Fingerprint fields recorded for information only, never compared: ``data`` names where the images
# of the run that wrote the cache came from (a file's path, "arrays", the MNIST split). The cache's
# identity is the images' content (``images``: x and y, ``ids``), so the same arrays from another path,
# or from Python, share it; caches written while ``data`` was compared (it always was there) still read.
_INFO_FIELDS = ("data",)


def _open_cache(directory: Path, fp: dict[str, Any], overwrite: bool) -> None:
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
    f = outp / "cache" / info["cache"] / f"{_safe(entry)}.npz"
    if not f.is_file():
        raise ValueError(f"{f} does not exist (the cache of {model!r}, entry {entry!r})")
    with np.load(f) as z:
        if "x_adv" not in z.files:
            raise ValueError(f"{f} holds no adversarial points (run with --no-points / keep_points=False)")
        return FrontierPoints(members, z["x_adv"][:, cols], z["norm"][:, cols], z["queries"][:, cols])


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


def _read_entry(f: Path, spec: str, name: str, points: bool, arrays: bool):
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


def _save_entry(f: Path, spec: str, seconds: float, arrays: dict) -> None:
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **arrays, entry=np.array(spec), seconds=np.array(seconds))  # pyright: ignore[reportArgumentType]
    tmp.replace(f)


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
        :class:`FrontierModel` items of :func:`load_models` (:func:`as_models`); every member of
        every pool is a model.
      x: ``[N, H, W, C]`` images in ``[0, 1]``; y: ``[N]`` labels (checked against every pool
        with :func:`sarjax.data.images.check_images`).
      attacks: the attack pool, its norm and budget (:func:`frontier_attacks`;
        ``frontier_attacks(norm)`` is the frontier paper's).
      out: output directory (``frontier.json``, plots, ``cache/``).
      ids: ``[N]`` distinct sample ids seeding each sample's random streams (default
        ``arange(N)``: the first N images of a data set keep their streams in any subset).
      source: where the images come from (recorded in the report, and in a new cache's fingerprint for
        information: the cache is identified by the images' content, so the same arrays from
        another source reuse it).
      meta: entries put first into the report's ``extra`` (the directory form records its
        directories; default ``{"models": [pool labels]}``).
      autoattack: also run AutoAttack (:func:`frontier_autoattack`; default None: not).
      settings: tiers, held-out share, batch, seed, cache and report options
        (:class:`FrontierSettings`; default: the frontier paper's, ``sarjax frontier``'s defaults).

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
                _open_cache(cdir, fp, overwrite)
            if multi and part is not None:
                _open_cache(cdir / part, {**fp, "rows": [int(rows[0]), int(rows[-1]) + 1]}, overwrite)
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
                f = pdir / f"{_safe(e.name)}.npz"
                spec = json.dumps(e.as_dict(), sort_keys=True)
                got, why = _read_entry(f, spec, e.name, keep_points, arrays=multi) if len(rows) else (None, None)
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
                    _save_entry(f, spec, dt, got)
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
                    merged = cdir / f"{_safe(e.name)}.npz"
                    if main_proc and (ran_here or _read_entry(merged, spec, e.name, keep_points, False)[0] is None):
                        _save_entry(merged, spec, dt, got)
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
        :func:`load_models`).
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
            names = [f"{spec}/{m}" for m in _member_names(pool)]
            loaded.append(FrontierModel(spec, f"{i}-{_safe(spec)}", f"{i}-{spec}", pool, names))
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
