"""A frontier study as plain data: nested ensembles, AOI train vs held-out, DOI, rank instability.

:func:`build_report` runs the whole host-side analysis of the frontier paper on a
:class:`~sarjax.frontier.allocation.TrajectoryPool` (trajectories of the attack pool on every
model): the per-entry AOI at the cap (Eq. 5), Algorithm 1 fitted on the train models at nested
tiers with the held-out AOI beside the train AOI (Section 5.1, Figure 2), the DOI of every model
at every tier (Eq. 12, Table 7) and its rank stability across tiers, and the rank instability of
single-eps rankings along an eps grid (Figure 5).  :class:`FrontierReport` is a dataclass of
lists, numbers and strings with an exact JSON round trip (:meth:`FrontierReport.to_json`,
:meth:`FrontierReport.from_json`; ``inf`` is written as JSON's ``Infinity``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sarjax.frontier.allocation import (
    DEFAULT_HELDOUT,
    DEFAULT_TIERS,
    TrajectoryPool,
    budget_levels,
    nested_allocations,
    split_models,
)
from sarjax.frontier.defense import doi, rank_instability, robust_accuracy, tier_tau
from sarjax.frontier.optimality import aoi_from_distances

FORMAT = "sarjax-frontier/1"


@dataclass
class TierResult:
    """One budget tier of the nested ensembles.

    Attributes:
      budget: the tier's total budget ``Q`` (queries per sample).
      q: queries per pool entry (pool order).
      used: ``sum q`` (at most ``budget``).
      train_aoi: global AOI (Eq. 6) on the train models, the objective Algorithm 1 maximised.
      heldout_aoi: global AOI on the held-out models (None without held-out models).
      model_aoi: per-model AOI (Eq. 5), every model.
      doi: per-model DOI (Eq. 12) with this tier's ensemble on every model.
      steps: the greedy's updates up to this tier, ``[entry, from, to, gain per query]``.
    """

    budget: int
    q: list[int]
    used: int
    train_aoi: float
    heldout_aoi: float | None
    model_aoi: list[float]
    doi: list[float]
    steps: list[list[Any]] = field(default_factory=list)

    def ensemble(self, names: Sequence[str]) -> dict[str, int]:
        """``{entry: queries}`` of the active entries."""
        return {n: v for n, v in zip(names, self.q) if v > 0}


@dataclass
class RankReport:
    """Single-eps rankings along an eps grid (the frontier paper Figure 5).

    Attributes:
      eps: the grid.
      accuracy: ``[E][M]`` robust accuracy.
      ranks: ``[E][M]`` ranks (1 = most robust).
      tau: ``[E][E]`` Kendall's tau between grid points.
      shift: ``[M]`` largest rank change per model.
      source: what the accuracies come from (e.g. ``"ensemble 12000"``).
    """

    eps: list[float]
    accuracy: list[list[float]]
    ranks: list[list[int]]
    tau: list[list[float]]
    shift: list[int]
    source: str = ""


@dataclass
class FrontierReport:
    """The results of a frontier study (every field JSON data).

    Attributes:
      norm: the threat model (``"l0"``, ``"l1"``, ``"l2"``, ``"linf"``).
      models: model names; groups: their strata for the split.
      train, heldout: model indices of the split.
      entries: the pool entries (``name``, ``kind``, ``base``, ``rank``).
      cap, every, levels: ``T``, the trajectory resolution and the candidate levels ``S``.
      samples: samples per model.
      clean_accuracy, eps_min: per model, of the attack frontier (``rho(0)``, Section 2.2).
      entry_aoi: ``[A][M]`` AOI of every entry alone at the cap.
      frontier_doi: ``[M]`` DOI with the whole pool at the cap (``q_max``).
      tiers: one :class:`TierResult` per budget tier.
      doi_tau: ``[K][K]`` Kendall's tau between the tiers' DOI rankings (Table 7).
      rank: single-eps rank instability (or None).
      extra: anything else (e.g. AutoAttack curves, timings).
      chains: whether Algorithm 1 also took completed updates (``greedy_allocation(chains=True)``;
        False: as published).
    """

    norm: str
    models: list[str]
    groups: list[str]
    train: list[int]
    heldout: list[int]
    entries: list[dict[str, Any]]
    cap: int
    every: int
    levels: list[int]
    samples: int
    clean_accuracy: list[float]
    eps_min: list[float]
    entry_aoi: list[list[float]]
    frontier_doi: list[float]
    tiers: list[TierResult]
    doi_tau: list[list[float]]
    rank: RankReport | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    chains: bool = False

    @property
    def entry_names(self) -> list[str]:
        """Pool entry names, in pool order."""
        return [e["name"] for e in self.entries]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (with ``format``)."""
        return {"format": FORMAT, **_plain(dataclasses.asdict(self))}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FrontierReport:
        """Rebuild from :meth:`to_dict`'s output.

        Raises:
          ValueError: not a ``sarjax-frontier/1`` dict.
        """
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} report (format={d.get('format') if isinstance(d, dict) else None!r})")
        d = {k: v for k, v in d.items() if k != "format"}
        d["tiers"] = [TierResult(**t) for t in d["tiers"]]
        d["rank"] = None if d.get("rank") is None else RankReport(**d["rank"])
        return cls(**d)

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """The report as JSON text (written to ``path`` when given)."""
        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, text_or_path: str | os.PathLike) -> FrontierReport:
        """Read a report from JSON text or a file path."""
        s = str(text_or_path)
        if not s.lstrip().startswith("{"):
            s = Path(s).read_text()
        return cls.from_dict(json.loads(s))


def _plain(o: Any) -> Any:
    if isinstance(o, dict):
        return {str(k): _plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_plain(v) for v in o]
    if isinstance(o, np.ndarray):
        return _plain(o.tolist())
    if isinstance(o, np.generic):
        return o.item()
    return o


def build_report(
    pool: TrajectoryPool,
    *,
    norm: str,
    tiers: Sequence[int] = DEFAULT_TIERS,
    heldout: float = DEFAULT_HELDOUT,
    groups: Sequence[str] | None = None,
    seed: int = 0,
    levels=None,
    rank_eps=None,
    chains: bool = False,
) -> FrontierReport:
    """The host-side analysis of the frontier paper on trajectories (no attack is run).

    Args:
      pool: trajectories of every entry on every model.
      norm: the threat model's name (recorded).
      tiers: increasing budgets (default 4,000 / 8,000 / 12,000).
      heldout: held-out share of the models (default 13/30; 0: fit on every model).
      groups: per-model strata for the split (default: one stratum).
      seed: split seed (default 0, the frontier paper).
      levels: candidate levels ``S`` (default ``{T/10, ..., T}``).
      rank_eps: eps grid of the rank-instability analysis (default: 10 evenly spaced points
        from 0 to the largest ``eps_min`` of the models, both ends excluded).
      chains: Algorithm 1 with the completed updates of :func:`~sarjax.frontier.greedy_allocation`
        (default False: as published).

    Returns:
      A :class:`FrontierReport`.
    """
    M, A, B = pool.shape
    grp = ["all"] * M if groups is None else [str(g) for g in groups]
    if len(grp) != M:
        raise ValueError(f"{len(grp)} groups for {M} models")
    train, held = split_models(np.asarray(grp), heldout, seed)
    lv = budget_levels(pool, levels)
    front = pool.frontier()
    fin = np.where(np.isfinite(front), front, -np.inf)
    e_min = np.maximum(fin.max(axis=1), 0.0)
    single = pool.single_attack_distances()
    entry_aoi = aoi_from_distances(single, front[None])
    allocs = nested_allocations(pool, tiers, levels=lv, models=train, chains=chains)
    out_tiers = []
    dois = []
    for al in allocs:
        per = pool.aoi_per_model(al.q)
        dv = doi(pool.distances(al.q))
        dois.append(dv)
        out_tiers.append(
            TierResult(
                budget=al.budget,
                q=[int(v) for v in al.q],
                used=al.used,
                train_aoi=float(per[train].mean()),
                heldout_aoi=float(per[held].mean()) if held.size else None,
                model_aoi=per.tolist(),
                doi=dv.tolist(),
                steps=[[n, a, b, g] for n, a, b, g in al.steps],
            )
        )
    last = pool.distances(allocs[-1].q)
    if rank_eps is None:
        top = float(e_min.max())
        rank_eps = np.linspace(0, top, 12)[1:-1] if top > 0 else np.zeros(0)
    rank = None
    if np.size(rank_eps) >= 2 and M >= 2:
        ri = rank_instability(robust_accuracy(last, rank_eps), rank_eps)
        rank = RankReport(
            ri.eps.tolist(),
            ri.accuracy.tolist(),
            ri.ranks.tolist(),
            ri.tau.tolist(),
            ri.shift.tolist(),
            f"ensemble {allocs[-1].budget}",
        )
    return FrontierReport(
        norm=str(norm),
        models=list(pool.models),
        groups=grp,
        train=train.tolist(),
        heldout=held.tolist(),
        entries=[dataclasses.asdict(e) for e in pool.entries],
        cap=int(pool.cap),
        every=int(pool.every),
        levels=lv.tolist(),
        samples=int(B),
        clean_accuracy=np.mean(front > 0, axis=1).tolist(),
        eps_min=e_min.tolist(),
        entry_aoi=entry_aoi.tolist(),
        frontier_doi=doi(front).tolist(),
        tiers=out_tiers,
        doi_tau=tier_tau(np.asarray(dois)).tolist() if len(dois) >= 2 and M >= 2 else [[1.0]],
        rank=rank,
        chains=bool(chains),
    )


__all__ = ["FORMAT", "FrontierReport", "RankReport", "TierResult", "build_report"]
