"""AutoAttack (Croce & Hein, ICML 2020) in JAX: the parameter-free ensemble run as a cascade.

:func:`autoattack` runs AutoAttack's attacks one after the other, each on the points still
robust after the previous ones, and returns the per-sample, per-member robust flags, the
adversarial points (audited against the ORIGINAL inputs), exact per-sample query counts and an
AutoAttack-like per-stage log. :func:`autoattack_pool` does the same for every member of a
:class:`sarjax.models.pool.Pool` (members vmapped, stack by stack). The sanity checks
(``checks=True``) live in :mod:`sarjax.attacks.autoattack_checks`.

Versions (AutoAttack reference code ``autoattack/autoattack.py``, ``set_version``):

* ``standard``, linf / l2: APGD-CE (1 restart, 100 iterations), APGD-T (top 9 other classes,
  1 restart, 100 iterations each), FAB-T (9 targets, 1 restart, 100 iterations each), Square
  (5,000 queries, ``p_init = 0.8``, 1 restart, ``resc_schedule=False``: the ``p`` schedule's
  thresholds on the raw iteration count, :func:`sarjax.attacks.square.p_schedule`).
* ``standard``, l1 (AutoAttack's l1 version, Croce & Hein 2021, "Mind the box"): APGD-CE with 5
  restarts and 5 targets for APGD-T, both with ``use_largereps`` (each run is three chained APGD
  phases at ``3 eps, 2 eps, eps`` for ``30 / 30 / 40 %`` of the iterations, every phase projected
  into the ball of the ORIGINAL input and warm-started from the previous phase's highest-loss
  point, ``autopgd_base.py::decr_eps_pgd``), FAB-T (9 targets), then Square (5,000 queries) in its
  l1 variant (:mod:`sarjax.attacks.square`, AutoAttack's ``square.py`` branch ``L1``).
* ``plus``: APGD-CE and APGD-DLR (5 restarts each), FAB (untargeted, 5 restarts), Square
  (5,000 queries), APGD-T (9 targets), FAB-T (9 targets).
* ``rand`` (randomized defenses): APGD-CE and APGD-DLR, 1 restart, EOT over 20 draws
  (``eot_iter = 20``). ``apply`` is then the stochastic ``apply(params, x, key)`` (the convention
  of :func:`sarjax.attacks.eot.with_input_noise`). On a pool, :func:`autoattack_pool` attacks the
  randomized members as deployed (``stochastic={name: apply(params, x, key)}``: a self-ensemble's
  stochastic views, a noise defense's input noise; ``sarjax autoattack --version rand`` reads them
  from the saved pool).

Every other hyperparameter is the building block's AutoAttack default (APGD: ``rho = 0.75``,
momentum 0.75, checkpoints at ``p_j``; FAB: ``alpha_max = 0.1, eta = 1.05, beta = 0.9``; see
:mod:`sarjax.attacks.apgd`, :mod:`sarjax.attacks.fab`, :mod:`sarjax.attacks.square`).

The cascade (``autoattack.py::run_standard_evaluation``): a point starts robust for member ``m``
if ``m`` classifies it correctly; each attack run (a restart, a target, an l1 phase schedule)
sees the ``[B, M]`` mask of the (sample, member) pairs still robust and attacks only those
(per-member masks: a sample broken for member 0 is still attacked for member 1 in the same call);
a pair broken by a run is removed from the mask before the next run. Before every run the
samples still robust for some member are packed into chunks of ``batch_size`` rows and the rest
into chunks of the bucket sizes ``batch_size / 2^j``, ``j < 4``: the cover with the fewest padded
rows plus 16 rows per chunk, the last chunk padded (at most four compiled shapes per attack;
Square's last chunk is one chunk of its rows rounded up to a multiple of 8, since each of its
5,000 iterations scans every padded row; a sample's random streams come from its sample id, so
its chunk does not change its result): fully
broken samples cost no compute in any later run. Restarts and targets are cascades
too, as in AutoAttack's ``perturb``: a point broken by target 1 is not attacked at target 2.

Success of a run is decided by a verification forward pass of each member at the run's returned
point (AutoAttack's ``get_logits(adv_curr)`` after each attack): the point is adversarial for
member ``m`` if ``m`` misclassifies it (``rand``: if ``m`` misclassifies it on more than half of
the ``eot`` draws, i.e. the smoothed prediction; the clean accuracy uses the same rule). FAB
runs as a fixed-eps attack: its minimum-norm point counts only if its realized norm is
``<= eps`` (``fab_base.py``: ``res <= eps``).

Query accounting (docs/design.md): one forward or one backward pass of one member on one sample is
one query. Per (sample, member): the clean evaluation (``eot``); per run on a still-robust pair,
what the building block charges (APGD: its clean evaluation ``eot``, then ``2 eot`` per gradient
iteration, ``n_iter + 1`` of them, plus ``eot`` for the final re-evaluation with EOT; FAB-T:
``1 + 3 n_iter``; FAB: ``1 + (C + 1) n_iter``; Square: ``1`` per evaluated point while active),
plus the verification forward (``eot``); APGD-T / FAB-T add one forward per pair at the stage's
start to rank the targets on the clean logits. Pairs that are no longer robust (a member already
broken while another is not, padding rows) ride along in the chunk with an all-zero mask: their
results are discarded and they are charged 0 (AutoAttack removes them from the batch). The sanity checks are diagnostics and are not charged.

Every stage's output is audited (:func:`sarjax.attacks.audit.check`) against the ORIGINAL
inputs with the stage's eps (l1 phases at ``3 eps`` and ``2 eps`` are audited at their own
radius; only the last phase, at ``eps``, can produce a returned point), and the final
``x_adv`` once more.

The narrative page (docs/autoattack.md) follows.

.. include:: ../../docs/autoattack.md
"""

import functools
import itertools
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks import geometry as G
from sarjax.attacks.apgd import make_apgd
from sarjax.attacks.audit import check
from sarjax.attacks.autoattack_checks import N_TARGETS, VERSIONS, AutoAttackWarning, sanity_checks
from sarjax.attacks.core.entry import HostDrivenEntry
from sarjax.attacks.core.protocol import Problem, run
from sarjax.attacks.fab import make_fab
from sarjax.attacks.minnorm import MinNormProblem
from sarjax.attacks.square import make_square
from sarjax.attacks.threat import Threat, canonical_norm, check_labels, norm_name
from sarjax.runtime import run_state
from sarjax.runtime.distributed import all_ok, allgather_rows, process_count, process_index

ATTACKS = ("apgd-ce", "apgd-dlr", "apgd-t", "fab", "fab-t", "square")

N_ITER = 100  # APGD and FAB iterations (autoattack.py: APGDAttack / FABAttack_PT n_iter=100)
N_TARGETS_L1 = 5  # APGD-T targets of the l1 version (set_version, norm 'L1')
RESTARTS_L1 = 5  # APGD-CE restarts of the l1 version (idem)
RESTARTS_PLUS = 5  # APGD / FAB restarts of the plus version (idem)
SQUARE_QUERIES = 5000  # Square n_queries (set_version)
SQUARE_P_INIT = 0.8  # Square p_init (autoattack.py: SquareAttack(p_init=.8))
SQUARE_RESCALE = False  # Square resc_schedule (autoattack.py: SquareAttack(..., resc_schedule=False))
EOT_RAND = 20  # the rand version's eot_iter (set_version)
LARGEREPS = ((3.0, 0.3), (2.0, 0.3), (1.0, 0.4))  # l1 use_largereps: (eps multiple, share of n_iter)
FAB_RAND_RADIUS = 0.5  # FAB restarts > 0 start at radius eps / 2 (fab_pt.py: ``* .5``)
SQUARE_GAIN = 0.002  # checks.py check_square_sr: alpha = .002
BATCH = 250  # rows per compiled call (autoattack.py run_standard_evaluation: bs=250)
N_BUCKETS = 4  # chunk sizes bs, bs / 2, bs / 4, bs / 8 (sarjax: padding vs compiled shapes)
MIN_BUCKET = 32  # no chunk size below 32 rows unless bs is smaller (sarjax)
SQUARE_GRANULE = 8  # Square's last chunk: its rows rounded up to a multiple of 8, one shape (sarjax)


def _is_int(v: object) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, np.integer))


@dataclass(frozen=True)
class AutoAttackConfig:
    """What AutoAttack attacks with: the threat model, the version and its budgets (the attack's
    hyperparameters; build it with :func:`autoattack_config`, which gives AutoAttack's reference
    defaults, ``autoattack/autoattack.py``, ``set_version``).

    Attributes:
        norm: ``"linf"``, ``"l2"`` or ``"l1"`` (as given; the fingerprints record it so).
        eps: the radius, a finite float > 0.
        version: ``"standard"``, ``"plus"`` or ``"rand"``.
        attacks: a custom tuple of stages from ``ATTACKS`` (AutoAttack's ``version='custom'``), or
            None: the version's (:func:`stages_of`).
        n_iter: APGD iterations (AutoAttack: 100).
        fab_iter: FAB iterations (AutoAttack: 100; at least 3 when FAB runs).
        square_queries: Square queries (AutoAttack: 5,000).
        square_rescale_schedule: rescale Square's ``p`` schedule to ``square_queries``
            (:func:`sarjax.attacks.square.p_schedule`); AutoAttack: False, torchattacks'
            ``AutoAttack``: True (its ``Square`` default).
        box: input bounds ``(lo, hi)`` (default ``(0.0, 1.0)``).

    Raises:
        ValueError: a bad norm, eps, version, stage list, budget (an int >= 1; ``fab_iter >= 3``
            when FAB runs) or box.
        TypeError: ``square_rescale_schedule`` not a bool.
    """

    norm: Any
    eps: float
    version: str = "standard"
    attacks: tuple[str, ...] | None = None
    n_iter: int = N_ITER
    fab_iter: int = N_ITER
    square_queries: int = SQUARE_QUERIES
    square_rescale_schedule: bool = SQUARE_RESCALE
    box: tuple[float, float] = (0.0, 1.0)

    def __post_init__(self) -> None:
        if self.version not in VERSIONS:
            raise ValueError(f"version must be one of {VERSIONS}, got {self.version!r}")
        p = canonical_norm(self.norm)
        if p not in (1.0, 2.0, math.inf):
            raise ValueError(f"AutoAttack supports norm linf, l2 or l1, got {self.norm!r}")
        eps = self.eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating)) or not (0 < float(eps) < math.inf):
            raise ValueError(f"eps must be a finite float > 0, got {eps!r}")
        object.__setattr__(self, "eps", float(eps))
        for name in ("n_iter", "fab_iter", "square_queries"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
            object.__setattr__(self, name, int(v))
        if not isinstance(self.square_rescale_schedule, bool):
            raise TypeError(f"square_rescale_schedule must be a bool, got {self.square_rescale_schedule!r}")
        if self.attacks is not None:
            if isinstance(self.attacks, str):
                raise ValueError(f"attacks must be a non-empty list from {ATTACKS}, got {self.attacks!r}")
            object.__setattr__(self, "attacks", tuple(self.attacks))
        stages = self.stages
        bad = [a for a in stages if a not in ATTACKS]
        if bad or not stages:
            raise ValueError(f"attacks must be a non-empty list from {ATTACKS}, got {self.attacks!r}")
        if self.fab_iter < 3 and ({"fab", "fab-t"} & set(stages)):
            raise ValueError(
                f"fab_iter must be >= 3 when FAB runs (sarjax's minimum-norm budget is at least 10 queries, "
                f"1 + 3 fab_iter for FAB-T), got {self.fab_iter}"
            )
        box = tuple(self.box)
        if len(box) != 2 or not all(isinstance(v, (int, float, np.floating)) and math.isfinite(v) for v in box):
            raise ValueError(f"box must be two finite floats (lo, hi), got {self.box!r}")
        if not box[0] < box[1]:
            raise ValueError(f"box must have lo < hi, got {self.box!r}")
        object.__setattr__(self, "box", (float(box[0]), float(box[1])))

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages run, in order (``attacks``, or the version's)."""
        return stages_of(self.version, self.norm) if self.attacks is None else self.attacks


def autoattack_config(
    norm: Any,
    eps: float,
    version: str = "standard",
    *,
    attacks: Any = None,
    n_iter: int = N_ITER,
    fab_iter: int = N_ITER,
    square_queries: int = SQUARE_QUERIES,
    square_rescale_schedule: bool = SQUARE_RESCALE,
    box: tuple[float, float] = (0.0, 1.0),
) -> AutoAttackConfig:
    """AutoAttack's attack (Croce & Hein, ICML 2020): threat model, version and budgets, with the
    reference's defaults (``autoattack/autoattack.py``: APGD and FAB ``n_iter = 100``, Square
    ``n_queries = 5000`` and ``resc_schedule=False``; the version's stages from ``set_version``).

    Args:
      norm: ``"linf"``, ``"l2"`` or ``"l1"``.
      eps: the radius (a float > 0).
      version: ``"standard"`` (default), ``"plus"`` or ``"rand"``.
      attacks: a custom list of stages from ``ATTACKS`` (AutoAttack's ``version='custom'``); None:
        the version's.
      n_iter, fab_iter, square_queries, square_rescale_schedule, box: see :class:`AutoAttackConfig`.

    Returns:
      The frozen, validated :class:`AutoAttackConfig`.

    Raises:
      ValueError, TypeError: as :class:`AutoAttackConfig`.
    """
    return AutoAttackConfig(
        norm, eps, version, attacks, n_iter, fab_iter, square_queries,
        square_rescale_schedule, box,
    )  # fmt: skip


@dataclass(frozen=True)
class AutoAttackSettings:
    """How the AutoAttack pipelines (:func:`autoattack`, :func:`autoattack_pool`,
    :func:`sarjax.experiments.autoattack.run_autoattack`) run, not what they attack with
    (:class:`AutoAttackConfig`).

    Attributes:
        batch_size: rows per compiled call (default None: ``min(B, 250)``, AutoAttack's ``bs``);
            see :func:`autoattack`. An int >= 1.
        checks: run :func:`sarjax.attacks.autoattack_checks.sanity_checks` on the first batch
            first (default True; warnings).
        log: print the AutoAttack-like log while running (default True).
        progress: optional ``progress(stage, done, total)`` (see :func:`autoattack`); it only
            observes.
        distribute: spread every run's chunks over the processes of JAX's distributed runtime
            (default False; see :func:`autoattack`).
        per_member: :func:`autoattack_pool` runs every member on its own (default False: one
            vmapped call per stack; see there). Ignored by :func:`autoattack`.
        checkpoint_dir: resume (default None: no checkpoint): the state of the ``j``-th cascade
            call goes to ``checkpoint_dir/call_<j>.npz`` (:func:`autoattack`: ``call_0.npz``);
            a finished call is restored whole, an interrupted one resumes at its next run.
            ``run_autoattack`` also fingerprints the folder.
        overwrite: start afresh: ignore (:func:`autoattack`, :func:`autoattack_pool`) or delete
            (``run_autoattack``: and replace ``out`` written with other settings) what an earlier
            run wrote (default False).
        out: ``run_autoattack`` only: the JSON report's path (``OUT.npz`` beside it); default
            None, nothing written. :func:`autoattack` and :func:`autoattack_pool` refuse it.

    Raises:
        ValueError: ``batch_size`` not None or an int >= 1.
        TypeError: a flag that is not a bool, a ``progress`` that is not callable, a path that is
            not None, a str or a path.
    """

    batch_size: int | None = None
    checks: bool = True
    log: bool = True
    progress: Callable[[str, int, int], None] | None = None
    distribute: bool = False
    per_member: bool = False
    checkpoint_dir: str | os.PathLike | None = None
    overwrite: bool = False
    out: str | os.PathLike | None = None

    def __post_init__(self) -> None:
        if self.batch_size is not None and (not _is_int(self.batch_size) or self.batch_size < 1):
            raise ValueError(f"batch_size must be an int >= 1, got {self.batch_size!r}")
        for name in ("checks", "log", "distribute", "per_member", "overwrite"):
            v = getattr(self, name)
            if not isinstance(v, (bool, np.bool_)):
                raise TypeError(f"AutoAttackSettings.{name} must be a bool, got {type(v).__name__} {v!r}")
        if self.progress is not None and not callable(self.progress):
            raise TypeError(f"progress must be a callable progress(stage, done, total) or None, got {self.progress!r}")
        for name in ("checkpoint_dir", "out"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, (str, os.PathLike)):
                raise TypeError(f"AutoAttackSettings.{name} must be None, a str or a path, got {type(v).__name__}")


def _settings(settings: Any, who: str) -> AutoAttackSettings:
    if settings is None:
        return AutoAttackSettings()
    if not isinstance(settings, AutoAttackSettings):
        raise TypeError(f"{who}: settings must be an AutoAttackSettings or None, got {type(settings).__name__}")
    return settings


def _config(attack: Any, who: str) -> AutoAttackConfig:
    if not isinstance(attack, AutoAttackConfig):
        raise TypeError(
            f"{who}: attack must be an AutoAttackConfig (autoattack_config(norm, eps, version, ...)), "
            f"got {type(attack).__name__}"
        )
    return attack


class StageLog(NamedTuple):
    """One stage of the cascade.

    Attributes:
      name: the attack (``"apgd-ce"``, ``"apgd-t"``, ...).
      robust_accuracy: ``[M]`` robust accuracy of each member after the stage.
      seconds: wall time of the stage (host clock, including compilation).
      queries: total queries the stage spent (all samples and members).
      attacked: (sample, member) pairs still robust when the stage started.
      broken: pairs the stage made non-robust.
      skipped: why the stage did not run (``""`` if it ran).
    """

    name: str
    robust_accuracy: np.ndarray
    seconds: float
    queries: int
    attacked: int
    broken: int
    skipped: str = ""


class AutoAttackResult(NamedTuple):
    """What :func:`autoattack` returns (host numpy arrays).

    Attributes:
      x_adv: ``[B, M, *S]`` per member the adversarial point that broke it (``x0`` where the
        member stayed robust or was wrong on the clean input).
      robust: ``[B, M]`` bool, member ``m`` is still correct after every stage.
      clean: ``[B, M]`` bool, member ``m`` classifies the clean input correctly.
      queries: ``[B, M]`` int64 queries spent on member ``m`` for sample ``b`` (clean evaluation
        included; see the module docstring for the accounting).
      stage_queries: ``[S, B, M]`` int64 the same per stage (index 0: the clean evaluation, then
        one row per entry of ``log``).
      stage_robust: ``[S, B, M]`` bool robust flags after the clean evaluation and each stage.
      log: one :class:`StageLog` per stage.
      version, norm, eps: the evaluation's settings (``norm`` as ``"linf"``, ``"l2"``, ``"l1"``).
      names: member names (``("model",)`` for a single model).
      warnings: the sanity checks' messages.
    """

    x_adv: np.ndarray
    robust: np.ndarray
    clean: np.ndarray
    queries: np.ndarray
    stage_queries: np.ndarray
    stage_robust: np.ndarray
    log: tuple
    version: str
    norm: str
    eps: float
    names: tuple
    warnings: tuple

    @property
    def success(self) -> np.ndarray:
        """``[B, M]`` bool, member ``m`` is fooled at ``x_adv[b, m]`` (``~robust``: broken by a
        stage, or wrong on the clean input); the one result base's field."""
        return ~self.robust

    @property
    def robust_accuracy(self) -> np.ndarray:
        """``[M]`` robust accuracy of each member."""
        return self.robust.mean(axis=0)

    @property
    def clean_accuracy(self) -> np.ndarray:
        """``[M]`` clean accuracy of each member."""
        return self.clean.mean(axis=0)

    def summary(self) -> str:
        """AutoAttack's log in words: version, initial accuracy, robust accuracy after each
        stage (mean over members), time and queries, then per-member robust accuracy."""
        lines = [f"AutoAttack ({self.version}, {self.norm}, eps={self.eps:g}): {len(self.names)} member(s)"]
        lines.append(f"initial accuracy: {100 * float(self.clean_accuracy.mean()):.2f}%")
        t = 0.0
        for s in self.log:
            if s.skipped:
                lines.append(f"{s.name}: skipped ({s.skipped})")
                continue
            t += s.seconds
            lines.append(
                f"robust accuracy after {s.name.upper()}: {100 * float(s.robust_accuracy.mean()):.2f}% "
                f"(total time {t:.1f} s, {s.queries} queries, {s.broken} of {s.attacked} broken)"
            )
        for name, c, r in zip(self.names, self.clean_accuracy, self.robust_accuracy):
            lines.append(f"  {name}: clean {100 * float(c):.2f}%  robust {100 * float(r):.2f}%")
        lines.append(f"robust accuracy: {100 * float(self.robust_accuracy.mean()):.2f}%")
        return "\n".join(lines)

    def to_json(self) -> dict:
        """A JSON-ready dict (settings, per-member accuracies, the log, query totals)."""
        return {
            "version": self.version,
            "norm": self.norm,
            "eps": self.eps,
            "members": list(self.names),
            "clean_accuracy": [float(v) for v in self.clean_accuracy],
            "robust_accuracy": [float(v) for v in self.robust_accuracy],
            "queries_total": int(self.queries.sum()),
            "queries_per_sample_mean": float(self.queries.sum(axis=1).mean()),
            "stages": [
                {
                    "name": s.name,
                    "robust_accuracy": [float(v) for v in s.robust_accuracy],
                    "seconds": s.seconds,
                    "queries": s.queries,
                    "attacked": s.attacked,
                    "broken": s.broken,
                    "skipped": s.skipped,
                }
                for s in self.log
            ],
            "warnings": list(self.warnings),
        }


# -- members ------------------------------------------------------------------------------------


@functools.cache
def _indexed(apply: Callable) -> Callable:
    """Member ``m`` of a pool apply ``[M, B, C]``: ``f((params, m), x, *key) -> [B, C]`` (cached so
    the same ``apply`` gives the same function: compiled kernels are shared)."""

    def member(mp, x, *key):
        return apply(mp[0], x, *key)[mp[1]]

    return member


class _Members(NamedTuple):
    apply1: Callable  # one member: apply1(member_params, x [B, *S], *key) -> [B, C]
    params: Any  # member params with a member axis where ``axes`` says
    axes: Any  # vmap in_axes of params (hashable)
    m: int
    c: int


def _members(apply: Callable, params, x0: np.ndarray, *, stacked: bool, eot: int) -> _Members:
    k = (jax.random.PRNGKey(0),) if eot > 1 else ()
    if stacked:
        sizes = {int(np.shape(leaf)[0]) if np.ndim(leaf) else -1 for leaf in jax.tree.leaves(params)}
        if len(sizes) != 1 or -1 in sizes:
            raise ValueError(f"stacked=True: params leaves must share one leading member axis, got sizes {sizes}")
        m = sizes.pop()
        one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a)[1:], a.dtype), params)  # no eager slice
        shape = _shape(apply, one, x0, k, "apply(member_params, x)")
        if len(shape) != 2:
            raise ValueError(f"stacked=True: one member's apply must return logits [B, C], got shape {shape}")
        return _Members(apply, params, 0, m, int(shape[-1]))
    shape = _shape(apply, params, x0, k, "apply(params, x)")
    if len(shape) == 2:
        return _Members(apply, params, None, 1, int(shape[-1]))
    if len(shape) == 3:
        m = int(shape[0])
        return _Members(_indexed(apply), (params, jnp.arange(m)), (None, 0), m, int(shape[-1]))
    raise ValueError(f"apply must return logits [B, C] or [M, B, C], got shape {shape}")


def _shape(apply, params, x0, k, what):
    try:
        shape = jax.eval_shape(apply, params, x0, *k).shape
    except Exception as e:  # noqa: BLE001 - re-raised with what was expected
        first = (str(e).splitlines() or [""])[0]
        hint = " (version='rand' takes a stochastic apply(params, x, key))" if k else ""
        raise TypeError(f"{what} failed on x0 of shape {list(x0.shape)}{hint}: {type(e).__name__}: {first}") from e
    if len(shape) < 2 or shape[-2] != x0.shape[0]:
        raise ValueError(f"{what} must return logits [B, C] or [M, B, C] with B={x0.shape[0]}, got {shape}")
    return tuple(shape)


# -- compiled kernels ---------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=(0, 1))
def _run_apgd_like(attack, axes, params, x0, ref, mask, eps, cap, key, sid, x_init, has_init):
    """A fixed-budget state machine per member: leaves ``[M, B, ...]``."""

    def one(mp, r, mk, xi):
        return run(attack, mp, Problem(x0, r[:, None], mk[:, None], eps, cap, key, sid, xi, has_init))

    return jax.vmap(one, in_axes=(axes, 1, 1, 1))(params, ref, mask, x_init)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _run_minnorm(attack, axes, params, x0, ref, labels, mask, cap, key, sid, x_init, has_init, init_eps):
    """A minimum-norm state machine per member: leaves ``[M, B, 1, ...]``."""
    b = x0.shape[0]

    def one(mp, r, lab, mk, xi):
        base = Problem(x0, r[:, None], mk[:, None], jnp.full((b,), jnp.inf), cap, key, sid, xi, has_init)
        return run(attack, mp, MinNormProblem(base, lab[:, None], init_eps))

    return jax.vmap(one, in_axes=(axes, 1, None, 1, 1))(params, ref, labels, mask, x_init)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _logits(apply1, axes, eot, params, x, key):
    """``[eot, B, M, C]`` logits of member ``m`` at ``x[:, m]`` (``x [B, M, *S]``)."""

    def one(mp, xm):
        if eot == 1:
            return apply1(mp, xm)[None]
        return jax.lax.map(lambda d: apply1(mp, xm, jax.random.fold_in(key, d)), jnp.arange(eot))

    return jax.vmap(one, in_axes=(axes, 1), out_axes=2)(params, x)


def _wrong(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``[B, M]``: misclassified on more than half of the draws (``z [D, B, M, C]``)."""
    miss = np.argmax(z, axis=-1) != y[None, :, None]
    return miss.mean(axis=0) > 0.5


# -- the cascade --------------------------------------------------------------------------------


def stages_of(version: str, norm) -> tuple[str, ...]:
    """The attacks of a version, in AutoAttack's order (``set_version``)."""
    if version == "standard":
        return ("apgd-ce", "apgd-t", "fab-t", "square")
    if version == "plus":
        return ("apgd-ce", "apgd-dlr", "fab", "square", "apgd-t", "fab-t")
    if version == "rand":
        return ("apgd-ce", "apgd-dlr")
    raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")


class _Ctx(NamedTuple):
    mem: _Members
    p: float
    eps: float
    eot: int
    box: tuple
    n_iter: int
    fab_iter: int
    square_queries: int
    version: str
    square_rescale: bool = SQUARE_RESCALE


def _buckets(bs: int) -> list[int]:
    """Chunk sizes for ``batch_size = bs``: ``ceil(bs / 2^j)`` for ``j < N_BUCKETS``, none below
    ``min(bs, MIN_BUCKET)`` (ascending)."""
    lo = min(bs, MIN_BUCKET)
    return sorted({max(lo, -(-bs // 2**j)) for j in range(N_BUCKETS)})


CHUNK_CALL_ROWS = 16  # a chunk's fixed cost, in padded rows, when the tail is split (sarjax)
# A kernel's compilation at a chunk size it has not run at yet, in rows of one run (sarjax): on the
# 2-core CPU an APGD or FAB-T stage kernel of an MNIST CNN compiles in about the time it runs 300 to
# 500 rows (a forward-only _logits program: many thousand rows), so a first run pads its rows to a
# size already compiled unless the padding, over the stage's runs left, costs more.
NEW_SHAPE_ROWS = 256


def _cover(n: int, sizes) -> tuple[int, tuple[int, ...]]:
    """``(cost, chunk sizes)``: the cover of ``n`` rows by chunks of ``sizes`` with the fewest
    padded rows plus ``CHUNK_CALL_ROWS`` per chunk."""
    best: dict[int, tuple[int, tuple[int, ...]]] = {0: (0, ())}  # rows -> (cost, chunk sizes)
    for r in range(1, n + 1):
        best[r] = min((c + s + CHUNK_CALL_ROWS, plan + (s,)) for s in sizes for c, plan in [best[max(r - s, 0)]])
    return best[n]


def _tail_plan(n: int, sizes: list[int], *, compiled: set[int] | None = None, runs: int = 1) -> list[int]:
    """Chunk sizes (from ``sizes``, ascending) for the last ``n <= max(sizes)`` rows of a run:
    the cover with the fewest padded rows plus ``CHUNK_CALL_ROWS`` per chunk. 74 rows with
    buckets (32, 63, 125, 250) run as 63 + 32 (95 rows) rather than one chunk of 125: a Square
    stage scans every row of a chunk for 5,000 iterations, so padding costs as much as a row.

    ``compiled`` (the sizes the kernel already ran at in this call; None: every size is free):
    each size of the plan outside it costs ``NEW_SHAPE_ROWS`` once, against ``runs`` (the runs of
    the stage left, this one included) times the cover's cost: a cold run compiles fewer shapes.
    Which chunk holds a row does not change its result (its random streams come from its sample
    id), so the plan moves only the time."""
    if compiled is None:
        return sorted(_cover(n, sizes)[1], reverse=True)
    options = []
    for k in range(1, len(sizes) + 1):
        for allowed in itertools.combinations(sizes, k):
            cost, plan = _cover(n, allowed)
            options.append((runs * cost + NEW_SHAPE_ROWS * len(set(plan) - compiled), sorted(plan, reverse=True)))
    return min(options)[1]


def _square_tail(n: int, bs: int) -> list[int]:
    """Square's chunk for the last ``n <= bs`` rows: one chunk of ``n`` rounded up to a multiple of
    ``SQUARE_GRANULE`` (at most ``bs``). Square scans every row of a chunk at every one of its
    thousands of iterations, so each padded row costs as much as a real one (74 rows: 80, not
    63 + 32 = 95), while the chunk's fixed cost is a few rows; Square runs once per cascade, so
    the shape compiles once per call, as the two bucket shapes of :func:`_tail_plan` would."""
    return [min(bs, -(-n // SQUARE_GRANULE) * SQUARE_GRANULE)]


def _largereps(n_iter: int) -> list[tuple[float, int]]:
    """The l1 phases ``[(eps multiple, iterations)]`` of ``n_iter`` iterations in all.

    AutoAttack's split (``autopgd_base.py``, ``use_largereps``): ``ceil(0.3 n)``, ``ceil(0.3 n)``
    and the rest. For a few ``n`` (2, 4) the rest is 0, and the reference then returns the
    ``2 eps`` phase's point unprojected, outside the threat model; here the last phase (at
    ``eps``) always runs at least one iteration, taken from the largest earlier phase (for
    ``n_iter = 1`` only the ``eps`` phase runs). Phases with no iteration are dropped."""
    iters = [math.ceil(s * n_iter) for _, s in LARGEREPS[:-1]]
    iters.append(n_iter - sum(iters))
    while iters[-1] < 1:  # bound-true: the phase at eps itself must run
        j = max(range(len(iters) - 1), key=lambda k: iters[k])
        iters[j] -= 1
        iters[-1] += 1
    return [(f, i) for (f, _), i in zip(LARGEREPS, iters) if i > 0]


def _apgd_run(ctx: _Ctx, chunk, mask, key, loss, targets=None):
    """One APGD run (untargeted or toward ``targets [b, M]``): ``(x_cand [b, M, *S], q [b, M])``."""
    x0, y, sid = chunk
    b, m = mask.shape
    mem = ctx.mem
    ref = np.broadcast_to(np.asarray(y)[:, None], (b, m)) if targets is None else np.asarray(targets)
    phases = _largereps(ctx.n_iter) if ctx.p == 1.0 else [(1.0, ctx.n_iter)]
    cap = np.full((b,), np.iinfo(np.int32).max, np.int32)
    xi = np.broadcast_to(x0[:, None], (b, m, *x0.shape[1:]))
    has = np.asarray(False)
    q = np.zeros((b, m), np.int64)
    res = None
    for j, (f, it) in enumerate(phases):
        fn = make_apgd(
            mem.apply1,
            norm=norm_name(ctx.p),
            n_iter=it,
            loss=loss,
            targeted=targets is not None,
            eot=ctx.eot,
            audit=False,
        )
        eps = np.full((b,), f * ctx.eps, np.float32)
        res = _run_apgd_like(
            fn.attack, mem.axes, mem.params, x0, ref, np.asarray(mask, np.float32), eps, cap,
            jax.random.fold_in(key, j), sid, xi, has,
        )  # fmt: skip
        x_adv, best_x = np.asarray(res.x_adv), np.asarray(res.best_x)  # [M, b, *S]
        _audit(x0, best_x, ctx.p, f * ctx.eps, ctx.box, f"apgd phase {j} (best_x)")
        _audit(x0, x_adv, ctx.p, f * ctx.eps, ctx.box, f"apgd phase {j} (x_adv)")
        q += np.asarray(res.queries)[:, :, 0].T  # [M, b, 1]: each member's single-model attack
        xi, has = np.swapaxes(x_adv, 0, 1), np.asarray(True)  # next phase: the highest-loss point
    assert res is not None
    return np.swapaxes(np.asarray(res.best_x), 0, 1), q * mask


def _fab_run(ctx: _Ctx, chunk, mask, key, targets=None, x_init=None):
    """One FAB run (FAB-T toward ``targets [b, M]`` if given) as a fixed-eps attack."""
    x0, y, sid = chunk
    b, m = mask.shape
    mem = ctx.mem
    c = mem.c
    if targets is None:
        fn = make_fab(mem.apply1, norm=ctx.p, max_queries=1 + (c + 1) * ctx.fab_iter, audit=False)
        ref = np.broadcast_to(np.asarray(y)[:, None], (b, m))
    else:
        fn = make_fab(
            mem.apply1, norm=ctx.p, max_queries=1 + 3 * ctx.fab_iter, fab_t=True, targeted=True,
            success="untargeted", audit=False,
        )  # fmt: skip
        ref = np.asarray(targets)
    cap = np.full((b,), fn.T, np.int32)
    xi = np.broadcast_to(np.asarray(x0 if x_init is None else x_init)[:, None], (b, m, *x0.shape[1:]))
    res = _run_minnorm(
        fn.attack_for(c), mem.axes, mem.params, x0, ref, np.asarray(y, np.int32), np.asarray(mask, np.float32),
        cap, key, sid, xi, np.asarray(x_init is not None), np.zeros((b,), np.float32),
    )  # fmt: skip
    nrm = np.asarray(res.norm)[:, :, 0].T  # [b, M]
    x_adv = np.swapaxes(np.asarray(res.x_adv)[:, :, 0], 0, 1)  # [b, M, *S]
    ok = np.isfinite(nrm) & (nrm <= ctx.eps * (1 + 1e-6))
    x_cand = np.where(ok.reshape(b, m, *[1] * (x0.ndim - 1)), x_adv, np.asarray(x0)[:, None])
    return x_cand, np.asarray(res.queries)[:, :, 0].T.astype(np.int64) * mask


def _square_run(ctx: _Ctx, chunk, mask, key):
    x0, y, sid = chunk
    b, m = mask.shape
    mem = ctx.mem
    fn = make_square(
        mem.apply1, norm=norm_name(ctx.p), n_queries=ctx.square_queries, p_init=SQUARE_P_INIT, audit=False,
        rescale_schedule=ctx.square_rescale,
    )  # fmt: skip
    ref = np.broadcast_to(np.asarray(y)[:, None], (b, m))
    cap = np.full((b,), np.iinfo(np.int32).max, np.int32)
    xi = np.broadcast_to(x0[:, None], (b, m, *x0.shape[1:]))
    res = _run_apgd_like(
        fn.attack, mem.axes, mem.params, x0, ref, np.asarray(mask, np.float32), np.full((b,), ctx.eps, np.float32),
        cap, key, sid, xi, np.asarray(False),
    )  # fmt: skip
    return np.swapaxes(np.asarray(res.best_x), 0, 1), np.asarray(res.queries)[:, :, 0].T.astype(np.int64) * mask


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _fab_start(k, sid, x0, radius: float, p: float, box: tuple):
    """``[b, *S]`` FAB's random starts at ``radius`` around ``x0 [b, *S]``, sample ``b`` from its own
    stream ``fold_in(fold_in(k, 0x5EED), sid[b])`` (one compiled program, not one per eager op)."""
    keys = jax.vmap(lambda s: jax.random.fold_in(jax.random.fold_in(k, 0x5EED), s))(sid)
    return jax.vmap(lambda kk, a: G.random_in_ball(kk, a, radius, p, box))(keys, x0)


def _audit(x0, xs, p, eps, box, what):
    """Audits every member's points ``xs [M, b, *S]`` against the ORIGINAL ``x0 [b, *S]``."""
    x0 = np.asarray(x0)
    threat = Threat(p, np.full((x0.shape[0],), eps, np.float32), box)
    for k in range(xs.shape[0]):
        check(x0, np.asarray(xs[k]), threat, what=f"autoattack {what}, member {k}")


# -- resume (the state's file I/O is sarjax.runtime.run_state's) ---------------------------------

STATE_FORMAT = "sarjax-autoattack-state/1"
_POSITION = ("next_stage", "next_run")  # a state's place in the cascade: the next stage and run to do


def autoattack(
    apply: Callable,
    params,
    x,
    y,
    *,
    attack: AutoAttackConfig,
    key,
    settings: AutoAttackSettings | None = None,
    sample_ids=None,
    names=None,
    stacked: bool = False,
) -> AutoAttackResult:
    """AutoAttack on a single model or on every member of a pool, as a cascade (module docstring).

    Args:
      apply: ``apply(params, x [B, *S]) -> logits [B, C]`` (one model) or ``[M, B, C]`` (a pool
        apply: every member is attacked on its own, each evaluation keeps member ``m``'s logits,
        M times the work of ``stacked=True``); with ``stacked=True`` one member's apply
        ``apply(member_params, x) -> [B, C]`` vmapped over ``params`` stacked on a leading member
        axis (the fast path; :func:`autoattack_pool` uses it per stack). ``version="rand"``:
        the stochastic ``apply(params, x, key)``.
      params: the model's params.
      x: ``[B, *S]`` clean inputs in ``box`` (Square needs images ``[B, H, W, C]``).
      y: ``[B]`` int labels in ``[0, C)``.
      attack: what to attack with, an :class:`AutoAttackConfig` (:func:`autoattack_config`:
        norm, eps, version, stages, budgets, box; AutoAttack's defaults).
      key: PRNG key (required): run ``r`` of stage ``s`` uses ``fold_in(fold_in(key, s), r)``, and
        sample ``b`` draws from its own stream (``sample_ids[b]``) inside each attack.
      settings: how it runs, an :class:`AutoAttackSettings` (default ``AutoAttackSettings()``):

        * ``batch_size``: rows per compiled call (default ``min(B, 250)``, AutoAttack's ``bs``).
          Every run packs the rows still robust for some member into chunks of this size, the
          last one padded with all-zero masks (no queries) to the smallest bucket ``ceil(batch_size
          / 2^j)`` (``j < 4``, at least ``min(batch_size, 32)``) that holds it: a run costs
          ``ceil(still robust / batch_size)`` kernel calls of at most four shapes per attack. With
          a deterministic model a sample's result does not depend on its chunk (its draws come
          from its sample id); with EOT the building blocks draw the noise per batch, so results
          are equal in distribution only.
        * ``log``: print the AutoAttack-like log while running.
        * ``checks``: run :func:`sarjax.attacks.autoattack_checks.sanity_checks` on the first
          batch first (warnings).
        * ``progress``: optional ``progress(stage, done, total)``, called at the start of every
          stage that runs (``done = 0``; a stage resumed from a checkpoint starts at its saved
          ``done``) and after every chunk: ``total`` is the rows still robust for some member when
          the stage starts times its runs (restarts, targets), ``done`` the rows attacked so far
          plus, at the start of each later run, the rows it no longer needs (broken by an earlier
          run); ``done`` reaches ``total`` when the stage ends. It only observes: results are the
          same with or without it.
        * ``distribute``: spread every run's chunks over the processes of JAX's distributed
          runtime (:mod:`sarjax.runtime.distributed`): every process calls ``autoattack`` with the
          same arguments, runs its share of each run's chunks (chunk ``j`` of a run on process
          ``j mod P``), and the chunks' results are gathered after each run, so every process
          returns the whole result. Each chunk is the one-process chunk (same rows, same padded
          shape, same keys), so the result is bit-identical to one process on the same kind of
          device. With one process it changes nothing.
        * ``checkpoint_dir``: resume: after every completed run (after its gather when
          distributed) the cascade's state (robust flags, ``x_adv``, queries, the per-stage logs,
          the next run) is written to ``checkpoint_dir/call_0.npz`` atomically; a call that finds
          the file skips the runs it records and restores the state, so its result is
          bit-identical to an uninterrupted call (the keys depend on the stage, run and sample
          only). The caller checks that the file was written with the same settings
          (:func:`sarjax.experiments.autoattack.run_autoattack` fingerprints its directory); here
          only the batch size, members and stages are checked. Distributed, each process keeps its
          own folder and all resume at the same run. ``overwrite``: ignore the file and start
          afresh.
        * ``per_member`` is :func:`autoattack_pool`'s; ``out`` (``run_autoattack``'s) is refused.
      sample_ids: ``[B]`` each sample's index in the data set (default ``arange(B)``).
      names: member names for the log (default ``member0, ...`` or ``("model",)``).
      stacked: see ``apply``.

    Returns:
      An :class:`AutoAttackResult` (``robust [B, M]``, ``x_adv [B, M, *S]``, ``queries [B, M]``,
      the per-stage log).

    Raises:
      ValueError / TypeError: bad inputs (shapes, box, labels), a non-config ``attack``, bad ``settings``.
    """
    attack = _config(attack, "autoattack")
    settings = _settings(settings, "autoattack")
    if settings.out is not None:
        raise ValueError("autoattack: settings.out is written by run_autoattack only (autoattack writes nothing)")
    ckf = None if settings.checkpoint_dir is None else Path(settings.checkpoint_dir) / "call_0.npz"
    return _cascade(apply, params, x, y, attack, key, settings, sample_ids, names, stacked, ckf)


def _cascade(
    apply,
    params,
    x,
    y,
    cfg: AutoAttackConfig,
    key,
    settings: AutoAttackSettings,
    sample_ids,
    names,
    stacked: bool,
    checkpoint_file,
) -> AutoAttackResult:
    """:func:`autoattack`'s cascade; ``checkpoint_file``: this call's state file (or None)."""
    norm, eps, version, box = cfg.norm, cfg.eps, cfg.version, cfg.box
    n_iter, fab_iter, square_queries = cfg.n_iter, cfg.fab_iter, cfg.square_queries
    square_rescale_schedule = cfg.square_rescale_schedule
    batch_size, log, checks, progress = settings.batch_size, settings.log, settings.checks, settings.progress
    distribute = bool(settings.distribute)
    if key is None:
        raise TypeError("autoattack: key is required (a jax.random key); sarjax never defaults it")
    p = canonical_norm(norm)
    stages = cfg.stages
    x0 = np.asarray(x)
    if not np.issubdtype(x0.dtype, np.floating) or x0.ndim < 2:
        raise TypeError(f"x must be a float array [B, *S], got dtype {x0.dtype} shape {x0.shape}")
    x0 = x0.astype(np.float32)
    if x0.shape[0] == 0:
        raise ValueError("autoattack: empty batch: x has 0 samples")
    if not np.isfinite(x0).all() or x0.min() < box[0] or x0.max() > box[1]:
        raise ValueError(f"x must be finite and lie in the box {tuple(box)}, got range [{x0.min()}, {x0.max()}]")
    B = x0.shape[0]
    yh = np.asarray(y)
    if not np.issubdtype(yh.dtype, np.integer) or yh.shape != (B,):
        raise ValueError(f"y must be int labels of shape [{B}], got dtype {yh.dtype} shape {yh.shape}")
    eot = EOT_RAND if version == "rand" else 1
    mem = _members(apply, params, x0[: min(B, 2)], stacked=stacked, eot=eot)
    check_labels(yh, mem.c, name="labels")
    sid_all = np.arange(B) if sample_ids is None else np.asarray(sample_ids)
    if sid_all.shape != (B,) or not np.issubdtype(sid_all.dtype, np.integer) or (sid_all < 0).any():
        raise ValueError(f"sample_ids must be [{B}] non-negative ints, got shape {sid_all.shape}")
    if names is None:
        names = ("model",) if mem.m == 1 and not stacked else tuple(f"member{i}" for i in range(mem.m))
    names = tuple(names)
    if len(names) != mem.m:
        raise ValueError(f"names must have one entry per member ({mem.m}), got {len(names)}")
    bs = min(B, BATCH) if batch_size is None else int(batch_size)
    if bs < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    if not isinstance(distribute, bool):
        raise TypeError(f"distribute must be a bool, got {distribute!r}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a callable progress(stage, done, total) or None, got {progress!r}")
    share = (process_index(), process_count()) if distribute and process_count() > 1 else None
    want = {"batch_size": bs, "members": list(names), "stages": list(stages), "samples": B, "checks": checks}
    resumed = None
    if checkpoint_file is not None and not settings.overwrite:
        resumed = run_state.resume_state(checkpoint_file, fmt=STATE_FORMAT, want=want, position=_POSITION, share=share)

    found: list[str] = []
    if resumed is not None:
        found = list(resumed[1]["found"])
    elif checks:
        found = sanity_checks(
            apply, params, x0[:bs], yh[:bs], key=jax.random.fold_in(key, 0x5A11), version=version, stacked=stacked
        )
    say = print if log else (lambda *a, **k: None)
    say(f"using {version} version including {', '.join(stages)} ({norm_name(p)}, eps={eps:g}, {mem.m} member(s))")

    # Before every run (a restart, a target, an l1 phase schedule) the rows still robust for some
    # member are packed into chunks of bs rows (compaction: a sample's draws depend on its sample id
    # only, so the rows a chunk holds do not change its result); the last chunk is padded, by
    # repeating a row with an all-zero mask (no queries, results dropped), to a cover by a few
    # bucket sizes (bs, bs / 2, bs / 4, bs / 8: at most four compiled shapes per kernel), the
    # cheapest counting a size the kernel has not run at in this call as NEW_SHAPE_ROWS rows
    # (_tail_plan: a cold run compiles fewer shapes);
    # Square's last chunk is its rows rounded up to a multiple of SQUARE_GRANULE (_square_tail).
    xp, yp, sp = x0, yh.astype(np.int32), sid_all.astype(np.int32)
    ctx = _Ctx(
        mem, p, eps, eot, tuple(float(v) for v in box), n_iter, fab_iter, square_queries, version,
        square_rescale_schedule,
    )  # fmt: skip
    vkey = jax.random.fold_in(key, 0xC1EA)
    m = mem.m
    sizes = _buckets(bs)

    # the chunk sizes each kernel ran at in this call ("logits": the verification / ranking forward,
    # which runs at every chunk size of every stage): a tail prefers them (_tail_plan's compiled)
    ran_at: dict[str, set[int]] = {"logits": set()}

    def chunks_of(rows, square=False, mine=False, kernel="logits", runs=1):
        """The padded chunks of ``rows`` (``mine``: only this process's share when distributed)
        for ``kernel`` (a stage's name, or "logits"), with ``runs`` runs of the stage left."""
        full = len(rows) - len(rows) % bs
        n_tail = len(rows) - full
        seen = ran_at.setdefault(kernel, set()) | ({bs} if full else set())
        if not n_tail:
            tail = []
        elif square:
            tail = _square_tail(n_tail, bs)
        else:
            tail = _tail_plan(n_tail, sizes, compiled=seen, runs=runs)
        plan = [bs] * (full // bs) + tail
        ran_at[kernel].update(plan)
        ran_at["logits"].update(plan)
        c0 = 0
        for j, size in enumerate(plan):
            idx = rows[c0 : c0 + size]
            c0 += len(idx)
            if mine and share is not None and j % share[1] != share[0]:
                continue
            pad_idx = np.concatenate([idx, np.repeat(idx[:1], size - len(idx))])
            valid = np.arange(size) < len(idx)
            yield idx, pad_idx, valid, (xp[pad_idx], yp[pad_idx], sp[pad_idx])

    def verify(yc, xc):
        """``[b, M]`` wrong at ``xc [b, M, *S]`` (majority of the draws)."""
        z = np.asarray(_logits(mem.apply1, mem.axes, eot, mem.params, np.asarray(xc), vkey))
        return _wrong(z, yc)

    start = (0, 0)  # (stage, run) to start at
    if resumed is None:
        robust = np.zeros((B, m), bool)
        for idx, pad_idx, _, chunk in chunks_of(np.arange(B)):
            xc = np.broadcast_to(np.asarray(chunk[0])[:, None], (len(pad_idx), m, *xp.shape[1:]))
            robust[idx] = ~verify(chunk[1], xc)[: len(idx)]
        clean = robust.copy()
        x_adv = np.array(np.broadcast_to(xp[:, None], (B, m, *xp.shape[1:])))
        stage_q = [np.full((B, m), eot, np.int64)]
        stage_r = [robust.copy()]
        logs = []
    else:
        arr, info = resumed
        robust, clean, x_adv = arr["robust"], arr["clean"], arr["x_adv"]
        stage_q, stage_r = list(arr["stage_q"]), list(arr["stage_r"])
        logs = [StageLog(n, ra, *rest) for (n, *rest), ra in zip(info["logs"], arr["log_ra"])]
        start = (int(info["next_stage"]), int(info["next_run"]))
        say(f"resumed from {checkpoint_file}: {start[0]} stage(s) and {start[1]} run(s) of the next done")
    say(f"initial accuracy: {100 * clean[:B].mean():.2f}%")

    def save(next_stage: int, next_run: int, mid: dict | None = None) -> None:
        """The cascade's state after a completed run (``mid``: the stage's own counters)."""
        if checkpoint_file is None:
            return
        mid = mid or {}
        arrays = {
            "robust": robust, "clean": clean, "x_adv": x_adv, "stage_q": np.stack(stage_q),
            "stage_r": np.stack(stage_r), "log_ra": np.asarray([s.robust_accuracy for s in logs]).reshape(-1, m),
            **{k: v for k, v in mid.items() if isinstance(v, np.ndarray)},
        }  # fmt: skip
        info = {
            **want, "next_stage": next_stage, "next_run": next_run, "found": found,
            "logs": [[s.name, s.seconds, s.queries, s.attacked, s.broken, s.skipped] for s in logs],
            **{k: v for k, v in mid.items() if not isinstance(v, np.ndarray)},
        }  # fmt: skip
        run_state.save_state(checkpoint_file, arrays, info, fmt=STATE_FORMAT, keep_prev=share is not None)

    t_all = time.perf_counter()
    for s_idx, name in enumerate(stages):
        if s_idx < start[0]:
            continue
        first_run = start[1] if s_idx == start[0] else 0
        t0 = time.perf_counter()
        skip = ""
        if first_run:  # resumed inside this stage: its counters as saved
            assert resumed is not None
            arr, info = resumed
            q, before = arr["q"], arr["before"]
            ranked = arr["ranked"] if info["has_ranked"] else None
            attacked, n_stage, done, total = (int(info[k]) for k in ("attacked", "n_stage", "done", "total"))
            t0 -= float(info["seconds"])
            skey = jax.random.fold_in(key, s_idx + 1)
            runs = list(_runs(name, ctx, skey))
        else:
            q = np.zeros((B, m), np.int64)
            attacked = int(robust[:B].sum())
            skip = _skip_reason(name, ctx)
            skey = before = ranked = runs = None
            n_stage = total = done = 0
        if skip:
            warnings.warn(f"autoattack: stage {name} skipped: {skip}", AutoAttackWarning, stacklevel=2)
            logs.append(StageLog(name, robust[:B].mean(axis=0), 0.0, 0, attacked, 0, skip))
            stage_q.append(q)
            stage_r.append(robust.copy())
            say(f"{name}: skipped ({skip})")
            save(s_idx + 1, 0)
            continue
        if not first_run:
            skey = jax.random.fold_in(key, s_idx + 1)
            before = robust.copy()
            ranked = None
            if name in ("apgd-t", "fab-t"):  # targets ranked once, on the clean logits, for the rows robust now
                ranked = np.zeros((B, m, max(mem.c - 1, 1)), np.int32)
                for idx, _, _, chunk in chunks_of(np.flatnonzero(robust.any(axis=1))):
                    ranked[idx] = _ranked(ctx, chunk, jax.random.fold_in(skey, 0xA11))[: len(idx)]
                    q[idx] += eot * robust[idx]  # the ranking forward
            runs = list(_runs(name, ctx, skey))
            n_stage = int(robust.any(axis=1).sum())
            total, done = n_stage * len(runs), 0
        assert runs is not None and before is not None
        if progress is not None:
            progress(name, done, total)
        for r_idx, run_one in enumerate(runs):
            if r_idx < first_run:  # completed before the checkpoint
                continue
            rows = np.flatnonzero(robust.any(axis=1))
            if not rows.size:  # nothing left to attack: no kernel call
                break
            done += n_stage - rows.size  # rows an earlier run of the stage broke: nothing to do for them
            # a run's chunks hold disjoint rows and each chunk's result depends on its own rows only:
            # they can run in any order, on any process, and be applied after the run
            found_run = []
            error = None
            try:
                chunks = chunks_of(rows, square=name == "square", mine=True, kernel=name, runs=len(runs) - r_idx)
                for idx, pad_idx, valid, chunk in chunks:
                    n = len(idx)
                    mk = robust[pad_idx] & valid[:, None]
                    xc, qc = run_one(chunk, mk.astype(np.float32), None if ranked is None else ranked[pad_idx])
                    wrong = (verify(chunk[1], xc) & mk)[:n]
                    part = (idx, qc[:n].astype(np.int64) + eot * mk[:n], wrong, np.asarray(xc)[:n])
                    if share is None:  # one process: applied at once (as it always was)
                        _apply_chunk(part, q, x_adv, robust)
                    else:  # kept until the run's gather: the points of the broken pairs only
                        found_run.append((*part[:3], part[3][wrong]))
                    done += n
                    if progress is not None:
                        progress(name, done, total)
            except Exception as e:  # noqa: BLE001 - re-raised below, after the other processes know
                if share is None:
                    raise
                error = e
            if share is not None:
                done = _gather_run(found_run, error, q, x_adv, robust, done, m, xp.shape[1:])
                if progress is not None:
                    progress(name, done, total)
            if r_idx + 1 < len(runs):
                save(
                    s_idx, r_idx + 1,
                    {
                        "q": q, "before": before, "ranked": np.zeros(0, np.int32) if ranked is None else ranked,
                        "has_ranked": ranked is not None, "attacked": attacked, "n_stage": n_stage, "done": done,
                        "total": total, "seconds": time.perf_counter() - t0,
                    },
                )  # fmt: skip
        if progress is not None and done < total:  # the stage broke every row before its last run
            progress(name, total, total)
        _audit(xp[:B], np.swapaxes(x_adv[:B], 0, 1), p, eps, ctx.box, f"after {name} (x_adv)")
        dt = time.perf_counter() - t0
        logs.append(
            StageLog(name, robust[:B].mean(axis=0), dt, int(q[:B].sum()), attacked, int((before & ~robust)[:B].sum()))
        )
        stage_q.append(q)
        stage_r.append(robust.copy())
        save(s_idx + 1, 0)
        say(
            f"robust accuracy after {name.upper()}: {100 * robust[:B].mean():.2f}% "
            f"(total time {time.perf_counter() - t_all:.1f} s, {int(q[:B].sum())} queries)"
        )
    ra = {s.name: float(s.robust_accuracy.mean()) for s in logs if not s.skipped}
    if "square" in ra and len(ra) > 1:
        white = min(v for k, v in ra.items() if k != "square")
        if ra["square"] < white - SQUARE_GAIN:
            msg = (
                f"Square decreased the robust accuracy by {100 * (white - ra['square']):.2f} points below the "
                "white-box attacks': the gradient-based evaluation may be unreliable (gradient masking); run "
                "Square with more queries and restarts, or an adaptive attack"
            )
            found.append(msg)
            warnings.warn(msg, AutoAttackWarning, stacklevel=2)
    _audit(xp[:B], np.swapaxes(x_adv[:B], 0, 1), p, eps, ctx.box, "final (x_adv)")
    res = AutoAttackResult(
        x_adv[:B],
        robust[:B],
        clean[:B],
        np.sum(stage_q, axis=0)[:B],
        np.stack(stage_q)[:, :B],
        np.stack(stage_r)[:, :B],
        tuple(logs),
        version,
        norm_name(p),
        eps,
        names,
        tuple(found),
    )
    if log:
        d = np.abs((x_adv[:B] - xp[:B, None]).reshape(B * m, -1))
        real = d.max(1) if p == math.inf else (np.sqrt((d**2).sum(1)) if p == 2.0 else d.sum(1))
        say(f"max {norm_name(p)} perturbation: {real.max(initial=0.0):.5f}, nan in x_adv: {int(np.isnan(x_adv).sum())}")
        for nm, c, r in zip(names, res.clean_accuracy, res.robust_accuracy):
            say(f"  {nm}: clean {100 * c:.2f}%  robust {100 * r:.2f}%")
        say(f"robust accuracy: {100 * float(res.robust_accuracy.mean()):.2f}%")
    return res


def _skip_reason(name: str, ctx: _Ctx) -> str:
    c = ctx.mem.c
    if name == "apgd-dlr" and c < 3:
        return f"the DLR loss needs >= 3 classes, the model has {c}"
    if name == "apgd-t" and c < 4:
        return f"the targeted DLR loss needs >= 4 classes, the model has {c}"
    if ctx.eot > 1 and name in ("fab", "fab-t", "square"):
        return "FAB and Square take no EOT (AutoAttack's rand version runs APGD-CE and APGD-DLR only)"
    return ""


def _ranked(ctx: _Ctx, chunk, key) -> np.ndarray:
    """``[b, M, C - 1]`` the other classes by clean logit (EOT: mean over the draws), per member (one forward
    per pair and draw)."""
    x0, y, _ = chunk
    b = x0.shape[0]
    mem = ctx.mem
    xb = np.broadcast_to(x0[:, None], (b, mem.m, *x0.shape[1:]))
    z = np.asarray(_logits(mem.apply1, mem.axes, ctx.eot, mem.params, xb, key)).mean(axis=0)  # [b, M, C]
    z = np.where(np.arange(mem.c)[None, None] == y[:, None, None], -np.inf, z)
    return np.argsort(-z, axis=-1, kind="stable")[..., : mem.c - 1].astype(np.int32)


def _runs(name: str, ctx: _Ctx, skey):
    """The runs of one stage, in AutoAttack's order (restarts, then targets): each a function
    ``run(chunk, mask [b, M], ranked [b, M, C - 1] or None) -> (x_cand [b, M, *S], queries [b, M])``
    applied to the chunks of the rows still robust before it."""
    l1 = ctx.p == 1.0
    plus = ctx.version == "plus"
    if name in ("apgd-ce", "apgd-dlr"):
        loss = name.split("-")[1]
        n = RESTARTS_L1 if (l1 and ctx.version == "standard") else (RESTARTS_PLUS if plus else 1)
        for r in range(n):
            yield lambda chunk, mask, _, r=r: _apgd_run(ctx, chunk, mask, jax.random.fold_in(skey, r), loss)
    elif name in ("apgd-t", "fab-t"):
        n = min(N_TARGETS_L1 if (l1 and name == "apgd-t") else N_TARGETS, ctx.mem.c - 1)
        for t in range(n):
            k = jax.random.fold_in(skey, t)
            if name == "apgd-t":
                yield lambda chunk, mask, ranked, k=k, t=t: _apgd_run(
                    ctx, chunk, mask, k, "dlr", targets=ranked[..., t]
                )
            else:
                yield lambda chunk, mask, ranked, k=k, t=t: _fab_run(ctx, chunk, mask, k, targets=ranked[..., t])
    elif name == "fab":
        n = RESTARTS_PLUS if plus else 1
        for r in range(n):
            yield functools.partial(_fab_restart, ctx, jax.random.fold_in(skey, r), r)
    elif name == "square":
        yield lambda chunk, mask, _: _square_run(ctx, chunk, mask, skey)


def _apply_chunk(found, q, x_adv, robust) -> None:
    """Applies one chunk's result ``(rows [n], queries [n, M], wrong [n, M], x_cand [n, M, *S])``:
    its queries, the points of the pairs it broke, the robust flags."""
    idx, qadd, wrong, xc = found
    q[idx] += qadd
    upd = x_adv[idx]
    upd[wrong] = xc[wrong]
    x_adv[idx] = upd
    robust[idx] = robust[idx] & ~wrong


def _gather_run(found, error, q, x_adv, robust, done: int, m: int, shape: tuple) -> int:
    """``distribute=True``: every process's chunks of one run (``found``: ``(rows, queries, wrong,
    x_cand[wrong])`` per chunk), gathered in process order and applied on every process (the rows,
    their queries and broken flags, and the points of the broken pairs only). Returns ``done``
    plus the other processes' rows. Raises on every process when one of them failed (its own
    error there, a one-line error naming it elsewhere)."""
    if not all_ok(error is None):
        if error is not None:
            raise error
        raise RuntimeError("autoattack (distribute=True): another process failed during this run (see its log)")
    idx = np.concatenate([f[0] for f in found]).astype(np.int64) if found else np.zeros(0, np.int64)
    qadd = np.concatenate([f[1] for f in found]) if found else np.zeros((0, m), np.int64)
    wrong = np.concatenate([f[2] for f in found]) if found else np.zeros((0, m), bool)
    xw = np.concatenate([f[3] for f in found]) if found else np.zeros((0, *shape), np.float32)  # row-major pairs
    rows = allgather_rows({"idx": idx, "queries": qadd, "wrong": wrong})
    r, k = np.nonzero(wrong)  # row-major, as the chunks' x_cand[wrong]
    pairs = allgather_rows({"row": idx[r], "member": k.astype(np.int64), "x": xw.astype(np.float32)})
    mine = len(idx)
    q[rows["idx"]] += rows["queries"]
    robust[rows["idx"]] &= ~rows["wrong"]
    x_adv[pairs["row"], pairs["member"]] = pairs["x"]
    return done + len(rows["idx"]) - mine


def _fab_restart(ctx: _Ctx, k, r: int, chunk, mask, _ranked=None):
    """FAB (untargeted) restart ``r``: restarts > 0 start at a random point of radius eps / 2 (AutoAttack)."""
    x0, _, sid = chunk
    xi = None
    if r > 0:
        xi = np.asarray(_fab_start(k, sid.astype(np.uint32), x0, FAB_RAND_RADIUS * ctx.eps, ctx.p, ctx.box))
    return _fab_run(ctx, chunk, mask, k, x_init=xi)


def autoattack_pool(
    pool,
    x,
    y,
    *,
    attack: AutoAttackConfig,
    key,
    settings: AutoAttackSettings | None = None,
    sample_ids=None,
    wrap: Callable | None = None,
    stochastic: dict[str, Callable] | None = None,
) -> AutoAttackResult:
    """:func:`autoattack` on every member of a :class:`sarjax.models.pool.Pool`, each attacked on
    its own: one call per stack (``stacked=True``, members vmapped), results concatenated in member
    order.

    Args:
      pool: the pool.
      x, y, attack, key, sample_ids: as :func:`autoattack` (stack ``i`` uses ``fold_in(key, i)``).
      settings: as :func:`autoattack` (an :class:`AutoAttackSettings`; default
        ``AutoAttackSettings()``), and:

        * ``per_member``: run every member on its own (one cascade per member, the stack's key;
          the compiled kernels are shared within a stack). The vmapped call packs the images still
          robust for ANY member of the stack, so a member broken early keeps paying for the robust
          members' later stages (Square's 5,000 queries); one call per member attacks only its own
          robust images. Results are identical (a member's draws do not depend on the other
          members); pick per member for pools whose members differ in robustness (a defense zoo),
          vmapped for members alike.
        * ``checkpoint_dir``: resume: the state of the ``j``-th cascade call (per stack, or per
          member) goes to ``checkpoint_dir/call_<j>.npz``; a finished call is restored whole, an
          interrupted one resumes at its next run.
        * ``progress`` is called by each cascade call in turn (one per stack, or per member with
          ``per_member`` / ``stochastic``): a call's stage starts with ``done = 0``.
      wrap: optional ``wrap(member_apply) -> apply``: the deployed model of each stack, e.g.
        ``lambda a: with_input_noise(a, 0.3)`` for a randomized defense (``version="rand"`` needs
        a stochastic ``apply(params, x, key)``: a Pool alone is deterministic).
      stochastic: ``version="rand"`` only, instead of ``wrap``: ``{member name: apply(member_params,
        x, key) -> [B, C]}``, the deployed (randomized) form of each named member, e.g. a
        :class:`~sarjax.defenses.self_ensemble.SelfEnsembleStack`'s ``member_stochastic_apply`` or
        ``with_input_noise(stack.member_apply, sigma)``. Only these members are attacked (each in
        its own call, the stack's key); the others, deterministic, are left out of the result
        (run ``version="standard"`` on them).

    Returns:
      One :class:`AutoAttackResult` over all members (the per-stage log's robust accuracies
      and query totals concatenated / summed over the stacks).

    Raises:
      ValueError: ``version="rand"`` with neither ``wrap`` nor ``stochastic``; ``stochastic`` with
        another version, with ``wrap``, empty, or naming a member the pool lacks.
      TypeError: a ``stochastic`` value not callable; a non-config ``attack``, bad ``settings``.
    """
    attack = _config(attack, "autoattack_pool")
    settings = _settings(settings, "autoattack_pool")
    if settings.out is not None:
        raise ValueError(
            "autoattack_pool: settings.out is written by run_autoattack only (autoattack_pool writes nothing)"
        )
    version, per_member, checkpoint_dir = attack.version, settings.per_member, settings.checkpoint_dir
    if stochastic is not None:
        if version != "rand":
            raise ValueError(f"stochastic= gives randomized members: it needs version='rand', got {version!r}")
        if wrap is not None:
            raise ValueError("give wrap= (every stack) or stochastic= (named members), not both")
        if not isinstance(stochastic, dict) or not stochastic:
            raise ValueError(
                f"stochastic must be a non-empty dict {{member name: apply(params, x, key)}}, got {stochastic!r}"
            )
        unknown = [n for n in stochastic if n not in pool.names]
        if unknown:
            raise ValueError(f"stochastic names members {unknown} that the pool lacks (members: {list(pool.names)})")
        bad = [n for n, f in stochastic.items() if not callable(f)]
        if bad:
            raise TypeError(
                f"stochastic[{bad[0]!r}] must be a callable apply(params, x, key), got {stochastic[bad[0]]!r}"
            )
    elif version == "rand" and wrap is None:
        raise ValueError(
            "autoattack_pool: a Pool is deterministic; version='rand' needs wrap= giving a stochastic "
            "apply(params, x, key) (e.g. lambda a: with_input_noise(a, sigma)) or stochastic= naming the "
            "randomized members' applies"
        )
    outs = []
    for i, stack in enumerate(pool.stacks):
        apply = stack.member_apply if wrap is None else wrap(stack.member_apply)
        parts = [(stack.params, tuple(stack.names), apply)]
        if stochastic is not None:
            parts = [
                (jax.tree.map(lambda a, j=j: a[j : j + 1], stack.params), (nm,), stochastic[nm])
                for j, nm in enumerate(stack.names)
                if nm in stochastic
            ]
        elif per_member and len(stack.names) > 1:
            parts = [
                (jax.tree.map(lambda a, j=j: a[j : j + 1], stack.params), (nm,), apply)
                for j, nm in enumerate(stack.names)
            ]
        for params, names, member_apply in parts:
            ckf = None if checkpoint_dir is None else Path(checkpoint_dir) / f"call_{len(outs)}.npz"
            outs.append(
                _cascade(
                    member_apply, params, x, y, attack, jax.random.fold_in(key, i), settings, sample_ids, names,
                    True, ckf,
                )
            )  # fmt: skip
    if len(outs) == 1:
        return outs[0]
    logs = tuple(
        StageLog(
            ls[0].name,
            np.concatenate([s.robust_accuracy for s in ls]),
            float(sum(s.seconds for s in ls)),
            int(sum(s.queries for s in ls)),
            int(sum(s.attacked for s in ls)),
            int(sum(s.broken for s in ls)),
            ls[0].skipped,
        )
        for ls in zip(*(o.log for o in outs))
    )
    cat = functools.partial(np.concatenate, axis=1)
    first = outs[0]
    return AutoAttackResult(
        cat([o.x_adv for o in outs]),
        cat([o.robust for o in outs]),
        cat([o.clean for o in outs]),
        cat([o.queries for o in outs]),
        np.concatenate([o.stage_queries for o in outs], axis=2),
        np.concatenate([o.stage_robust for o in outs], axis=2),
        logs,
        first.version,
        first.norm,
        first.eps,
        tuple(n for o in outs for n in o.names),
        tuple(w for o in outs for w in o.warnings),
    )


def _same_leaves(a, b) -> bool:
    """Whether pytrees ``a`` and ``b`` have one structure and the very same leaf objects (by
    identity: no array is read or compared; equal values in other arrays are other params)."""
    if a is b:
        return True
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    return ta == tb and all(x is y for x, y in zip(la, lb, strict=True))


class AutoAttack(HostDrivenEntry):
    """AutoAttack with the one call shape of every sarjax attack (build with
    :func:`make_autoattack`).

    Call: ``fn(params, x, y, *, key, mask=None, max_queries=None, sample_ids=None) ->
    AutoAttackResult`` (``x_adv [B, M, *S]``, ``success [B, M]``, ``queries [B, M]``, ``robust``,
    the per-stage log). The cascade is host-driven (each stage packs the rows still robust), so
    there is no jit-safe entry: ``fn.jit`` raises ``TypeError``. AutoAttack evaluates every member
    on every image with its own fixed budgets, so ``mask`` and ``max_queries`` must be None.

    Attributes:
      model: the apply or the :class:`~sarjax.models.pool.Pool` it attacks.
      config: the :class:`AutoAttackConfig` (norm, eps, version, budgets).
      settings: the :class:`AutoAttackSettings` it runs with.
    """

    host_reason = "the cascade runs on the host, stage by stage"

    def __init__(self, model, config: AutoAttackConfig, settings: AutoAttackSettings):
        self.model = model
        self.config = _config(config, "make_autoattack")
        self.settings = _settings(settings, "make_autoattack")
        self.norm = config.norm
        self.eps = config.eps
        self.version = config.version
        self.name = "autoattack"
        self.__name__ = self.name
        self.apply = None if hasattr(model, "stacks") else model

    def __call__(self, params, x0, ref, *, key, mask=None, max_queries=None, sample_ids=None):
        """Runs the cascade (validated inputs, every returned point audited against ``x0``)."""
        if key is None:
            raise TypeError("autoattack: key is required (a jax.random key); sarjax never defaults it")
        if mask is not None or max_queries is not None:
            raise ValueError(
                "autoattack: every member is attacked on every image with AutoAttack's own budgets; "
                f"mask and max_queries must be None, got mask={mask is not None}, max_queries={max_queries!r}"
            )
        if self.apply is None:  # a Pool: its own params
            if params is not None and not _same_leaves(params, self.model.params):
                raise ValueError("autoattack on a Pool: pass the pool's own params (pool.params) or None")
            return autoattack_pool(
                self.model, x0, ref, attack=self.config, key=key, settings=self.settings, sample_ids=sample_ids
            )
        return autoattack(
            self.apply, params, x0, ref, attack=self.config, key=key, settings=self.settings, sample_ids=sample_ids
        )

    def __repr__(self) -> str:
        return f"AutoAttack({self.version}, {self.norm}, eps={self.eps:g})"


def make_autoattack(
    model,
    *,
    norm,
    eps: float,
    version: str = "standard",
    attacks: Any = None,
    n_iter: int = N_ITER,
    fab_iter: int = N_ITER,
    square_queries: int = SQUARE_QUERIES,
    square_rescale_schedule: bool = SQUARE_RESCALE,
    settings: AutoAttackSettings | None = None,
) -> AutoAttack:
    """AutoAttack (Croce & Hein, ICML 2020) as an attack entry: ``fn(params, x, y, *, key, ...)``.

    Args:
      model: ``apply(params, x) -> logits`` (one model ``[B, C]`` or a pool apply ``[M, B, C]``),
        or a :class:`sarjax.models.pool.Pool` (:func:`autoattack_pool`: stack by stack; call it
        with ``pool.params`` or None).
      norm: ``"linf"``, ``"l2"`` or ``"l1"``.
      eps: the radius (a float > 0).
      version: ``"standard"`` (default, AutoAttack's), ``"plus"`` or ``"rand"``.
      attacks, n_iter, fab_iter, square_queries, square_rescale_schedule: the attack's
        hyperparameters, AutoAttack's defaults (:func:`autoattack_config`).
      settings: how the cascade runs (:class:`AutoAttackSettings`: ``batch_size``, ``log``,
        ``checks``, ``per_member``, ...; default ``AutoAttackSettings()``).

    Returns:
      An :class:`AutoAttack` entry.

    Raises:
      ValueError, TypeError: bad hyperparameters (:class:`AutoAttackConfig`) or ``settings``,
        checked here, when the entry is built.
    """
    config = autoattack_config(
        norm, eps, version, attacks=attacks, n_iter=n_iter, fab_iter=fab_iter, square_queries=square_queries,
        square_rescale_schedule=square_rescale_schedule,
    )  # fmt: skip
    return AutoAttack(model, config, _settings(settings, "make_autoattack"))


__all__ = [
    "ATTACKS",
    "AutoAttack",
    "AutoAttackConfig",
    "AutoAttackResult",
    "AutoAttackSettings",
    "StageLog",
    "autoattack",
    "autoattack_config",
    "autoattack_pool",
    "make_autoattack",
    "stages_of",
]
