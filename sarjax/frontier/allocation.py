"""Query-budget allocation into attack ensembles (the frontier paper Section 3, Algorithm 1).

An ensemble is a query vector ``q = (q_a)_{a in A}``: attack ``a`` runs with ``q_a`` queries,
``E = {a : q_a > 0}`` (Eq. 7), and a sample's ensemble distance is the minimum over ``E`` of
each attack's best distance after ``q_a`` queries.  Minimum-norm attacks record their best
distance every 10 queries (the trajectory, the frontier paper Section 5.1; ``MinNormResult.trajectory``),
so the distance of ANY allocation is read off the trajectories without re-running an attack.
Restarts and targeted runs are separate pool entries (Section 5.1) tied by the structural
constraints ``C``:

* a random restart may receive queries only while its untargeted base run is active;
* the targeted run against the ``k``-th most likely wrong class cannot receive more queries
  than the run against the ``(k-1)``-th (Section 5.1); the first targeted run, like a restart,
  needs its base run active (our reading: "run ``k - 1``" with run 0 the base).

Problem (8): maximise ``AOI(q)`` subject to ``sum_a q_a <= Q``, ``q_a <= T`` and ``q in C``.
:func:`greedy_allocation` is Algorithm 1: from ``q = 0``, repeatedly apply the feasible update
``(a, q_hat)`` (Eq. 9: ``q_hat in S``, ``q_hat > q_a``, ``q' in C``, total ``<= Q``) with the
largest AOI gain per added query (Eq. 10), until no feasible update has a positive gain.
:func:`nested_allocations` runs it at increasing tiers ``Q in {4k, 8k, 12k}``, each tier
continuing from the previous one's allocation, so ``E_4k ⊆ E_8k ⊆ E_12k`` (Section 5.1).
:func:`optimal_allocation` enumerates every feasible allocation (small pools only): the known
answer the greedy is tested against.

Defaults (the frontier paper Section 5.1): per-attack cap ``T = 1000`` queries (500 steps),
distances recorded every 10 queries, candidate levels ``S = {100, 200, ..., 1000}`` (``J = 10``
evenly spaced up to ``T``), tiers 4,000 / 8,000 / 12,000, a 17/13 train/held-out split of 30
models stratified by data set with seed 0 (:func:`split_models` keeps the 13/30 share).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sarjax.frontier.optimality import aoi_from_distances, curve_stats

DEFAULT_CAP = 1000  # the frontier paper Section 5.1: 500 steps = 1000 queries per attack
DEFAULT_EVERY = 10  # the frontier paper Section 5.1: distance recorded every 10 queries
DEFAULT_TIERS = (4000, 8000, 12000)  # the frontier paper Section 5.1
DEFAULT_HELDOUT = 13 / 30  # the frontier paper Section 5.1: 17 train / 13 held-out of 30 models
KINDS = ("base", "restart", "targeted")


def default_levels(cap: int = DEFAULT_CAP, count: int = 10, every: int = DEFAULT_EVERY) -> np.ndarray:
    """Candidate levels ``S``: ``count`` evenly spaced checkpoints up to ``cap``.

    the frontier paper Section 5.1: ``S = {100, 200, ..., 1000}`` (``J = 10`` up to ``T = 1000``).  A
    cap below ``count * every`` gets one level per trajectory record (``every, 2 every, ...``).
    """
    if cap < every or cap % every:
        raise ValueError(f"cap {cap} must be a positive multiple of {every}")
    count = min(count, cap // every)
    if (cap // every) % count:
        raise ValueError(f"cap {cap} does not split into {count} levels on multiples of {every}")
    return np.arange(1, count + 1, dtype=np.int64) * (cap // count)


@dataclass(frozen=True)
class PoolEntry:
    """One entry of the attack pool (the frontier paper Section 5.1: restarts and targeted runs are
    entries of their own).

    Attributes:
      name: unique name, e.g. ``"fmn"``, ``"fmn/r1"``, ``"fmn/t3"``.
      kind: ``"base"`` (the untargeted run from ``x0``), ``"restart"`` or ``"targeted"``.
      base: the name of the base entry a restart or targeted run belongs to (None for a base).
      rank: targeted runs: ``k`` (1 = the most likely wrong class); restarts: their index.
    """

    name: str
    kind: str = "base"
    base: str | None = None
    rank: int = 0


def _check_entries(entries: Sequence[PoolEntry]) -> tuple[PoolEntry, ...]:
    entries = tuple(entries)
    if not entries:
        raise ValueError("the attack pool needs at least one entry")
    for e in entries:
        if not isinstance(e, PoolEntry):
            raise TypeError(f"entries must be PoolEntry, got {type(e).__name__}")
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"entry names must be unique, got {names}")
    by = {e.name: e for e in entries}
    for e in entries:
        if e.kind not in KINDS:
            raise ValueError(f"entry {e.name!r}: kind must be one of {KINDS}, got {e.kind!r}")
        if e.kind == "base":
            if e.base is not None:
                raise ValueError(f"base entry {e.name!r} must not name a base")
            continue
        if e.base not in by or by[e.base].kind != "base":
            raise ValueError(f"{e.kind} entry {e.name!r} must name an existing base entry, got base={e.base!r}")
    for b in (e for e in entries if e.kind == "base"):
        ranks = sorted(e.rank for e in entries if e.kind == "targeted" and e.base == b.name)
        if ranks != list(range(1, len(ranks) + 1)):
            raise ValueError(f"targeted runs of {b.name!r} must have ranks 1..K, got {ranks}")
    return entries


def _prerequisites(entries: tuple[PoolEntry, ...]) -> tuple[np.ndarray, np.ndarray]:
    """``(needs_active [A], at_most [A])``: index of the entry that must be active (-1: none)
    and of the entry whose allocation bounds this one from above (-1: none)."""
    idx = {e.name: i for i, e in enumerate(entries)}
    active = np.full(len(entries), -1, np.int64)
    upper = np.full(len(entries), -1, np.int64)
    for i, e in enumerate(entries):
        if e.kind == "restart" or (e.kind == "targeted" and e.rank == 1):
            active[i] = idx[e.base]  # type: ignore[index]
        elif e.kind == "targeted":
            prev = next(x for x in entries if x.kind == "targeted" and x.base == e.base and x.rank == e.rank - 1)
            upper[i] = idx[prev.name]
    return active, upper


def simple_pool(names: Sequence[str]) -> tuple[PoolEntry, ...]:
    """Unconstrained entries (every one a base run)."""
    return tuple(PoolEntry(str(n)) for n in names)


def expand_pool(base_names: Sequence[str], restarts: int = 0, targeted: int = 0) -> tuple[PoolEntry, ...]:
    """Entries for base attacks, each with ``restarts`` restarts and ``targeted`` targeted runs.

    the frontier paper Section 5.1 uses 5 restarts (where the solver supports them) and the top-9
    targeted runs.  Names: ``base``, ``base/r1 .. base/rR``, ``base/t1 .. base/tK``.
    """
    out: list[PoolEntry] = []
    for b in base_names:
        out.append(PoolEntry(b))
        out += [PoolEntry(f"{b}/r{r}", "restart", b, r) for r in range(1, restarts + 1)]
        out += [PoolEntry(f"{b}/t{k}", "targeted", b, k) for k in range(1, targeted + 1)]
    return tuple(out)


@dataclass(frozen=True, eq=False)
class TrajectoryPool:
    """Trajectories of an attack pool on a set of models: everything Algorithm 1 reads.

    Attributes:
      trajectories: ``[M, A, B, L]`` float64 best distance of entry ``a`` on model ``m`` for
        sample ``b`` after ``every * (l + 1)`` queries (``inf`` before the first success, ``0``
        for samples the model misclassifies).  Made non-increasing along ``L`` on construction
        (the best distance so far; a minimum-norm attack's trajectory already is).
      entries: ``A`` :class:`PoolEntry` (names, constraint structure).
      cap: the per-attack cap ``T`` (default 1000, the frontier paper Section 5.1); the frontier is
        the pool's minimum at ``T``.
      every: queries between trajectory entries (default 10).
      models: ``M`` model names.
    """

    trajectories: np.ndarray
    entries: tuple[PoolEntry, ...]
    cap: int = DEFAULT_CAP
    every: int = DEFAULT_EVERY
    models: tuple[str, ...] = ()

    def __post_init__(self):
        t = np.asarray(self.trajectories, np.float64)
        if t.ndim != 4:
            raise ValueError(f"trajectories must be [M, A, B, L], got shape {t.shape}")
        if np.isnan(t).any() or (t < 0).any():
            raise ValueError("trajectories must be >= 0 and not NaN (inf before the first success)")
        entries = _check_entries(self.entries)
        if len(entries) != t.shape[1]:
            raise ValueError(f"{len(entries)} entries for {t.shape[1]} trajectories (axis 1)")
        if self.every < 1 or self.cap < self.every or self.cap % self.every:
            raise ValueError(f"cap {self.cap} must be a positive multiple of every {self.every}")
        if t.shape[3] * self.every < self.cap:
            raise ValueError(
                f"trajectories of {t.shape[3]} entries every {self.every} queries stop before the cap {self.cap}"
            )
        models = tuple(self.models) or tuple(f"model{i}" for i in range(t.shape[0]))
        if len(models) != t.shape[0]:
            raise ValueError(f"{len(models)} model names for {t.shape[0]} models")
        t = np.minimum.accumulate(t[..., : self.cap // self.every], axis=-1)
        t.setflags(write=False)
        object.__setattr__(self, "trajectories", t)
        object.__setattr__(self, "entries", entries)
        object.__setattr__(self, "models", models)

    @property
    def names(self) -> tuple[str, ...]:
        """Entry names, in pool order."""
        return tuple(e.name for e in self.entries)

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(M, A, B)``: models, entries, samples."""
        m, a, b, _ = self.trajectories.shape
        return m, a, b

    def _index(self, q) -> np.ndarray:
        q = np.asarray(q, np.int64)
        if q.shape != (self.shape[1],):
            raise ValueError(f"an allocation must be [A={self.shape[1]}] queries, got shape {q.shape}")
        if (q < 0).any() or (q > self.cap).any():
            raise ValueError(f"allocations must lie in [0, cap={self.cap}], got {q.tolist()}")
        return q

    def column(self, a: int, queries) -> np.ndarray:
        """``[M, B, ...]``: entry ``a``'s distance after ``queries`` (int or array of ints;
        ``inf`` for 0 queries; a budget between two records reads the earlier one)."""
        qs = np.asarray(queries, np.int64)
        k = qs // self.every - 1
        col = self.trajectories[:, a][..., np.maximum(k, 0)]
        return np.where(k >= 0, col, np.inf)

    def distances(self, q) -> np.ndarray:
        """``[M, B]`` the ensemble distance of allocation ``q`` (``[A]`` queries): the minimum
        over the active entries of each one's best distance after ``q_a`` queries (``0`` for a
        sample the model misclassifies, i.e. whose frontier distance is 0, even with no entry
        active; ``inf`` where no active entry broke it)."""
        q = self._index(q)
        d = np.where(self.frontier() == 0, 0.0, np.inf)  # misclassified clean samples need no attack
        for a in np.flatnonzero(q):
            d = np.minimum(d, self.column(int(a), int(q[a])))
        return d

    def frontier(self) -> np.ndarray:
        """``[M, B]`` the attack frontier: every entry at the cap ``T`` (``q_max``, Section 3.1)."""
        return self.trajectories[..., -1].min(axis=1)

    def aoi_per_model(self, q) -> np.ndarray:
        """``[M]`` per-model AOI of allocation ``q`` (the frontier paper Eq. 5 with the ensemble's curve)."""

        return aoi_from_distances(self.distances(q), self.frontier())

    def aoi(self, q, models=None) -> float:
        """``AOI(q)``: the global AOI of allocation ``q`` over ``models`` (indices; default all),
        the frontier paper Eq. 6 extended to an allocation (Section 3.1)."""
        per = self.aoi_per_model(q)
        return float(per[_model_index(models, self.shape[0])].mean())

    def single_attack_distances(self) -> np.ndarray:
        """``[A, M, B]`` every entry alone at the cap."""
        return np.moveaxis(self.trajectories[..., -1], 1, 0)

    def select_models(self, models) -> TrajectoryPool:
        """The pool restricted to some models (indices)."""
        idx = _model_index(models, self.shape[0])
        return TrajectoryPool(
            self.trajectories[idx], self.entries, self.cap, self.every, tuple(self.models[i] for i in idx)
        )


def _model_index(models, m: int) -> np.ndarray:
    if models is None:
        return np.arange(m)
    idx = np.asarray(models, np.int64).reshape(-1)
    if idx.size == 0 or (idx < 0).any() or (idx >= m).any():
        raise ValueError(f"model indices must be a non-empty subset of [0, {m}), got {idx.tolist()}")
    return idx


def is_feasible(pool: TrajectoryPool, q, budget: int | None = None, levels=None) -> bool:
    """Whether ``q`` satisfies Problem (8)'s constraints: ``q_a <= T``, ``sum q <= Q`` (if given),
    every ``q_a in {0} ∪ S`` (if ``levels`` given) and the structural rules ``C``."""
    q = np.asarray(q, np.int64)
    if q.shape != (pool.shape[1],) or (q < 0).any() or (q > pool.cap).any():
        return False
    if budget is not None and q.sum() > budget:
        return False
    if levels is not None and not np.isin(q[q > 0], np.asarray(levels)).all():
        return False
    need, upper = _prerequisites(pool.entries)
    for a in range(q.size):
        if q[a] == 0:
            continue
        if need[a] >= 0 and q[need[a]] == 0:
            return False
        if upper[a] >= 0 and q[a] > q[upper[a]]:
            return False
    return True


@dataclass
class Allocation:
    """A query allocation found by :func:`greedy_allocation` (or :func:`optimal_allocation`).

    Attributes:
      q: ``[A]`` int64 queries per pool entry.
      names: the entry names.
      budget: the total budget ``Q`` it was built for.
      aoi: ``AOI(q)`` on the models it was fitted on.
      steps: the greedy's updates, ``(entry, from, to, gain per query)`` in order.
    """

    q: np.ndarray
    names: tuple[str, ...]
    budget: int
    aoi: float
    steps: list[tuple[str, int, int, float]] = field(default_factory=list)

    @property
    def used(self) -> int:
        """Queries the ensemble spends per sample, ``sum_a q_a``."""
        return int(np.sum(self.q))

    @property
    def ensemble(self) -> dict[str, int]:
        """``{entry: q_a}`` of the active entries (Eq. 7)."""
        return {n: int(v) for n, v in zip(self.names, self.q) if v > 0}


def budget_levels(pool: TrajectoryPool, levels) -> np.ndarray:
    lv = default_levels(pool.cap, every=pool.every) if levels is None else np.unique(np.asarray(levels, np.int64))
    if lv.size == 0 or (lv <= 0).any() or (lv > pool.cap).any() or (lv % pool.every).any():
        raise ValueError(
            f"levels must be positive multiples of {pool.every} up to the cap {pool.cap}, got {np.asarray(levels)}"
        )
    return lv


def _chain(a: int, need: np.ndarray, upper: np.ndarray) -> tuple[list[int], int]:
    """``(ups, base)``: the entries bounding ``a`` from above, nearest first (the targeted runs
    ``k - 1, ..., 1`` of a targeted run ``k``), and the entry the last of them needs active (its
    base run; -1 for none)."""
    ups, x = [], a
    while upper[x] >= 0:
        x = int(upper[x])
        ups.append(x)
    return ups, int(need[x])


def greedy_allocation(
    pool: TrajectoryPool, budget: int, *, levels=None, models=None, start=None, chains: bool = False
) -> Allocation:
    """Algorithm 1 of the frontier paper (greedy ensemble construction).

    From ``q = start`` (default ``0``, Line 1), while some feasible update (Eq. 9) has a
    positive gain (Line 2), apply the one with the largest AOI gain per added query
    ``g = (AOI(q') - AOI(q)) / (q_hat - q_a)`` (Eq. 10, Lines 3-4).  Ties go to the earlier
    entry, then the lower level.  Gains are computed as exact per-sample decreases of the
    clipped distances, so an update that changes nothing has gain exactly 0.

    The paper's update changes one entry ("it sets ``q_a = q_hat`` while leaving every other
    entry of ``q`` unchanged", Section 3.2), so an entry behind a structural constraint of ``C``
    is reachable only through prerequisites that bring a gain of their own: the targeted run at
    the 3rd most likely class needs the 1st and 2nd (Section 5.1) even when only the 3rd class's
    boundary is near.  ``chains=True`` (ours, not the frontier paper) widens ``N(q)`` by the least
    feasible completion of every update that ``C`` forbids: ``(a, q_hat)`` also raises the
    targeted runs ``k - 1, ..., 1`` of ``a`` to at least ``q_hat`` and opens a needed base run
    that has no queries at the lowest level ``min S``; its gain per query (Eq. 10) divides the
    AOI gain by every query the completion adds, and it must fit the budget.  Every update the
    paper allows is its own completion, so ``chains=True`` only adds candidates.

    Args:
      pool: the trajectories (:class:`TrajectoryPool`).
      budget: the total budget ``Q`` (queries per sample).
      levels: candidate levels ``S`` (default ``{T/10, ..., T}``, Section 5.1).
      models: indices of the models to fit on (the train split; default all).
      start: an allocation to continue from (the previous tier, :func:`nested_allocations`);
        must be feasible.
      chains: also consider the completions of updates that ``C`` forbids (default False:
        Algorithm 1 as published).

    Returns:
      The :class:`Allocation`, with its AOI on ``models`` and the list of updates (a completed
      update appears as consecutive steps with one gain, its prerequisites first).
    """
    lv = budget_levels(pool, levels)
    if isinstance(budget, bool) or int(budget) != budget or budget < 0:
        raise ValueError(f"budget must be an int >= 0, got {budget!r}")
    budget = int(budget)
    idx = _model_index(models, pool.shape[0])
    traj = pool.trajectories[idx]  # [M, A, B, L]
    front = traj[..., -1].min(axis=1)  # [M, B]
    e, _, _, den = curve_stats(front)
    live = den > 0  # models whose AOI can move
    A = pool.shape[1]
    q = np.zeros(A, np.int64) if start is None else np.asarray(start, np.int64).copy()
    if not is_feasible(pool, q, budget):
        raise ValueError(f"start allocation {q.tolist()} is infeasible for budget {budget}")
    need, upper = _prerequisites(pool.entries)
    chain = [_chain(a, need, upper) for a in range(A)]
    # clipped ensemble distances of the live models, and per-model weights 1 / (M B den)
    dist = pool.distances(q)[idx][live]
    e_l = e[live][:, None]
    clip = np.minimum(dist, e_l)
    w = 1.0 / (len(idx) * front.shape[1] * np.where(live, den, 1.0)[live])
    steps: list[tuple[str, int, int, float]] = []
    tl = traj[live]  # [M', A, B, L]

    def at(a: int, qs: np.ndarray) -> np.ndarray:  # [M', B, J] entry a after qs [J] queries (> 0)
        return tl[:, a][..., qs // pool.every - 1]

    while live.any():
        left = budget - int(q.sum())
        best: tuple[float, int, int] | None = None
        for a in range(A):
            ups, base = chain[a]
            lim = q[upper[a]] if upper[a] >= 0 else pool.cap
            opened = base >= 0 and q[base] == 0
            if not chains and opened:
                continue
            ok = lv > q[a]
            if not chains:
                ok &= lv <= lim
            cand = lv[ok]
            if cand.size == 0:
                continue
            cost = cand - q[a]
            for u in ups:  # the targeted runs above a, raised to at least q_hat (chains only)
                cost = cost + np.maximum(cand - q[u], 0)
            if opened:
                cost = cost + lv[0]
            fit = cost <= left
            if not fit.any():
                continue
            cand, cost = cand[fit], cost[fit]
            d = at(a, cand)
            for u in ups:
                d = np.minimum(d, at(u, np.maximum(cand, q[u])))
            if opened:
                d = np.minimum(d, at(base, lv[:1])[..., [0] * cand.size])
            d = np.minimum(d, e_l[..., None])  # [M', B, J]
            drop = np.maximum(clip[..., None] - d, 0.0).sum(axis=1)  # [M', J]
            gain = (w @ drop) / cost
            j = int(np.argmax(gain))
            if gain[j] > 0 and (best is None or gain[j] > best[0]):
                best = (float(gain[j]), a, int(cand[j]))
        if best is None:
            break
        g, a, new = best
        ups, base = chain[a]
        changes = [(base, int(lv[0]))] if base >= 0 and q[base] == 0 else []
        changes += [(u, new) for u in reversed(ups) if q[u] < new] + [(a, new)]
        for b, v in changes:
            steps.append((pool.entries[b].name, int(q[b]), v, g))
            q[b] = v
            clip = np.minimum(clip, np.minimum(tl[:, b][..., v // pool.every - 1], e_l))
    return Allocation(q, pool.names, budget, pool.aoi(q, idx), steps)


def nested_allocations(
    pool: TrajectoryPool, tiers: Sequence[int] = DEFAULT_TIERS, *, levels=None, models=None, chains: bool = False
) -> list[Allocation]:
    """Algorithm 1 at increasing budget tiers, each tier continuing from the previous one.

    the frontier paper Section 5.1: "Because our greedy strategy monotonically increases budget
    allocations, we record the resulting ensembles at three distinct query tiers", giving
    ``E_4k ⊆ E_8k ⊆ E_12k``.  Here tier ``Q_i`` runs Algorithm 1 with budget ``Q_i`` from
    tier ``Q_{i-1}``'s allocation, so every tier's allocation dominates the previous one
    entry by entry (and a user can extend a run to the next tier).

    Args:
      pool: the trajectories.
      tiers: increasing budgets (default 4,000 / 8,000 / 12,000).
      levels, models, chains: as :func:`greedy_allocation`.
    """
    ts = [int(t) for t in tiers]
    if not ts or any(b <= a for a, b in zip(ts, ts[1:])) or ts[0] < 0:
        raise ValueError(f"tiers must be increasing budgets >= 0, got {list(tiers)}")
    out: list[Allocation] = []
    q = None
    for t in ts:
        alloc = greedy_allocation(pool, t, levels=levels, models=models, start=q, chains=chains)
        if out:
            alloc.steps = out[-1].steps + alloc.steps
        out.append(alloc)
        q = alloc.q
    return out


def optimal_allocation(pool: TrajectoryPool, budget: int, *, levels=None, models=None) -> Allocation:
    """The optimum of Problem (8) by enumeration of every feasible ``q in ({0} ∪ S)^A``.

    Exponential in the pool size (``(|S| + 1)^A`` allocations): for tests and small pools
    (3-4 entries, a few levels).  Ties go to the allocation with fewer queries.
    """
    lv = budget_levels(pool, levels)
    A = pool.shape[1]
    if (lv.size + 1) ** A > 2_000_000:
        raise ValueError(f"{(lv.size + 1) ** A} allocations: too many to enumerate (use greedy_allocation)")
    idx = _model_index(models, pool.shape[0])
    choices = np.concatenate([[0], lv])
    best_q, best_v = np.zeros(A, np.int64), -np.inf
    for combo in itertools.product(choices, repeat=A):
        q = np.asarray(combo, np.int64)
        if q.sum() > budget or not is_feasible(pool, q):
            continue
        v = pool.aoi(q, idx)
        if v > best_v + 1e-15 or (abs(v - best_v) <= 1e-15 and q.sum() < best_q.sum()):
            best_q, best_v = q, v
    return Allocation(best_q, pool.names, int(budget), float(best_v))


def split_models(n_or_groups, heldout: float = DEFAULT_HELDOUT, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A stratified train / held-out split of the models (the frontier paper Section 5.1).

    The paper splits 30 defenses into 17 train and 13 held-out, stratified across data sets
    (12/8 on CIFAR-10, 5/5 on ImageNet), seed 0.  Here ``round(heldout * n)`` models are
    held out, shared among the groups in proportion to their sizes (largest remainder), each
    group shuffled by ``numpy.random.default_rng(seed)``; at least one model stays in train.

    Args:
      n_or_groups: the number of models, or ``[n]`` group labels to stratify on (e.g. the
        defense family or training norm of each model).
      heldout: the held-out share in ``[0, 1)`` (default 13/30).
      seed: the shuffle seed (default 0, as the paper).

    Returns:
      ``(train, heldout)`` sorted model indices.
    """
    groups = np.zeros(int(n_or_groups), np.int64) if np.ndim(n_or_groups) == 0 else np.asarray(n_or_groups)
    n = groups.shape[0]
    if n < 1:
        raise ValueError("split_models needs at least one model")
    if not 0 <= heldout < 1:
        raise ValueError(f"heldout must be a share in [0, 1), got {heldout}")
    k = min(int(round(heldout * n)), n - 1)
    labels, inv = np.unique(groups, return_inverse=True)
    sizes = np.bincount(inv, minlength=labels.size)
    exact = k * sizes / n
    take = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - take), kind="stable")
    take[order[: k - int(take.sum())]] += 1
    rng = np.random.default_rng(seed)
    held: list[int] = []
    for g in range(labels.size):
        members = np.flatnonzero(inv == g)
        held += rng.permutation(members)[: take[g]].tolist()
    h = np.sort(np.asarray(held, np.int64))
    return np.setdiff1d(np.arange(n), h), h


__all__ = [
    "Allocation",
    "budget_levels",
    "DEFAULT_CAP",
    "DEFAULT_EVERY",
    "DEFAULT_HELDOUT",
    "default_levels",
    "DEFAULT_TIERS",
    "expand_pool",
    "greedy_allocation",
    "is_feasible",
    "nested_allocations",
    "optimal_allocation",
    "PoolEntry",
    "simple_pool",
    "split_models",
    "TrajectoryPool",
]
