"""The configuration of a frontier run (:func:`sarjax.experiments.frontier.run_frontier`): the
minimum-norm attack pool (:func:`frontier_attacks`), AutoAttack as a curve
(:func:`frontier_autoattack`) and how the run is carried out and reported (:class:`FrontierSettings`).

Light on purpose: ``sarjax --help`` imports it (the parser's norms and attacks) without JAX.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

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
        paper: 9; at most ``C - 1``, checked against each pool by :func:`sarjax.experiments.frontier.run_frontier`).
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
    """AutoAttack for :func:`sarjax.experiments.frontier.run_frontier` (``--autoattack``): the
    standard version, or the ``attacks`` stages, with ``n_iter`` APGD / FAB iterations and
    ``square_queries`` Square queries, on each pool's eps grid plus ``eps_ref`` (see
    :class:`FrontierAutoAttack`)."""
    return FrontierAutoAttack(
        tuple(attacks) if attacks else None,
        n_iter=n_iter,
        square_queries=square_queries,
        eps_ref=eps_ref,
    )


@dataclass(frozen=True)
class FrontierSettings:
    """How :func:`sarjax.experiments.frontier.run_frontier` runs and reports (not what it attacks
    with: :class:`FrontierAttacks`).

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
