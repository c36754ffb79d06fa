"""Single-model mode vmapped over members: every member attacked independently in one call.

For a stack of K members of one architecture the single-model attack kernel
is vmapped over the stacked params (one compiled call per stack); a pool of
several stacks is handled stack by stack on the host and concatenated
(DESIGN.md: never ``lax.switch`` across architectures).  The result is the
per-member ASR matrix the cover metrics need.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks import queries as Q
from sarjax.attacks.audit import check
from sarjax.attacks.core import validate as V
from sarjax.attacks.core.evaluate import at_key
from sarjax.attacks.core.protocol import Problem, run
from sarjax.attacks.result import AttackResult
from sarjax.attacks.threat import Threat, canonical_norm, check_labels


def make_member_attack(
    member_apply: Callable, factory: Callable, *, norm="linf", box=(0.0, 1.0), **hp: Any
) -> Callable:
    """Builds ``fn(stacked_params, x0, labels, key, *, eps, max_queries=None, sample_ids=None) -> AttackResult``.

    Args:
      member_apply: ``apply(member_params, x [B, *S]) -> logits [B, C]`` for ONE member.
      factory: a sarjax attack factory (``make_pgd``, ``make_apgd``, ``make_fgsm``, ...).
      norm: threat norm, passed to the factory.
      box: input bounds, passed to the factory.
      **hp: other factory hyperparameters (steps, restarts, loss, targeted, ...).

    Returns:
      ``fn(stacked_params (leaves [K, ...]), x0 [B, *S], labels [B] or [K, B] int
      (true labels, each member's clean predictions, or targets; each in ``[0, C)``), key, *,
      eps (scalar or [B]), max_queries=None, sample_ids=None ([B] int, each sample's index in
      the data set; its random stream is ``fold_in(member key, sample_id)``)) -> AttackResult`` whose fields have a
      leading member axis: ``x_adv [K, B, *S]``, ``success [K, B]``,
      ``objective [K, B]``, ``queries [K, B]``, ...  Every member's outputs are
      audited against ``x0``.
    """
    single = factory(member_apply, norm=norm, box=box, audit=False, **hp)
    attack = single.attack
    p = canonical_norm(norm)

    def per_member(params, x0, ref, mask, eps, cap, key, sid):
        return run(attack, params, Problem(x0, ref, mask, eps, cap, key, sid, x0, jnp.asarray(False)))

    batched = jax.jit(jax.vmap(per_member, in_axes=(0, None, 0, None, None, None, 0, None)))

    def fn(stacked_params, x0, labels, key=None, *, eps, max_queries=None, sample_ids=None) -> AttackResult:
        if key is None:
            raise TypeError("member attack: key is required (a jax.random key); sarjax never defaults it")
        K = {np.shape(l)[0] for l in jax.tree.leaves(stacked_params)}
        if len(K) != 1:
            raise ValueError(f"stacked params must share one leading member axis, got sizes {K}")
        (K,) = K
        lab = jnp.asarray(labels)
        x0n, _, _, eps_arr = V.normalize_inputs(x0, lab if lab.ndim == 1 else lab[0], None, eps, None, box, p)
        B = x0n.shape[0]
        if lab.ndim == 1:
            lab = jnp.broadcast_to(lab[None], (K, B))
        if lab.shape != (K, B):
            raise ValueError(f"labels must have shape [B] or [K, B] = [{K}, {B}], got {lab.shape}")
        one = jax.tree.map(lambda a: a[0], stacked_params)
        _, n_classes = V.logits_shape(at_key(member_apply, int(hp.get("eot", 1)), jax.random.PRNGKey(0)), one, x0n)
        targeted = bool(hp.get("targeted", False))
        check_labels(np.asarray(lab).T, n_classes, name="targets" if targeted else "labels")
        sid = V.check_sample_ids(sample_ids, B)
        ref = lab.astype(jnp.int32)[..., None]  # [K, B, 1]
        mask = jnp.ones((B, 1), jnp.float32)
        cap = Q.normalize_cap(max_queries, B)
        keys = jax.vmap(lambda k: jax.random.fold_in(key, k))(jnp.arange(K))
        res = batched(stacked_params, x0n, ref, mask, eps_arr, cap, keys, sid)
        res = res._replace(
            success=res.success[..., 0], member_loss=res.member_loss[..., 0], best_success=res.best_success[..., 0]
        )
        threat = Threat(p, np.asarray(eps_arr), box)
        for k in range(K):  # host-side audit of each member's outputs
            check(x0n, res.x_adv[k], threat, what=f"member {k} attack (x_adv)")
            check(x0n, res.best_x[k], threat, what=f"member {k} attack (best_x)")
        return res

    return fn


def attack_members(
    pool, factory: Callable, x0, labels, key=None, *, eps, norm="linf", max_queries=None, sample_ids=None, **hp: Any
) -> AttackResult:
    """Attacks every member of a :class:`sarjax.models.pool.Pool` independently.

    One compiled call per stack (vmapped over that stack's members),
    concatenated in member order.

    Args:
      pool: a Pool (``pool.stacks``, each with a one-member ``member_apply`` and stacked ``params``;
        :class:`sarjax.models.stack.BaseStack`).
      factory: attack factory, e.g. :func:`sarjax.attacks.pgd.make_pgd`.
      x0: ``[B, *S]`` inputs in the box.
      labels: ``[B]`` (shared) or ``[M, B]`` (per member) int labels, each in ``[0, C)``.
      key: PRNG key, required (member m of stack s attacks sample b with the stream
        ``fold_in(fold_in(fold_in(key, s), m), sample_ids[b])``).
      eps: scalar or ``[B]``.
      norm: threat norm.
      max_queries: per-sample cap per member.
      sample_ids: ``[B]`` int, each sample's index in the data set (default ``arange(B)``): a
        sample's attack does not depend on the batch it is run in.
      **hp: factory hyperparameters.

    Returns:
      AttackResult with leading axis M: ``success [M, B]`` (the per-member ASR
      matrix is ``success.mean(axis=1)``).
    """
    if key is None:
        raise TypeError("attack_members: key is required (a jax.random key); sarjax never defaults it")
    lab = jnp.asarray(labels)
    outs, start = [], 0
    for i, stack in enumerate(pool.stacks):
        fn = _cached_member_attack(stack.member_apply, factory, norm, hp)
        lab_i = lab if lab.ndim == 1 else lab[start : start + stack.size]
        outs.append(
            fn(
                stack.params,
                x0,
                lab_i,
                jax.random.fold_in(key, i),
                eps=eps,
                max_queries=max_queries,
                sample_ids=sample_ids,
            )
        )
        start += stack.size
    if len(outs) == 1:
        return outs[0]
    return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *outs)


_KERNELS: OrderedDict[Any, Callable] = OrderedDict()
_KERNELS_MAX = 32


def _cached_member_attack(member_apply: Callable, factory: Callable, norm, hp: dict) -> Callable:
    """``make_member_attack`` memoised on (apply, factory, norm, hyperparameters).

    eps, labels, keys and the query cap are traced arguments of the compiled
    kernel, so reusing the built function means a second call on the same pool
    (another eps, other samples of the same batch size) does not recompile.
    Unhashable hyperparameters fall back to building a new function.
    """
    try:
        cache_key = (member_apply, factory, canonical_norm(norm), tuple(sorted(hp.items())))
        hash(cache_key)
    except TypeError:
        return make_member_attack(member_apply, factory, norm=norm, **hp)
    fn = _KERNELS.get(cache_key)
    if fn is None:
        fn = make_member_attack(member_apply, factory, norm=norm, **hp)
        _KERNELS[cache_key] = fn
        while len(_KERNELS) > _KERNELS_MAX:
            _KERNELS.popitem(last=False)
    else:
        _KERNELS.move_to_end(cache_key)
    return fn
