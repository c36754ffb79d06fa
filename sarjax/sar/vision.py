"""SAR of an image-classifier pool: the greedy driven by joint PGD.

Adapter between :class:`sarjax.models.pool.Pool` plus the attacks module's
joint PGD (the SAR paper, Table 1) and the host-side greedy. The oracles below
call one compiled attack kernel for every round and for the fallback: the
uncovered set is a ``[B, M]`` mask, the round enters the PRNG key as data.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks.core.validate import check_sample_ids
from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
from sarjax.attacks.threat import check_labels
from sarjax.cover.metrics import coverage_target
from sarjax.cover.result import SARResult, concat_results
from sarjax.cover.types import Candidates, JointAttack, SingleAttack
from sarjax.models.sharding import ShardedPool
from sarjax.runtime import fingerprint as fingerprints
from sarjax.sar.driver import ResumableRun
from sarjax.sar.settings import PACK_LEVELS, PACK_MIN_ROWS, SARSettings

_JOINT_STREAM = 0
_SINGLE_STREAM = 1
_POOL_API = ("apply", "params", "num_members", "num_classes", "input_shape", "predict", "check_input")


def pack_sizes(batch: int, levels: int, min_rows: int = 1) -> tuple[int, ...]:
    """The batch sizes a packed oracle calls its attack with: ``ceil(batch / 2**k)``, ``k = 0..levels``,
    those of at least ``min_rows`` rows (and ``batch`` itself always).

    Args:
        batch: ``B``, the rows of the oracle (a ``run_sar`` chunk).
        levels: halvings (0: the whole batch only, no packing).
        min_rows: the smallest packed size kept (each size is one compiled program).

    Returns:
        The distinct sizes, increasing (at most ``levels + 1`` compiled shapes).
    """
    return tuple(sorted({z for z in (-(-batch // 2**k) for k in range(levels + 1)) if z >= min(min_rows, batch)}))


class StackGate:
    """A pool's ``apply`` whose stacks pass the input gradient only when switched on.

    ``gate.apply((pool.params, on), x)`` returns ``pool.apply(pool.params, x)`` (the same logits,
    computed the same way); ``on`` is a ``[S]`` bool array, one switch per stack. A stack that is
    off runs its forward pass on ``lax.stop_gradient(x)`` inside a ``lax.cond``, so a gradient in
    ``x`` skips its backward pass at run time without a new compiled shape. The SAR oracles switch
    on the stacks that hold a member some row of the call attacks (:meth:`switches`): the members
    of the other stacks have a zero weight in every row's loss, so their backward pass only adds
    exact zeros to the gradient, and skipping it leaves every result unchanged.

    It keeps ``prepare_apply`` (:func:`sarjax.attacks.core.evaluate.prepare`) and one instance per
    pool (:meth:`of`), so attacks built on ``gate.apply`` share one compiled kernel per pool.

    Args:
        pool: a :class:`sarjax.models.pool.Pool`.
    """

    _instances: Any = None  # weakref.WeakKeyDictionary: pool -> its gate

    def __init__(self, pool: Any):
        self.pool = pool
        self.slices = tuple(pool.member_slices)

    @classmethod
    def of(cls, pool: Any) -> StackGate:
        """The gate of ``pool`` (one per pool object, so that kernels built on it are reused)."""
        if cls._instances is None:
            cls._instances = weakref.WeakKeyDictionary()
        gate = cls._instances.get(pool)
        if gate is None:
            gate = cls._instances[pool] = cls(pool)
        return gate

    def switches(self, mask: np.ndarray) -> np.ndarray:
        """``[S]`` bool: the stacks holding a member that some row of ``mask`` (``[n, M]``) selects."""
        m = np.asarray(mask).astype(bool)
        return np.array([m[:, sl].any() for sl in self.slices], dtype=bool)

    def params(self, mask: np.ndarray) -> tuple[Any, jax.Array]:
        """The params of :meth:`apply` for a call whose rows select ``mask`` (``[n, M]``)."""
        return self.pool.params, jnp.asarray(self.switches(mask))

    def apply(self, params: Any, x: jax.Array) -> jax.Array:
        """``[M, B, C]`` logits; ``params = (pool.params, on [S] bool)``."""
        p, on = params
        return self.apply_prepared((self.pool.prepare_apply(p)[1], on), x)

    def prepare_apply(self, params: Any) -> tuple[Callable, Any]:
        """``(fn, prepared)`` with ``fn(prepared, x) == self.apply(params, x)`` (the pool's layouts, once)."""
        p, on = params
        return self.apply_prepared, (self.pool.prepare_apply(p)[1], on)

    def apply_prepared(self, prepared: Any, x: jax.Array) -> jax.Array:
        """:meth:`apply` on the output of :meth:`prepare_apply`."""
        prep, on = prepared
        outs = []
        for i, (stack, q) in enumerate(zip(self.pool.stacks, prep)):

            def fwd(z, stack=stack, q=q):
                return stack.apply_prepared(q, z)

            def fwd_no_grad(z, fwd=fwd):
                return fwd(jax.lax.stop_gradient(z))

            outs.append(jax.lax.cond(on[i], fwd, fwd_no_grad, x))
        return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=0)


class Packing(NamedTuple):
    """How :func:`make_attack_oracles` packs the rows of a call (``SARSettings.pack_levels`` and
    ``pack_min_rows`` in :func:`run_sar`).

    Attributes:
      levels: 0: no packing (every call attacks all ``B`` rows); ``k > 0``: the rows with some
        selected member are packed into the smallest of :func:`pack_sizes` ``(B, k, min_rows)``.
      min_rows: the smallest packed batch size (1: down to single rows).
    """

    levels: int = 0
    min_rows: int = 1


NO_PACKING = Packing()


def make_attack_oracles(
    attack: Callable,
    params: Any,
    x0: Any,
    ref: Any,
    key: jax.Array,
    *,
    eps: Any = None,
    use_best: bool = False,
    sample_ids: Any = None,
    packing: Packing = NO_PACKING,
    call_params: Callable[[np.ndarray], Any] | None = None,
) -> tuple[JointAttack, SingleAttack]:
    """Joint and single-member oracles from a mask-driven attack.

    Args:
        attack: ``attack(params, x0, ref, *, key, mask [B, M], eps[, sample_ids]) ->
            AttackResult`` with ``x_adv``, ``success [B, M]`` (every member),
            ``member_loss [B, M]``, ``queries [B]``, ``best_x``,
            ``best_success``: e.g. ``sarjax.attacks.joint.make_joint_pgd(pool.apply)``.
        params: the pool's params (``pool.params``), passed through untouched.
        x0: ``[B, *S]`` clean inputs.
        ref: ``[B, M]`` int, each member's reference label (its own clean
            prediction, or the true label); ``success`` means the member's
            prediction differs from it.
        key: PRNG key. Round ``r`` of the joint attack uses
            ``fold_in(fold_in(key, 0), r)``, the fallback
            ``fold_in(fold_in(key, 1), r)``; inside the attack, sample ``b``
            draws from that key folded with ``sample_ids[b]``.
        eps: attack radius (scalar or ``[B]``), or None for the attack's default.
        use_best: take the attack's best-so-far point (ranked by the number of
            selected members fooled) instead of its final point. Default False:
            Table 1 of the SAR paper returns the restart with the highest
            objective. The fallback objective is the per-member loss at the
            final point either way.
        sample_ids: optional ``[B]`` int, each row's index in the data set,
            passed to ``attack`` (which must then accept ``sample_ids=``) so
            that a sample's random stream does not depend on the batch it is
            attacked in; None: the attack's default (its position, ``arange(B)``).
        packing: a :class:`Packing` ``(levels, min_rows)``. ``levels`` 0 (default,
            :data:`NO_PACKING`): every call attacks all ``B`` rows (rows with
            nothing selected are masked). ``k > 0``: each call attacks only the
            rows with some selected member, packed into the smallest of the
            batch sizes :func:`pack_sizes` ``(B, k)`` that holds them (padding
            rows repeat a packed row with nothing selected), and the unattacked
            rows come back as ``x0``, nothing covered, 0 queries, objective 0.
            The attack is then always called with ``sample_ids=`` (``arange(B)``
            when None), and each row's result must depend only on that row and
            its id (as :func:`run_sar` requires of any attack): the results of
            the attacked rows are those of the unpacked call.
        call_params: optional ``call_params(mask [n, M] bool) -> params`` for
            each call (e.g. :meth:`StackGate.params`); default ``params``.
            ``min_rows``: the smallest packed batch size (``pack_sizes(B, levels, min_rows)``).

    Returns:
        ``(joint, single)`` callables for :func:`sarjax.cover.greedy_sar`.

    Raises:
        ValueError: ``packing.levels`` not an int ``>= 0``, ``packing.min_rows`` not an int ``>= 1``.
        TypeError: ``packing`` not a :class:`Packing`.
    """
    if not isinstance(packing, Packing):
        raise TypeError(f"packing must be a Packing(levels, min_rows), got {type(packing).__name__}")
    pack_levels, pack_min_rows = packing
    if isinstance(pack_levels, bool) or not isinstance(pack_levels, (int, np.integer)) or pack_levels < 0:
        raise ValueError(f"packing.levels must be an int >= 0, got {pack_levels!r}")
    if isinstance(pack_min_rows, bool) or not isinstance(pack_min_rows, (int, np.integer)) or pack_min_rows < 1:
        raise ValueError(f"packing.min_rows must be an int >= 1, got {pack_min_rows!r}")
    x0_host = np.asarray(x0)
    x0 = jnp.asarray(x0)
    ref_host = np.asarray(ref, np.int32)
    ref = jnp.asarray(ref_host)
    b, m = ref.shape
    joint_key = jax.random.fold_in(key, _JOINT_STREAM)
    single_key = jax.random.fold_in(key, _SINGLE_STREAM)
    sizes = pack_sizes(b, int(pack_levels), int(pack_min_rows))
    if pack_levels and sample_ids is None:
        sample_ids = np.arange(b)  # a packed row keeps its position's stream
    id_host = None if sample_ids is None else np.asarray(sample_ids)
    eps_host = None if eps is None or np.ndim(eps) == 0 else np.asarray(eps)

    def _candidates(res: Any) -> Candidates:
        x = res.best_x if use_best else res.x_adv
        covered = res.best_success if use_best else res.success
        return Candidates(
            np.asarray(x),
            np.asarray(covered, dtype=bool),
            _per_sample(np.asarray(res.queries).astype(np.int64)),
            np.asarray(res.member_loss, dtype=np.float64),
        )

    def _per_sample(q: np.ndarray) -> np.ndarray:
        return q.sum(axis=-1) if q.ndim == 2 else q  # queries [B, M] per member -> the sample's total

    def _call(mask: np.ndarray, k: jax.Array) -> Candidates:
        cp = params if call_params is None else call_params(mask)
        rows = np.flatnonzero(mask.any(axis=1))
        n = rows.size
        size = next((z for z in sizes if z >= n), b)
        if size == b:  # the whole batch (the unpacked call)
            ids = {} if id_host is None else {"sample_ids": id_host}
            return _candidates(attack(cp, x0, ref, key=k, mask=jnp.asarray(mask, jnp.float32), eps=eps, **ids))
        x_out = x0_host.copy()
        covered = np.zeros((b, m), bool)
        queries = np.zeros(b, np.int64)
        objective = np.zeros((b, m))
        if n == 0:
            return Candidates(x_out, covered, queries, objective)
        idx = np.concatenate([rows, np.full(size - n, rows[0])])
        sub = mask[idx]
        sub[n:] = False  # padding rows: nothing selected, never attacked
        e = eps if eps_host is None else eps_host[idx]
        assert id_host is not None  # packing always passes ids
        res = _candidates(
            attack(
                cp,
                jnp.asarray(x0_host[idx]),
                jnp.asarray(ref_host[idx]),
                key=k,
                mask=jnp.asarray(sub, jnp.float32),
                eps=e,
                sample_ids=id_host[idx],
            )
        )
        x_out[rows] = res.x_adv[:n]
        covered[rows] = res.covered[:n]
        queries[rows] = res.queries[:n]
        objective[rows] = res.objective[:n]
        return Candidates(x_out, covered, queries, objective)

    def joint(uncovered: np.ndarray, round_index: int) -> Candidates:
        return _call(np.asarray(uncovered, bool), jax.random.fold_in(joint_key, round_index))

    def single(target: np.ndarray, active: np.ndarray, round_index: int) -> Candidates:
        mask = (np.arange(m)[None, :] == np.asarray(target)[:, None]) & np.asarray(active, bool)[:, None]
        return _call(mask, jax.random.fold_in(single_key, round_index))

    return joint, single


def precomputed_single(pool: Any, x_adv: Any, queries: Any, ref: Any) -> SingleAttack:
    """A fallback oracle that looks up per-member attacks already run.

    The fallback of Algorithm 1 attacks one uncovered member alone. When every member was
    attacked alone anyway (the per-member ASR), those inputs ARE the single-member attacks: the
    fallback for member ``j`` on sample ``b`` returns ``x_adv[j, b]`` at no new attack cost, and
    ASR and the fallback agree by construction. The coverage set of each such input is its effect
    on the whole pool (one forward pass of every member, charged as ``M`` queries on top of the
    member attack's own queries), evaluated when the greedy looks the input up: only the inputs
    used (at most one per sample and round, packed into the batch sizes :func:`pack_sizes` ``(B,
    PACK_LEVELS, PACK_MIN_ROWS)``), not all ``M * B`` of them up front (``O(M^2 B)`` forwards whatever the greedy
    needs).

    Args:
        pool: the pool (``predict``, ``num_members``).
        x_adv: ``[M, B, *S]`` member ``j``'s single-model adversarial input for sample ``b``.
        queries: ``[M, B]`` queries each member attack spent.
        ref: ``[B, M]`` reference labels (a member is covered when it leaves its reference).

    Returns:
        A :class:`SingleAttack`.
    """
    x_adv = np.asarray(x_adv)
    m, b = x_adv.shape[:2]
    ref = np.asarray(ref)
    if ref.shape != (b, m) or np.shape(queries) != (m, b):
        raise ValueError(
            f"expected x_adv [M={m}, B={b}, ...], queries [{m}, {b}], ref [{b}, {m}]; "
            f"got {x_adv.shape}, {np.shape(queries)}, {ref.shape}"
        )
    q = np.asarray(queries, np.int64) + m
    sizes = pack_sizes(b, PACK_LEVELS, PACK_MIN_ROWS)

    def single(target: np.ndarray, active: np.ndarray, round_index: int) -> Candidates:
        del round_index  # the member attacks are fixed inputs
        t = np.asarray(target)
        rows = np.arange(b)
        act = np.asarray(active, bool)
        x = x_adv[t, rows]
        covered = np.zeros((b, m), bool)
        used = np.flatnonzero(act)
        if used.size:  # the pool on the looked-up inputs only, padded to a few batch sizes
            size = next(z for z in sizes if z >= used.size)
            idx = np.concatenate([used, np.full(size - used.size, used[0])])
            preds = pool.predict(x[idx])[:, : used.size]  # [M, used]
            covered[used] = preds.T != ref[used]
        return Candidates(x, covered, np.where(act, q[t, rows], 0), np.zeros((b, m)))

    return single


def _on_mesh(sharded: Any, attack: Callable) -> Callable:
    """``attack`` (built on ``sharded.apply``) run through :meth:`ShardedPool.attack`.

    The batch, mask, per-sample eps and sample ids are padded to the mesh's ``data`` axis and
    placed on it; the results come back cut to the real samples and members.
    """

    def call(params: Any, x0: Any, ref: Any, mask: Any, key: jax.Array, **kwargs: Any) -> Any:
        del params  # ShardedPool.attack passes its placed params
        return sharded.attack(attack, x0, ref, key=key, mask=mask, **kwargs)

    return call


_CKPT_HINT = "pass overwrite=True (SARSettings) to discard it or choose another checkpoint_dir"
_CKPT_FILES = (fingerprints.FINGERPRINT_FILE, "chunk_*")  # what run_sar writes under checkpoint_dir
# default_sar_attack's entries -> (their fingerprint fields, their StackGate or None); weak, so an
# attack no caller holds is forgotten. run_sar records the hyperparameters of these entries and
# "custom" for any other attack.
_DEFAULT_ATTACKS: Any = weakref.WeakKeyDictionary()


def default_sar_attack(
    pool: Any,
    *,
    steps: int = 40,
    step_size: float | None = None,
    restarts: int = 3,
    gate_stacks: bool = True,
) -> Callable:
    """The joint PGD of the SAR paper's Table 1 on ``pool``: :func:`run_sar`'s default attack.

    Mean cross-entropy of the uncovered members against their reference labels, linf, 40 steps,
    step ``eps/16``, 3 random restarts, the restart with the highest objective
    (:func:`sarjax.attacks.joint.make_joint_pgd`). The radius is :func:`run_sar`'s ``eps``, given
    per call. :func:`run_sar` records ``steps``, ``step_size`` and ``restarts`` of an attack built
    here in its checkpoint fingerprint (an attack built elsewhere is recorded as ``"custom"``), so a
    resumed run with other hyperparameters is refused. Build it once and pass it to several
    :func:`run_sar` calls to reuse its compiled kernel.

    Args:
        pool: a :class:`sarjax.models.pool.Pool` or a :class:`sarjax.models.sharding.ShardedPool`.
        steps: PGD steps per restart, an int ``>= 1`` (Table 1: 40).
        step_size: linf step, ``> 0``, or None (default) for ``eps/16`` of each call's eps.
        restarts: random restarts, an int ``>= 1`` (Table 1: 3).
        gate_stacks: on a :class:`~sarjax.models.pool.Pool` of several stacks, skip the backward
            pass of every stack none of whose members a call attacks (:class:`StackGate`: e.g. a
            fallback aimed at one member differentiates one architecture, not the pool). The
            results are unchanged. Ignored for a one-stack pool or a ``ShardedPool``.

    Returns:
        The attack entry (``fn(params, x0, ref, *, key, mask, eps, sample_ids) -> AttackResult``),
        for :func:`run_sar`'s ``attack``. With a gate, its ``params`` are ``(pool.params, on)``
        (:meth:`StackGate.params`); :func:`run_sar` passes them.

    Raises:
        TypeError, ValueError: bad ``steps``, ``step_size`` or ``restarts`` (from the factory), or
            a ``pool`` without ``apply``.
    """
    if not hasattr(pool, "apply"):
        raise TypeError(f"pool must be a sarjax.models.Pool or a ShardedPool, got {type(pool).__name__}")
    base = pool.source if isinstance(pool, ShardedPool) else pool
    gate = None
    if gate_stacks and not isinstance(pool, ShardedPool) and len(getattr(base, "stacks", ())) > 1:
        gate = StackGate.of(pool)
    apply = pool.apply if gate is None else gate.apply
    attack = make_joint_pgd(apply, steps=steps, step=JointPGDStep(step_size=step_size, restarts=restarts))
    fields = {
        "attack": "joint_pgd",
        "steps": int(steps),
        "restarts": int(restarts),
        "step_size": None if step_size is None else float(step_size),
    }
    _DEFAULT_ATTACKS[attack] = (fields, gate, weakref.ref(pool))
    return attack


def run_sar(
    pool: Any,
    x: Any,
    eps: float,
    deltas: Sequence[float],
    *,
    key: jax.Array,
    labels: Any = None,
    attack: Callable | None = None,
    sample_ids: Any = None,
    member_attacks: tuple[Any, Any] | None = None,
    settings: SARSettings | None = None,
) -> SARResult:
    """SAR_{1-delta} of a vision pool on a batch of images with a mask-driven joint attack.

    The default attack is the joint PGD of the SAR paper, Table 1
    (:func:`default_sar_attack`: mean cross-entropy of the uncovered members against their
    reference labels, 40 steps, step ``eps/16``, 3 random restarts, the restart with the highest
    objective). Other hyperparameters: ``attack=default_sar_attack(pool, steps=..., ...)``.

    Args:
        pool: a :class:`sarjax.models.pool.Pool` (``apply``, ``params``,
            ``num_members``, ``predict``, ``check_input``), or a
            :class:`sarjax.models.sharding.ShardedPool` (members sharded on the
            mesh's ``pool`` axis, each attack's batch on its ``data`` axis): the
            result is the one-device result (every sample draws its stream from
            its id, and the padded members are neither attacked for nor charged).
        x: ``[B, *input_shape]`` images in ``[0, 1]``.
        eps: linf radius, ``> 0`` (the SAR paper uses 0.05 on MNIST).
        deltas: allowed uncovered shares, each in ``[0, 1)``.
        key: PRNG key, keyword-only and required (sarjax never defaults a key), the same for
            every chunk: each sample's random stream comes from its index in
            the data set (``sample_ids``), so the result per sample does not
            depend on ``chunk_size``, on which other samples run with it, on
            the mesh, or on the process that runs it.
        labels: optional ``[B]`` int true labels. None (default, the paper's
            MNIST setting): the safe region is each member's own clean
            prediction, so no member is broken on the clean input. Given: the
            safe region is the true label, and members already wrong on the
            clean image count as covered without an attack.
        attack: the mask-driven attack (default None: :func:`default_sar_attack` ``(pool)``, built
            anew per call). Any attack with the joint PGD signature (see
            :func:`make_attack_oracles`; it is called with ``sample_ids=``) built on
            ``pool.apply`` (for a ``ShardedPool``: on its ``apply``, run through
            ``ShardedPool.attack``), or an attack from :func:`default_sar_attack` on this pool.
            Reusing one attack across calls reuses its compiled kernel.
        sample_ids: optional ``[B]`` int, each image's index in the data set
            (default ``arange(B)``, the positions in ``x``); pass the indices
            when ``x`` is a slice of a larger set, so that a sample gets the
            same attack in any run that contains it. Chunk padding rows
            repeat a real row's id and are never attacked.
        member_attacks: optional ``(x_adv [M, B, *S], queries [M, B])`` of single-model
            attacks already run on every member (e.g. for the per-member ASR); the fallback
            then looks them up (:func:`precomputed_single`) instead of attacking again.
        settings: the pipeline's knobs (:class:`sarjax.sar.settings.SARSettings`: chunking,
            packing, ``use_best``, the greedy's options, checkpointing, progress); default
            ``SARSettings()``. With ``settings.checkpoint_dir`` each chunk checkpoints every round
            under ``chunk_<i>/`` and writes its result when done; a rerun resumes.
            ``fingerprint.json`` records everything that changes the result
            (pool content hash and conv impl, eps, deltas, a hash of the
            images, labels and sample ids, the attack (``"joint_pgd"`` with the hyperparameters
            of a :func:`default_sar_attack` entry, else ``"custom"``), key, chunking,
            options, sarjax version; :mod:`sarjax.runtime.fingerprint`). A rerun
            resumes only when it matches; otherwise a ValueError names the
            settings that differ. The one accepted difference is the deltas of
            a finished run: they are re-derived from its coverage order
            (:func:`sarjax.cover.result.rederive`), or a ValueError names the
            samples that order does not determine.

    Returns:
        SARResult over all ``B`` samples (round logs padded across chunks).

    Raises:
        TypeError, ValueError: bad ``pool``, ``eps``, ``deltas``, ``key``, ``labels``
            (each in ``[0, C)``), inputs (``[B >= 1, *input_shape]`` in
            ``[0, 1]``), ``sample_ids`` or ``settings``; a :func:`default_sar_attack` entry built
            on another pool; a ``checkpoint_dir`` written with other settings
            (:class:`sarjax.runtime.fingerprint.FingerprintMismatch`).
    """
    if settings is None:
        settings = SARSettings()
    if not isinstance(settings, SARSettings):
        raise TypeError(f"settings must be a sarjax.sar.SARSettings or None, got {type(settings).__name__}")
    sharded = pool if isinstance(pool, ShardedPool) else None
    base: Any = pool.source if sharded is not None else pool  # names, classes, input shape, content hash
    missing = [a for a in _POOL_API if not hasattr(base, a)]
    if missing:
        raise TypeError(
            f"pool must be a sarjax.models.Pool (with {', '.join(_POOL_API)}) or a ShardedPool, got "
            f"{type(pool).__name__} without {', '.join(missing)}"
        )
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating, np.integer)):
        raise TypeError(f"eps must be a finite float > 0, got {type(eps).__name__}")
    if not np.isfinite(eps) or eps <= 0:
        raise ValueError(f"eps must be a finite float > 0, got {eps}")
    if isinstance(deltas, (int, float, np.floating, np.integer)):
        deltas = (float(deltas),)
    if isinstance(deltas, (str, bytes)) or np.ndim(deltas) != 1 or len(deltas) == 0:
        raise ValueError(f"deltas must be a non-empty sequence of floats in [0, 1), got {deltas!r}")
    deltas = tuple(float(d) for d in deltas)
    for d in deltas:
        coverage_target(d, base.num_members)  # raises for a delta outside [0, 1)
    shape = tuple(base.input_shape)
    if x is None or not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(
            f"x must be an array of images [B, {', '.join(map(str, shape))}] in [0, 1], got {type(x).__name__}"
        )
    base.check_input(x)  # ValueError naming the expected [B, *input_shape] and the given shape
    x = np.asarray(x, dtype=np.float32)
    b, m = x.shape[0], base.num_members
    if b < 1:
        raise ValueError(f"x must hold at least one image, got an empty batch of shape {list(x.shape)}")
    if x.min() < 0.0 or x.max() > 1.0:
        raise ValueError(f"images must lie in [0, 1], got range [{x.min()}, {x.max()}]")
    if labels is not None:
        y = np.asarray(labels)
        if not np.issubdtype(y.dtype, np.integer) or y.shape != (b,):
            raise ValueError(f"labels must be int [{b}], got {y.dtype} {y.shape}")
        check_labels(y, int(base.num_classes))
    clean_pred = pool.predict(x).T.astype(np.int32)  # [B, M] (a ShardedPool predicts sharded)
    if labels is None:
        ref = clean_pred
    else:
        ref = np.broadcast_to(y.astype(np.int32)[:, None], (b, m)).copy()
    clean_broken = clean_pred != ref
    chunk_size = b if settings.chunk_size is None else min(int(settings.chunk_size), b)
    if key is None:
        raise TypeError(
            "run_sar: key is required (a jax.random key, e.g. jax.random.key(seed)); sarjax never defaults it"
        )
    if attack is None:
        attack = default_sar_attack(pool)
    if not callable(attack):
        raise TypeError(f"attack must be a mask-driven attack entry or None, got {type(attack).__name__}")
    known = _DEFAULT_ATTACKS.get(attack)
    if known is not None and known[2]() is not pool:
        raise ValueError(
            "attack: this default_sar_attack entry was built on another pool; build it with "
            "default_sar_attack(pool) on the pool you pass to run_sar"
        )
    attack_fields, gate = (
        known[:2]
        if known is not None
        else ({"attack": "custom", "steps": None, "restarts": None, "step_size": None}, None)
    )
    if sharded is not None:
        attack = _on_mesh(sharded, attack)

    ids = np.asarray(check_sample_ids(sample_ids, b))  # each row's index in the data set
    run = ResumableRun(settings.checkpoint_dir, hint=_CKPT_HINT)
    num_chunks = -(-b // chunk_size)
    if run.root is not None:
        fingerprint = {
            "kind": "run_sar",
            "sarjax_version": fingerprints.sarjax_version(),
            **fingerprints.pool_fingerprint(base),
            "num_members": m,
            "eps": float(eps),
            "deltas": list(deltas),
            "batch": b,
            "images": fingerprints.array_digest(x),
            "sample_ids": fingerprints.array_digest(ids.astype(np.int64)),
            "labels": None if labels is None else fingerprints.array_digest(y.astype(np.int64)),
            **attack_fields,
            "use_best": bool(settings.use_best),
            "key": fingerprints.key_fingerprint(key),
            "chunk_size": chunk_size,
            "count_clean_input": bool(settings.count_clean_input),
            "stop_when_unreachable": bool(settings.stop_when_unreachable),
            "store_inputs": bool(settings.store_inputs),
            "member_attacks": member_attacks is not None,
        }
        run.open(
            fingerprint,
            overwrite=settings.overwrite,
            files=_CKPT_FILES,
            results=("chunk_*",),
            parts=[f"chunk_{i}/result" for i in range(num_chunks)],
        )
    parts = []
    for i, start in enumerate(range(0, b, chunk_size)):
        stop = min(start + chunk_size, b)
        n = stop - start
        pad = chunk_size - n
        idx = np.concatenate([np.arange(start, stop), np.full(pad, start)])  # rows of x (padding: a real row)
        valid = np.arange(chunk_size) < n

        def oracles(idx: np.ndarray = idx) -> tuple[JointAttack, SingleAttack]:
            joint, single = make_attack_oracles(
                attack,
                pool.params,
                x[idx],
                ref[idx],
                key,
                eps=float(eps),
                use_best=settings.use_best,
                sample_ids=ids[idx],
                packing=Packing(int(settings.pack_levels), int(settings.pack_min_rows)),
                call_params=None if gate is None else gate.params,
            )
            if member_attacks is not None:
                single = precomputed_single(
                    pool, np.asarray(member_attacks[0])[:, idx], np.asarray(member_attacks[1])[:, idx], ref[idx]
                )
            return joint, single

        part = run.greedy(
            oracles,
            clean_broken[idx],
            deltas,
            checkpoint=f"chunk_{i}",
            result=f"chunk_{i}/result",
            valid=valid,
            count_clean_input=settings.count_clean_input,
            stop_when_unreachable=settings.stop_when_unreachable,
            store_inputs=settings.store_inputs,
            progress=settings.progress,
        )
        parts.append(part.select(np.flatnonzero(valid)))
    return concat_results(parts)
