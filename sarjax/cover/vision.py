"""SAR of an image-classifier pool: the greedy driven by joint PGD.

Adapter between :class:`sarjax.models.pool.Pool` plus the attacks module's
joint PGD (papers/000, Table 1) and the host-side greedy. The oracles below
call one compiled attack kernel for every round and for the fallback: the
uncovered set is a ``[B, M]`` mask, the round enters the PRNG key as data.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.cover import resume
from sarjax.cover.greedy import greedy_sar
from sarjax.cover.metrics import coverage_target
from sarjax.cover.result import SARResult, concat_results
from sarjax.cover.types import Candidates, JointAttack, SingleAttack

_JOINT_STREAM = 0
_SINGLE_STREAM = 1
_POOL_API = ("apply", "params", "num_members", "num_classes", "input_shape", "predict", "check_input")


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
) -> tuple[JointAttack, SingleAttack]:
    """Joint and single-member oracles from a mask-driven attack.

    Args:
        attack: ``attack(params, x0, ref, mask [B, M], key, *, eps[, sample_ids]) ->
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
            Table 1 of papers/000 returns the restart with the highest
            objective. The fallback objective is the per-member loss at the
            final point either way.
        sample_ids: optional ``[B]`` int, each row's index in the data set,
            passed to ``attack`` (which must then accept ``sample_ids=``) so
            that a sample's random stream does not depend on the batch it is
            attacked in; None: the attack's default (its position, ``arange(B)``).

    Returns:
        ``(joint, single)`` callables for :func:`sarjax.cover.greedy_sar`.
    """
    x0 = jnp.asarray(x0)
    ref = jnp.asarray(ref, jnp.int32)
    b, m = ref.shape
    joint_key = jax.random.fold_in(key, _JOINT_STREAM)
    single_key = jax.random.fold_in(key, _SINGLE_STREAM)
    ids = {} if sample_ids is None else {"sample_ids": np.asarray(sample_ids)}

    def _candidates(res: Any) -> Candidates:
        x = res.best_x if use_best else res.x_adv
        covered = res.best_success if use_best else res.success
        return Candidates(
            np.asarray(x),
            np.asarray(covered, dtype=bool),
            np.asarray(res.queries).astype(np.int64),
            np.asarray(res.member_loss, dtype=np.float64),
        )

    def joint(uncovered: np.ndarray, round_index: int) -> Candidates:
        mask = jnp.asarray(uncovered, jnp.float32)
        k = jax.random.fold_in(joint_key, round_index)
        return _candidates(attack(params, x0, ref, mask, k, eps=eps, **ids))

    def single(target: np.ndarray, active: np.ndarray, round_index: int) -> Candidates:
        mask = (np.arange(m)[None, :] == np.asarray(target)[:, None]) & np.asarray(active)[:, None]
        k = jax.random.fold_in(single_key, round_index)
        return _candidates(attack(params, x0, ref, jnp.asarray(mask, jnp.float32), k, eps=eps, **ids))

    return joint, single


def precomputed_single(pool: Any, x_adv: Any, queries: Any, ref: Any) -> SingleAttack:
    """A fallback oracle that looks up per-member attacks already run.

    The fallback of Algorithm 1 attacks one uncovered member alone. When every member was
    attacked alone anyway (the per-member ASR), those inputs ARE the single-member attacks: the
    fallback for member ``j`` on sample ``b`` returns ``x_adv[j, b]`` at no new attack cost, and
    ASR and the fallback agree by construction. The coverage set of each such input is its effect
    on the whole pool (one forward pass of every member, charged as ``M`` queries on top of the
    member attack's own queries).

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
    preds = pool.predict(x_adv.reshape(m * b, *x_adv.shape[2:])).reshape(m, m, b)  # [evaluated, source, B]
    covered_all = preds.transpose(1, 2, 0) != ref[None]  # [source j, B, evaluated member]
    q = np.asarray(queries, np.int64) + m

    def single(target: np.ndarray, active: np.ndarray, round_index: int) -> Candidates:
        del round_index  # the member attacks are fixed inputs
        t = np.asarray(target)
        rows = np.arange(b)
        act = np.asarray(active, bool)
        return Candidates(
            x_adv[t, rows],
            covered_all[t, rows] & act[:, None],
            np.where(act, q[t, rows], 0),
            np.zeros((b, m)),
        )

    return single


def _on_mesh(sharded: Any, attack: Callable) -> Callable:
    """``attack`` (built on ``sharded.apply``) run through :meth:`ShardedPool.attack`.

    The batch, mask, per-sample eps and sample ids are padded to the mesh's ``data`` axis and
    placed on it; the results come back cut to the real samples and members.
    """

    def call(params: Any, x0: Any, ref: Any, mask: Any, key: jax.Array, **kwargs: Any) -> Any:
        del params  # ShardedPool.attack passes its placed params
        return sharded.attack(attack, x0, ref, mask, key, **kwargs)

    return call


_CKPT_HINT = "pass overwrite=True to discard it or choose another checkpoint_dir"
_CKPT_FILES = (resume.FINGERPRINT_FILE, "chunk_*")  # what run_sar writes under checkpoint_dir


def _open_checkpoint(root: Path, fingerprint: dict, overwrite: bool, num_chunks: int) -> None:
    """Check (or write) ``root/fingerprint.json`` before a run reads or writes checkpoints.

    ``overwrite`` first deletes what run_sar wrote there (the fingerprint and ``chunk_*``, nothing
    else). A stored run with other settings raises; other deltas are accepted only when the stored
    run finished (each chunk's result is then re-derived from its coverage order).
    """
    if overwrite and root.is_dir():
        resume.remove_paths(root, _CKPT_FILES)
    holds = root.is_dir() and any(root.glob("chunk_*"))
    stored = resume.check_fingerprint(root, fingerprint, hint=_CKPT_HINT, holds_results=holds, allow=("deltas",))
    if stored is None:
        resume.write_fingerprint(root, fingerprint)
        return
    finished = all((root / f"chunk_{i}" / "result" / "result.json").exists() for i in range(num_chunks))
    if resume.differing_fields(stored, {**stored, "deltas": fingerprint["deltas"]}) and not finished:
        raise resume.FingerprintMismatch(
            resume.mismatch_reason(root, stored, fingerprint, ["deltas"]) + ", and other deltas are read "
            f"off a finished run only (rerun with deltas={stored['deltas']} to finish it first)",
            _CKPT_HINT,
            ["deltas"],
            stored,
        )


def run_sar(
    pool: Any,
    x: Any,
    eps: float,
    deltas: Sequence[float],
    *,
    labels: Any = None,
    key: jax.Array | None = None,
    steps: int = 40,
    step_size: float | None = None,
    restarts: int = 3,
    use_best: bool = False,
    attack: Callable | None = None,
    chunk_size: int | None = None,
    count_clean_input: bool = False,
    stop_when_unreachable: bool = True,
    store_inputs: bool = True,
    checkpoint_dir: str | os.PathLike | None = None,
    progress: bool = False,
    member_attacks: tuple[Any, Any] | None = None,
    sample_ids: Any = None,
    overwrite: bool = False,
) -> SARResult:
    """SAR_{1-delta} of a vision pool on a batch of images with joint linf PGD.

    The attack is the joint PGD of papers/000, Table 1: mean cross-entropy of
    the uncovered members against their reference labels, 40 steps, step
    ``eps/16``, 3 random restarts, the restart with the highest objective.

    Args:
        pool: a :class:`sarjax.models.pool.Pool` (``apply``, ``params``,
            ``num_members``, ``predict``, ``check_input``), or a
            :class:`sarjax.models.sharding.ShardedPool` (members sharded on the
            mesh's ``pool`` axis, each attack's batch on its ``data`` axis): the
            result is the one-device result (every sample draws its stream from
            its id, and the padded members are neither attacked for nor charged).
        x: ``[B, *input_shape]`` images in ``[0, 1]``.
        eps: linf radius, ``> 0`` (papers/000 uses 0.05 on MNIST).
        deltas: allowed uncovered shares, each in ``[0, 1)``.
        labels: optional ``[B]`` int true labels. None (default, the paper's
            MNIST setting): the safe region is each member's own clean
            prediction, so no member is broken on the clean input. Given: the
            safe region is the true label, and members already wrong on the
            clean image count as covered without an attack.
        key: PRNG key, required (sarjax never defaults a key), the same for
            every chunk: each sample's random stream comes from its index in
            the data set (``sample_ids``), so the result per sample does not
            depend on ``chunk_size``, on which other samples run with it, on
            the mesh, or on the process that runs it.
        steps, step_size, restarts: joint PGD settings (Table 1 defaults;
            ``step_size=None`` means ``eps/16``).
        use_best: see :func:`make_attack_oracles`.
        attack: optional prebuilt mask-driven attack with the joint PGD
            signature (see :func:`make_attack_oracles`; it is called with
            ``sample_ids=``), built on ``pool.apply`` (for a ``ShardedPool``:
            on its ``apply``, run through ``ShardedPool.attack``); it replaces the
            default joint PGD, and ``steps``, ``step_size`` and ``restarts``
            are then ignored. Reusing one attack
            across calls reuses its compiled kernel.
        chunk_size: samples per greedy run (default all). The last chunk is
            padded to the same size (padding rows are never attacked), so the
            attack compiles once.
        count_clean_input, stop_when_unreachable, store_inputs, progress: see
            :func:`sarjax.cover.greedy_sar`.
        checkpoint_dir: if set, each chunk checkpoints every round under
            ``chunk_<i>/`` and writes its result when done; a rerun resumes.
            ``fingerprint.json`` records everything that changes the result
            (pool content hash and conv impl, eps, deltas, a hash of the
            images, labels and sample ids, attack settings, key, chunking,
            options, sarjax version; :mod:`sarjax.cover.resume`). A rerun
            resumes only when it matches; otherwise a ValueError names the
            settings that differ. The one accepted difference is the deltas of
            a finished run: they are re-derived from its coverage order
            (:func:`sarjax.cover.resume.rederive`), or a ValueError names the
            samples that order does not determine.
        overwrite: delete what an earlier run wrote in ``checkpoint_dir``
            (``fingerprint.json`` and ``chunk_*``, nothing else) and start afresh.
        member_attacks: optional ``(x_adv [M, B, *S], queries [M, B])`` of single-model
            attacks already run on every member (e.g. for the per-member ASR); the fallback
            then looks them up (:func:`precomputed_single`) instead of attacking again.
        sample_ids: optional ``[B]`` int, each image's index in the data set
            (default ``arange(B)``, the positions in ``x``); pass the indices
            when ``x`` is a slice of a larger set, so that a sample gets the
            same attack in any run that contains it. Chunk padding rows
            repeat a real row's id and are never attacked.

    Returns:
        SARResult over all ``B`` samples (round logs padded across chunks).

    Raises:
        TypeError, ValueError: bad ``pool``, ``eps``, ``deltas``, no ``key``, ``labels``
            (each in ``[0, C)``), inputs (``[B >= 1, *input_shape]`` in
            ``[0, 1]``), ``chunk_size`` or ``sample_ids``; a ``checkpoint_dir``
            written with other settings (:class:`sarjax.cover.resume.FingerprintMismatch`).
    """
    from sarjax.models.sharding import ShardedPool

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
        from sarjax.attacks.threat import check_labels  # the one label-range check of sarjax

        check_labels(y, int(base.num_classes))
    custom_attack = attack is not None
    clean_pred = pool.predict(x).T.astype(np.int32)  # [B, M] (a ShardedPool predicts sharded)
    if labels is None:
        ref = clean_pred
    else:
        ref = np.broadcast_to(y.astype(np.int32)[:, None], (b, m)).copy()
    clean_broken = clean_pred != ref
    if chunk_size is None:
        chunk_size = b
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
    chunk_size = min(int(chunk_size), b)
    if key is None:
        raise TypeError(
            "run_sar: key is required (a jax.random key, e.g. jax.random.key(seed)); sarjax never defaults it"
        )
    if attack is None:
        from sarjax.attacks.joint import make_joint_pgd

        attack = make_joint_pgd(pool.apply, eps=float(eps), steps=steps, step_size=step_size, restarts=restarts)
    if sharded is not None:
        attack = _on_mesh(sharded, attack)
    from sarjax.attacks.core.validate import check_sample_ids

    ids = np.asarray(check_sample_ids(sample_ids, b))  # each row's index in the data set
    root = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if root is not None:
        fingerprint = {
            "kind": "run_sar",
            "sarjax_version": resume.sarjax_version(),
            **resume.pool_fingerprint(base),
            "num_members": m,
            "eps": float(eps),
            "deltas": list(deltas),
            "batch": b,
            "images": resume.array_digest(x),
            "sample_ids": resume.array_digest(ids.astype(np.int64)),
            "labels": None if labels is None else resume.array_digest(y.astype(np.int64)),
            "attack": "custom" if custom_attack else "joint_pgd",
            "steps": None if custom_attack else int(steps),
            "restarts": None if custom_attack else int(restarts),
            "step_size": None if custom_attack or step_size is None else float(step_size),
            "use_best": bool(use_best),
            "key": resume.key_fingerprint(key),
            "chunk_size": chunk_size,
            "count_clean_input": bool(count_clean_input),
            "stop_when_unreachable": bool(stop_when_unreachable),
            "store_inputs": bool(store_inputs),
            "member_attacks": member_attacks is not None,
        }
        _open_checkpoint(root, fingerprint, overwrite, -(-b // chunk_size))
    parts = []
    for i, start in enumerate(range(0, b, chunk_size)):
        stop = min(start + chunk_size, b)
        n = stop - start
        pad = chunk_size - n
        idx = np.concatenate([np.arange(start, stop), np.full(pad, start)])  # rows of x (padding: a real row)
        valid = np.arange(chunk_size) < n
        done_dir = root / f"chunk_{i}" / "result" if root is not None else None
        if done_dir is not None and (done_dir / "result.json").exists():
            part = SARResult.load(done_dir)
            if tuple(part.deltas) != deltas:  # a finished run asked for other deltas
                try:
                    part = resume.rederive(part, deltas)
                except ValueError as e:
                    raise ValueError(f"{root}: {e}; {_CKPT_HINT}") from None
        else:
            joint, single = make_attack_oracles(
                attack,
                pool.params,
                x[idx],
                ref[idx],
                key,
                eps=float(eps),
                use_best=use_best,
                sample_ids=ids[idx],
            )
            if member_attacks is not None:
                single = precomputed_single(
                    pool, np.asarray(member_attacks[0])[:, idx], np.asarray(member_attacks[1])[:, idx], ref[idx]
                )
            part = greedy_sar(
                joint,
                single,
                clean_broken[idx],
                deltas,
                valid=valid,
                count_clean_input=count_clean_input,
                stop_when_unreachable=stop_when_unreachable,
                store_inputs=store_inputs,
                checkpoint_dir=None if root is None else root / f"chunk_{i}",
                progress=progress,
            )
            if done_dir is not None:
                part.save(done_dir)
        parts.append(part.select(np.flatnonzero(valid)))
    return concat_results(parts)
