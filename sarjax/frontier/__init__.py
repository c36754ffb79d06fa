"""sarjax.frontier: attack and defense frontiers (the frontier paper), host-side numpy.

Robustness-perturbation curves as exact step functions (:mod:`~sarjax.frontier.curves`), the
attack frontier and the Attack Optimality Index (:mod:`~sarjax.frontier.optimality`), query-budget
allocation into nested ensembles by Algorithm 1 (:mod:`~sarjax.frontier.allocation`), the
defense frontier, the Defense Optimality Index and rank instability
(:mod:`~sarjax.frontier.defense`), a fixed-eps attack (AutoAttack) as a curve
(:mod:`~sarjax.frontier.fixed_eps`), the whole analysis as JSON data
(:mod:`~sarjax.frontier.report`) and its plots (:mod:`~sarjax.frontier.plots`).

Like ``cover``, this layer sits above ``attacks``: it reads per-sample distances and
trajectories (``MinNormResult.norm`` / ``.trajectory``) and never touches parameters.

The narrative page (docs/frontier.md) follows.

.. include:: ../../docs/frontier.md
"""

from sarjax.frontier import allocation, curves, defense, fixed_eps, optimality, plots, report
from sarjax.frontier.allocation import (
    DEFAULT_CAP,
    DEFAULT_EVERY,
    DEFAULT_HELDOUT,
    DEFAULT_TIERS,
    Allocation,
    PoolEntry,
    TrajectoryPool,
    default_levels,
    expand_pool,
    greedy_allocation,
    is_feasible,
    nested_allocations,
    optimal_allocation,
    simple_pool,
    split_models,
)
from sarjax.frontier.curves import LinearCurve, StepCurve, aurec, eps_min
from sarjax.frontier.defense import (
    RankInstability,
    defense_frontier,
    doi,
    eps_def,
    kendall_tau,
    rank_instability,
    ranks,
    robust_accuracy,
    tier_tau,
)
from sarjax.frontier.fixed_eps import FixedEpsCurve, eps_grid, fixed_eps_curve, interpolated_curve
from sarjax.frontier.optimality import aoi, aoi_from_distances, attack_frontier, global_aoi, per_model_aoi
from sarjax.frontier.report import FrontierReport, RankReport, TierResult, build_report

__all__ = [
    "allocation",
    "curves",
    "defense",
    "fixed_eps",
    "optimality",
    "plots",
    "report",
    "DEFAULT_CAP",
    "DEFAULT_EVERY",
    "DEFAULT_HELDOUT",
    "DEFAULT_TIERS",
    "Allocation",
    "FixedEpsCurve",
    "FrontierReport",
    "LinearCurve",
    "PoolEntry",
    "RankInstability",
    "RankReport",
    "StepCurve",
    "TierResult",
    "TrajectoryPool",
    "aoi",
    "aoi_from_distances",
    "attack_frontier",
    "aurec",
    "build_report",
    "default_levels",
    "defense_frontier",
    "doi",
    "eps_def",
    "eps_grid",
    "eps_min",
    "expand_pool",
    "fixed_eps_curve",
    "global_aoi",
    "greedy_allocation",
    "interpolated_curve",
    "is_feasible",
    "kendall_tau",
    "nested_allocations",
    "optimal_allocation",
    "per_model_aoi",
    "rank_instability",
    "ranks",
    "robust_accuracy",
    "simple_pool",
    "split_models",
    "tier_tau",
]
