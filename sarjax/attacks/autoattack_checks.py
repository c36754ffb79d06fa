"""AutoAttack's sanity checks (``autoattack/checks.py``, ``flags_doc.md``) for JAX models.

:func:`sanity_checks` flags the models AutoAttack's standard evaluation would misjudge (randomized
or dynamic defenses, probability outputs, zero or missing gradients, too few classes) with an
:class:`AutoAttackWarning` that names the version or attack to run instead. The cascade
(:func:`sarjax.attacks.autoattack.autoattack`, ``checks=True``) runs them on its first batch and
emits the same warning class for its own flags (a skipped stage, Square beating the white-box
stages). The checks are diagnostics: their model calls are not charged as queries.

The version names and the number of targets live here, not in :mod:`sarjax.attacks.autoattack`:
the cascade imports the checks, so the checks cannot import the cascade.
"""

import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import jaxpr_as_fun

from sarjax.attacks.losses import cross_entropy, dlr

VERSIONS = ("standard", "plus", "rand")
N_TARGETS = 9  # APGD-T and FAB-T target classes (set_version: n_target_classes = 9)
RANDOMIZED_RTOL = 1e-4  # checks.py check_randomized: alpha = 1e-4 on L2-normalized outputs
PROBABILITY_ATOL = 1e-5  # checks.py check_range_output: alpha = 1e-5


class AutoAttackWarning(UserWarning):
    """A sanity check of :func:`sanity_checks` fired (AutoAttack's ``checks.py`` flags)."""


def _flat_logits(apply, params, x, *k):
    z = np.asarray(apply(params, x, *k), np.float64)
    return z.reshape(-1, z.shape[-1])


def _host_values(v) -> tuple:
    """A jaxpr constant as comparable host bytes (typed PRNG keys by their key data)."""
    dtype = getattr(v, "dtype", None)
    if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
        v = jax.random.key_data(v)
    a = np.asarray(v)
    return a.dtype.str, a.shape, a.tobytes()


def _same_trace(a, b) -> bool:
    """Whether two traces of the model (``jax.make_jaxpr``) are the same program: the same
    equations and the same constants, bit for bit."""
    return (
        str(a.jaxpr) == str(b.jaxpr)
        and len(a.consts) == len(b.consts)
        and all(_host_values(u) == _host_values(v) for u, v in zip(a.consts, b.consts))
    )


def _repeated_logits(apply, params, x, ks: tuple, n: int, others: tuple = ()):
    """``n`` evaluations of ``apply(params, x, *ks)`` and one per key of ``others`` (each
    ``[M * B, C]`` float64), and the first trace (``jax.make_jaxpr``).

    AutoAttack's randomness check calls the model ``n`` times eagerly, so that randomness drawn on
    the host in Python shows. Eager calls compile one XLA program per operation and shape (about
    50 for a small CNN, 140 with the gradient check). Here the model is traced ``n`` times instead
    (Python runs each time: host randomness or host state changes the traced program or its
    constants); when every trace is the same program, that program is compiled ONCE and run ``n``
    times (a host callback runs at every call, so its randomness still shows); otherwise the calls
    are eager, as AutoAttack's."""
    # a new function object per trace: JAX caches a function's trace by identity and argument types
    traces = [jax.make_jaxpr(lambda *a: apply(*a), return_shape=True)(params, x, *ks) for _ in range(n)]
    first, shape = traces[0]
    if not all(_same_trace(first, t) for t, _ in traces[1:]):
        outs = [_flat_logits(apply, params, x, *ks) for _ in range(n)]
        return outs, [_flat_logits(apply, params, x, k) for k in others], first
    run = jax.jit(jaxpr_as_fun(first))
    out_tree = jax.tree.structure(shape)

    def flat(args):
        (z,) = jax.tree.leaves(jax.tree.unflatten(out_tree, run(*args)))
        z = np.asarray(z, np.float64)
        return z.reshape(-1, z.shape[-1])

    outs = [flat(jax.tree.leaves((params, x, *ks))) for _ in range(n)]
    other = [flat(jax.tree.leaves((params, x, k))) for k in others]  # the same program, another key
    return outs, other, first


def sanity_checks(
    apply: Callable,
    params,
    x,
    y,
    *,
    key,
    version: str = "standard",
    stacked: bool = False,
    n: int = 5,
    warn: bool = True,
) -> list[str]:
    """AutoAttack's sanity checks (``autoattack/checks.py`` and ``flags_doc.md``) for a JAX model.

    Each check that fires emits an :class:`AutoAttackWarning` (``warnings.warn``) carrying
    AutoAttack's advice and the version to run instead:

    * randomness (``check_randomized``): ``apply(params, x)`` is traced ``n`` times (Python runs
      each time, so host-side randomness or state shows as a different program or different
      constants) and, when every trace is the same program, that program is compiled once and run
      ``n`` times (a host callback's randomness shows at run time); traces that differ are called
      ``n`` times eagerly, as AutoAttack's check does; outputs that differ by more than ``1e-4`` after
      L2 normalisation, or a changing number of correct predictions, mean a randomized defense:
      run ``version="rand"`` with the randomness drawn from an explicit key,
      ``apply(params, x, key)`` (e.g. :func:`sarjax.attacks.eot.with_input_noise`). With
      ``version="rand"``: outputs that differ under ONE fixed key (randomness the key does not
      control: EOT cannot pair or reproduce its draws) and outputs that do NOT differ under
      different keys (a deterministic model: run ``"standard"``, 20 times cheaper) both warn.
    * hidden randomness or host state (the JAX counterpart of ``check_dynamic``): random-number
      primitives or host callbacks in the traced ``apply(params, x)`` (a model that draws its own
      randomness from a key it makes itself, or calls the host): use ``version="rand"`` with an
      explicit key, or an adaptive attack for a dynamic defense.
    * probabilities (``check_range_output``): outputs in ``[0, 1]`` whose rows sum to 1 (within
      ``1e-5``): the gradient attacks need logits (numerically stable losses); pass the
      pre-softmax outputs.
    * zero or non-finite gradients (``check_zero_gradients``; AutoAttack checks the DLR loss's
      gradient at APGD's start): the input gradient of the DLR loss (CE with fewer than 3 classes)
      at ``x`` is all zero or not finite for some correctly classified point: gradient attacks cannot progress
      (quantisation, saturated softmax): use BPDA or rely on the black-box Square stage, and
      check the standard version's Square warning.
    * no gradient: JAX cannot differentiate the loss at all (a ``jax.pure_callback`` or
      ``io_callback`` without a ``custom_vjp``, a reverse-mode ``while_loop``): the error is named
      instead of raised; the gradient stages will fail, Square alone can run.
    * classes (``check_n_classes``): fewer classes than DLR (3), targeted DLR (4) or the targets
      (``9 + 1``) need.

    Args:
      apply: ``apply(params, x) -> [B, C]`` / ``[M, B, C]`` (stacked: one member's apply), or with
        ``version="rand"`` the stochastic ``apply(params, x, key)``.
      params: the model's params (stacked on a leading member axis with ``stacked=True``).
      x: ``[B, *S]`` a batch of inputs (AutoAttack checks its first batch).
      y: ``[B]`` int labels.
      key: PRNG key for the stochastic apply's draws.
      version: the version about to run.
      stacked: as in :func:`autoattack`.
      n: repetitions of the randomness check (AutoAttack: 5).
      warn: emit the warnings (False: only return the messages).

    Returns:
      The messages of the checks that fired (empty for a plain deterministic logits model).
    """
    if version not in VERSIONS:
        raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
    x = jnp.asarray(x, jnp.float32)
    y = np.asarray(y)
    msgs: list[str] = []
    if stacked:  # the checks look at member 0 (selected inside the traced model: no eager program)
        apply = _member0(apply)

    rand = version == "rand"
    ks = (jax.random.fold_in(key, 0),) if rand else ()

    def normed(z):
        return z / (np.linalg.norm(z, axis=-1, keepdims=True) + 1e-10)

    others = (jax.random.fold_in(key, 1),) if rand else ()
    outs, other_outs, jaxpr = _repeated_logits(apply, params, x, ks, n, others)
    diff = max(float(np.max(np.linalg.norm(normed(a) - normed(outs[0]), axis=-1))) for a in outs)
    ncorrect = {int(np.sum(np.argmax(a, -1) == np.resize(y, a.shape[0]))) for a in outs}
    if diff > RANDOMIZED_RTOL or len(ncorrect) > 1:
        if rand:
            msgs.append(
                "the model's outputs change between calls with the SAME key: its randomness is not drawn "
                "from the key (hidden state or host randomness), so EOT cannot average or reproduce it; make "
                "apply(params, x, key) draw every random number from key"
            )
        else:
            msgs.append(
                "it seems to be a randomized defense: its outputs change between calls on the same input "
                "(AutoAttack: use version='rand'); in sarjax make the model stochastic through an explicit "
                "key, apply(params, x, key) (e.g. sarjax.attacks.with_input_noise), and run version='rand' "
                "(APGD-CE and APGD-DLR with EOT over 20 draws)"
            )
    if rand:
        (other,) = other_outs
        if float(np.max(np.linalg.norm(normed(other) - normed(outs[0]), axis=-1))) <= RANDOMIZED_RTOL:
            msgs.append(
                "version='rand' but the model's outputs do not change with the key: it looks deterministic; "
                "run version='standard' (EOT over 20 draws of a deterministic model only costs 20 times "
                "the queries)"
            )
    else:
        prims = _primitives(jaxpr.jaxpr)
        rng = sorted(p for p in prims if "random" in p or "threefry" in p or p in ("rng_bit_generator", "rng_uniform"))
        cb = sorted(p for p in prims if "callback" in p)
        if rng:
            msgs.append(
                f"the model draws random numbers inside apply(params, x) ({', '.join(rng)}) from a key it makes "
                "itself: a stochastic defense whose randomness the attack cannot see; expose the key, "
                "apply(params, x, key), and run version='rand'"
            )
        if cb:
            msgs.append(
                f"the model calls the host inside apply ({', '.join(cb)}): it may be dynamic or stateful "
                "(AutoAttack's dynamic-defense flag): AutoAttack's evaluation might be insufficient; "
                "consider an adaptive attack"
            )
    z = outs[0]
    if (
        z.max() < 1.0 + PROBABILITY_ATOL
        and z.min() > -PROBABILITY_ATOL
        and np.all(np.abs(z.sum(-1) - 1.0) < PROBABILITY_ATOL)
    ):
        msgs.append(
            "it seems that the output is a probability distribution (rows in [0, 1] summing to 1): the "
            "attacks need logits; pass the pre-softmax outputs (probabilities make the losses numerically "
            "unstable and can hide the gradient)"
        )
    c = z.shape[-1]
    gz, gnan, gerr = _zero_gradients(apply, params, x, y, ks, z)
    if gerr is not None:
        msgs.append(
            f"JAX cannot differentiate the model's {'DLR' if c >= 3 else 'CE'} loss with respect to its input "
            f"({gerr}): the gradient stages (APGD, FAB) will fail on it; give a host call a differentiation "
            "rule (jax.custom_vjp / custom_jvp) or run the black-box stage alone (attacks=['square'])"
        )
    if gz or gnan:
        msgs.append(
            f"{gz} point(s) with an all-zero and {gnan} with a non-finite input gradient of the "
            f"{'DLR' if c >= 3 else 'CE'} loss: gradient-based attacks cannot progress there (a "
            "non-differentiable or saturating component); use BPDA or a black-box attack, and "
            "trust the Square stage of version='standard' over the gradient stages"
        )
    if c < 3 and version != "standard":
        msgs.append(f"with only {c} classes the DLR loss is not defined: the APGD-DLR stage is skipped")
    elif c < 4 and version in ("standard", "plus"):
        msgs.append(f"with only {c} classes the targeted DLR loss is not defined: the APGD-T stage is skipped")
    elif c - 1 < N_TARGETS and version in ("standard", "plus"):
        msgs.append(f"{N_TARGETS} target classes requested but only {c - 1} exist: APGD-T and FAB-T use {c - 1}")
    if warn:
        for msg in msgs:
            warnings.warn(msg, AutoAttackWarning, stacklevel=2)
    return msgs


def _member0(apply: Callable) -> Callable:
    """``apply`` on member 0 of stacked params (the slice traced with the model)."""

    def member(p, xx, *k):
        return apply(jax.tree.map(lambda a: a[0], p), xx, *k)

    return member


def _primitives(jaxpr) -> set[str]:
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                inner = getattr(sub, "jaxpr", None)
                if inner is not None:
                    names |= _primitives(getattr(inner, "jaxpr", inner))
    return names


def _zero_gradients(apply, params, x, y, ks, z_flat):
    """(points with an all-zero input gradient, with a non-finite one, why JAX could not take it
    or None) for the correctly classified points; ``z_flat`` ``[M * B, C]``: the model's logits
    at ``x``. The gradient is one jitted program (eagerly, one program per operation)."""
    c = z_flat.shape[-1]

    def loss(xx, p, yj, *k):
        z = apply(p, xx, *k)
        z = jnp.swapaxes(z.reshape(-1, xx.shape[0], z.shape[-1]), 0, 1)  # [B, M, C]
        f = dlr if c >= 3 else cross_entropy
        return jnp.sum(jax.vmap(lambda zb, yb: f(zb, jnp.full((zb.shape[0],), yb)))(z, yj))

    try:
        g = np.asarray(jax.jit(jax.grad(loss))(x, params, jnp.asarray(y, jnp.int32), *ks)).reshape(x.shape[0], -1)
    except Exception as e:  # a diagnostic: report why (e.g. "Pure callbacks do not support JVP"), do not crash
        first = (str(e).strip().splitlines() or [""])[0]
        return 0, 0, f"{type(e).__name__}: {first}"
    z = z_flat.reshape(-1, x.shape[0], c)
    right = np.all(np.argmax(z, -1) == np.asarray(y)[None], axis=0)  # AutoAttack checks the points it attacks
    finite = np.isfinite(g).all(axis=1)
    return int(np.sum(right & finite & (np.abs(g).sum(axis=1) == 0))), int(np.sum(right & ~finite)), None


__all__ = ["N_TARGETS", "PROBABILITY_ATOL", "RANDOMIZED_RTOL", "VERSIONS", "AutoAttackWarning", "sanity_checks"]
