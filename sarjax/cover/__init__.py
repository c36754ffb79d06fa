"""sarjax.cover: host-side SAR greedy, exact partial covers and pool metrics.

The cover layer drives attacks through host callables with fixed shapes
(:class:`JointAttack`, :class:`SingleAttack`) and never touches parameters. The pipelines that
build those callables from a pool and an attack (vision, LLM, across processes) are in
:mod:`sarjax.sar`.

The narrative page (docs/cover.md) follows.

.. include:: ../../docs/cover.md
"""

# the submodules, so that the API reference has a page for each (pdoc follows __all__)
from sarjax.cover import (  # noqa: E402
    exact,
    greedy,
    metrics,
    plots,
    result,
    synthetic,
    types,
)
from sarjax.cover.exact import (
    CoverCheck,
    ExactCover,
    brute_force_partial_cover,
    exact_check,
    exact_partial_cover,
)
from sarjax.cover.greedy import GreedySettings, greedy_sar
from sarjax.cover.metrics import asr, coverage_target, jasc, tasc, theorem1_factor
from sarjax.cover.result import SARResult, concat_results
from sarjax.cover.synthetic import SetSystemOracle
from sarjax.cover.types import Candidates, JointAttack, SingleAttack

__all__ = [
    "exact",
    "greedy",
    "metrics",
    "plots",
    "result",
    "synthetic",
    "types",
    "Candidates",
    "CoverCheck",
    "ExactCover",
    "GreedySettings",
    "JointAttack",
    "SARResult",
    "SetSystemOracle",
    "SingleAttack",
    "asr",
    "brute_force_partial_cover",
    "concat_results",
    "coverage_target",
    "exact_check",
    "exact_partial_cover",
    "greedy_sar",
    "jasc",
    "tasc",
    "theorem1_factor",
]
