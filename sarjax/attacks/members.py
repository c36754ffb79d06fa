"""Member mode: a single-model attack run on every member of a stack alone, in one call.

A stack of K members of one architecture is attacked by the single-model attack's state machine
vmapped over the stacked params (one compiled call per stack); a pool of several stacks is
handled stack by stack on the host and concatenated (docs/design.md: never ``lax.switch`` across
architectures). Results have the member axis second, ``[B, M]``, like every other attack; the
returned points are per member, ``x_adv [B, M, *S]``. The success matrix is the per-member ASR
the cover metrics need.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks.core.entry import AttackFn, Entry
from sarjax.attacks.core.protocol import Problem, run
from sarjax.attacks.core.validate import check_mask, logits_shape
from sarjax.attacks.result import AttackResult
from sarjax.attacks.threat import check_labels

# the per-member problem: ref, mask and key carry the member axis, everything else is shared
_PROBLEM_AXES = Problem(None, 0, 0, None, None, 0, None, None, None)  # pyright: ignore[reportArgumentType]


def _run_members(attack, params, problem: Problem):
    return jax.vmap(lambda p, pr: run(attack, p, pr), in_axes=(0, _PROBLEM_AXES))(params, problem)


_run_members_jit = jax.jit(_run_members, static_argnums=0)


def _member_first_to_second(res: AttackResult) -> AttackResult:
    """``[K, B, ...]`` (the vmapped single-model results, member axis 1 of size 1 squeezed) to
    ``[B, K, ...]``."""

    out = {}
    for f in AttackResult._fields:
        a = jnp.asarray(getattr(res, f))
        if f in ("success", "member_loss", "best_success", "queries") and a.ndim == 3:
            a = a[:, :, 0]  # [K, B, 1]: the single model's member axis
        out[f] = jnp.swapaxes(a, 0, 1)
    return AttackResult(**out)


class MemberAttack(Entry):
    """Member mode of a single-model fixed-budget attack (build with :func:`make_member_attack`).

    Call: ``fn(stacked_params, x0, ref, *, key, mask=None, eps=None, max_queries=None,
    x_init=None, sample_ids=None) -> AttackResult`` with the member axis second: ``x_adv
    [B, M, *S]`` and ``best_x [B, M, *S]`` (each member's own point), ``success``,
    ``objective``, ``member_loss``, ``queries``, ``best_success``, ``best_objective`` ``[B, M]``.

    * ``stacked_params``: the members' params stacked on a leading axis ``[M, ...]``;
    * ``ref``: ``[B]`` (shared) or ``[B, M]`` (per member) labels, or targets for a targeted
      attack, each in ``[0, C)``;
    * ``mask``: ``[M]`` or ``[B, M]`` bool / {0, 1}: a member outside the mask is not attacked
      on that sample (no query, ``x_adv = x0``, no success);
    * ``key``: member ``m`` attacks sample ``b`` with the stream
      ``fold_in(fold_in(key, m), sample_ids[b])``.

    The single attack's own validation runs once (on the first member), labels are checked for
    every member, and every member's points are audited against the ORIGINAL ``x0`` by the
    single attack's audit. ``fn.jit(...)``: the same arguments, jit-safe (no validation, no
    audit).
    """

    def __init__(self, attack: AttackFn):
        if not isinstance(attack, AttackFn):
            raise TypeError(
                f"make_member_attack takes a fixed-budget attack (an AttackFn from make_pgd, make_apgd, ...), "
                f"got {type(attack).__name__}"
            )
        self.single = attack
        self.name = f"member {attack.name}"
        self.__name__ = self.name
        self.apply = attack.apply

    @property
    def attack(self):
        """The single-model state machine (vmapped over the members by the entries)."""
        return self.single.attack

    @staticmethod
    def _members(params) -> int:
        sizes = {np.shape(leaf)[0] for leaf in jax.tree.leaves(params)}
        if len(sizes) != 1:
            raise ValueError(f"stacked params must share one leading member axis, got sizes {sorted(sizes)}")
        return int(sizes.pop())

    def _member_problem(self, base: Problem, ref, mask, key, k: int) -> Problem:
        b = base.x0.shape[0]
        ref = jnp.asarray(ref).astype(jnp.int32)
        ref = jnp.broadcast_to(ref[:, None] if ref.ndim == 1 else ref, (b, k))
        mk = jnp.ones((b, k), jnp.float32) if mask is None else jnp.asarray(mask).astype(jnp.float32)
        mk = jnp.broadcast_to(mk[None] if mk.ndim == 1 else mk, (b, k))
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(k))
        return base._replace(ref=ref.T[..., None], mask=mk.T[..., None], key=keys)

    def _host_problem(self, params, x0, ref, mask, key, **call) -> Problem:
        k = self._members(params)
        one = jax.tree.map(lambda a: a[0], params)
        lab = np.asarray(ref)
        if lab.ndim not in (1, 2) or (lab.ndim == 2 and lab.shape[1] != k):
            raise ValueError(f"{self.name}: ref must be [B] or [B, M={k}], got shape {lab.shape}")
        m = check_mask(mask, lab.shape[0], k, name=self.name)
        # the single attack validates x0, eps, caps, x_init, sample ids (and the first member's labels)
        base = self.single.problem(one, x0, lab if lab.ndim == 1 else lab[:, 0], key=key, **call)
        if lab.ndim == 2:
            assert self.single.apply is not None  # an AttackFn always has its apply
            _, n_classes = logits_shape(self.single.apply, one, base.x0)
            check_labels(lab, n_classes, name="labels")
        return self._member_problem(base, lab, m, key, k)

    def _traced_problem(self, params, x0, ref, mask, key, **call) -> Problem:
        k = self._members(params)
        one = jax.tree.map(lambda a: a[0], params)
        ref = jnp.asarray(ref)
        base = self.single._traced_problem(one, x0, ref if ref.ndim == 1 else ref[:, 0], None, key, **call)
        return self._member_problem(base, ref, mask, key, k)

    def __call__(self, params, x0, ref, *, key, mask=None, **call) -> AttackResult:
        """Validate -> every member's attack in one compiled call -> audit each member's points."""
        problem = self.problem(params, x0, ref, key=key, mask=mask, **call)
        res = _run_members_jit(self.attack, params, problem)
        k = self._members(params)
        for i in range(k):  # host-side audit of each member's points against x0
            pk = problem._replace(ref=problem.ref[i], mask=problem.mask[i], key=problem.key[i])
            self.single.audit_result(jax.tree.map(lambda a: a[i], params), pk, jax.tree.map(lambda a: a[i], res))
        return _member_first_to_second(res)

    def jit(self, params, x0, ref, *, key, mask=None, **call) -> AttackResult:
        """The jit-safe entry (same arguments; no validation, no audit)."""
        if key is None:
            raise TypeError(f"{self.name}: key is required (a jax.random key); sarjax never defaults it")
        problem = self._traced_problem(params, x0, ref, mask, key, **call)
        return _member_first_to_second(_run_members(self.attack, params, problem))

    def __repr__(self) -> str:
        return f"MemberAttack({self.single!r})"


def make_member_attack(attack: AttackFn) -> MemberAttack:
    """Member mode of a single-model fixed-budget attack (see :class:`MemberAttack`).

    Args:
      attack: the attack built on ONE member's apply, e.g.
        ``make_pgd(stack.member_apply, norm="linf", steps=10)`` (any ``AttackFn``, a new attack
        written on the protocol included: its state machine, validation and audit are reused).

    Returns:
      ``fn(stacked_params, x0, ref, *, key, mask=None, eps=None, max_queries=None, x_init=None,
      sample_ids=None) -> AttackResult`` with ``[B, M]`` fields and ``x_adv [B, M, *S]``;
      ``fn.jit(...)`` with the same arguments.
    """
    return MemberAttack(attack)


def attack_members(
    pool, factory: Callable, x0, ref, *, key, mask=None, eps=None, max_queries=None, sample_ids=None, **hp: Any
) -> AttackResult:
    """Attacks every member of a :class:`sarjax.models.pool.Pool` alone (member mode per stack).

    One compiled call per stack (vmapped over that stack's members), concatenated in member
    order on the member axis.

    Args:
      pool: a Pool (``pool.stacks``, each with a one-member ``member_apply`` and stacked
        ``params``; :class:`sarjax.models.stack.BaseStack`).
      factory: the single-model attack's factory, called as ``factory(stack.member_apply,
        **hp)`` (e.g. :func:`sarjax.attacks.pgd.make_pgd` with ``norm="linf", steps=10``).
      x0: ``[B, *S]`` inputs in the box.
      ref: ``[B]`` (shared) or ``[B, M]`` (per member) labels (targets for a targeted attack),
        each in ``[0, C)``.
      key: PRNG key, required (member m of stack s attacks sample b with the stream
        ``fold_in(fold_in(fold_in(key, s), m), sample_ids[b])``).
      mask: ``[M]`` or ``[B, M]`` bool / {0, 1}; members outside it are not attacked.
      eps: scalar or ``[B]`` (None: the factory's).
      max_queries: per-sample cap per member.
      sample_ids: ``[B]`` int, each sample's index in the data set (default ``arange(B)``): a
        sample's attack does not depend on the batch it is run in.
      **hp: the factory's hyperparameters (``norm``, ``steps``, ...).

    Returns:
      AttackResult with the member axis second: ``success [B, M]`` (the per-member ASR matrix is
      ``success.mean(axis=0)``), ``x_adv [B, M, *S]``, ``queries [B, M]``, ...
    """
    if key is None:
        raise TypeError("attack_members: key is required (a jax.random key); sarjax never defaults it")
    lab = np.asarray(ref)
    m_all = sum(s.size for s in pool.stacks)
    if lab.ndim == 2 and lab.shape[1] != m_all:
        raise ValueError(f"attack_members: ref must be [B] or [B, M={m_all}], got shape {lab.shape}")
    mk = None if mask is None else np.asarray(mask)
    if mk is not None and mk.shape[-1] != m_all:
        raise ValueError(f"attack_members: mask must be [M={m_all}] or [B, M={m_all}], got shape {mk.shape}")
    outs, start = [], 0
    for i, stack in enumerate(pool.stacks):
        fn = _cached_member_attack(stack.member_apply, factory, hp)
        sl = slice(start, start + stack.size)
        outs.append(
            fn(
                stack.params,
                x0,
                lab if lab.ndim == 1 else lab[:, sl],
                key=jax.random.fold_in(key, i),
                mask=None if mk is None else mk[..., sl],
                eps=eps,
                max_queries=max_queries,
                sample_ids=sample_ids,
            )
        )
        start += stack.size
    if len(outs) == 1:
        return outs[0]
    return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=1), *outs)


_KERNELS: OrderedDict[Any, MemberAttack] = OrderedDict()
_KERNELS_MAX = 32


def _cached_member_attack(member_apply: Callable, factory: Callable, hp: dict) -> MemberAttack:
    """``make_member_attack(factory(member_apply, **hp))`` memoised on (apply, factory,
    hyperparameters).

    eps, labels, keys and the query cap are traced arguments of the compiled kernel, so reusing
    the built attack means a second call on the same pool (another eps, other samples of the
    same batch size) does not recompile. Unhashable hyperparameters build a new attack.
    """
    try:
        cache_key = (member_apply, factory, tuple(sorted(hp.items())))
        hash(cache_key)
    except TypeError:
        return make_member_attack(factory(member_apply, **hp))
    fn = _KERNELS.get(cache_key)
    if fn is None:
        fn = make_member_attack(factory(member_apply, **hp))
        _KERNELS[cache_key] = fn
        while len(_KERNELS) > _KERNELS_MAX:
            _KERNELS.popitem(last=False)
    else:
        _KERNELS.move_to_end(cache_key)
    return fn


__all__ = ["MemberAttack", "attack_members", "make_member_attack"]
