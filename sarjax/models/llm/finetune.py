"""Causal-LM supervised fine-tuning of a stacked pool, vmapped over members.

Each member trains on the same (prompt, response) set with its own data order
(permutations from ``fold_in(key, member)``); the loss is the mean NLL of the
response tokens only. The whole run (all members, all steps) is one jitted
``vmap(scan)``. This is how distilled descendant pools are made: fine-tune
members on a teacher's (prompt, generation) trajectories.
"""

from collections.abc import Sequence
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sarjax.models.llm import decoder
from sarjax.models.llm.config import DecoderConfig


class SFTData(NamedTuple):
    """Packed (prompt, response) pairs, left-padded.

    Attributes:
      ids: [N, T] int32 prompt + response ids.
      mask: [N, T] int32 padding mask.
      loss_mask: [N, T] float32, 1 at response tokens (the tokens predicted).
    """

    ids: Any
    mask: Any
    loss_mask: Any


def make_sft_data(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_id: int = 0,
    length: int | None = None,
) -> SFTData:
    """Packs token-id pairs into ``SFTData`` (left padding to ``length`` or the longest).

    Raises:
      ValueError: different numbers of prompts and responses, an empty prompt or
        response, or a pair longer than ``length``.
    """
    if len(prompts) != len(responses) or not prompts:
        raise ValueError(f"expected equally many prompts and responses (>0), got {len(prompts)} and {len(responses)}")
    seqs = []
    for p, r in zip(prompts, responses):
        if len(p) == 0 or len(r) == 0:
            raise ValueError("every prompt and response needs at least one token")
        seqs.append((list(p), list(r)))
    t = max(len(p) + len(r) for p, r in seqs)
    if length is not None:
        if length < t:
            raise ValueError(f"length={length} is shorter than the longest pair ({t} tokens)")
        t = length
    n = len(seqs)
    ids = np.full((n, t), pad_id, np.int32)
    mask = np.zeros((n, t), np.int32)
    lm = np.zeros((n, t), np.float32)
    for i, (p, r) in enumerate(seqs):
        k = len(p) + len(r)
        ids[i, t - k :] = p + r
        mask[i, t - k :] = 1
        lm[i, t - len(r) :] = 1.0
    return SFTData(ids, mask, lm)


def sft_loss(params, cfg: DecoderConfig, ids, mask, loss_mask):
    """Mean response-token NLL of a batch for ONE model.

    Args:
      params: one model's parameters.
      cfg: configuration.
      ids: [B, T] int32; mask: [B, T]; loss_mask: [B, T] (1 at predicted response tokens).

    Returns:
      Scalar float32 loss.
    """
    lg = jax.vmap(lambda i, m: decoder.logits(params, cfg, i, m))(ids, mask)[:, :-1]
    tgt = ids[:, 1:]
    nll = jax.nn.logsumexp(lg, -1) - jnp.take_along_axis(lg, tgt[..., None], -1)[..., 0]
    w = loss_mask[:, 1:].astype(jnp.float32)
    return jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1.0)


@partial(jax.jit, static_argnames=("cfg", "optimizer", "num_steps", "batch_size"))
def _train(params, cfg, data, optimizer, num_steps, batch_size, key):
    n = data.ids.shape[0]
    per_epoch = n // batch_size
    m = jax.tree.leaves(params)[0].shape[0]

    def member(p, k):
        opt = optimizer.init(p)

        def step(carry, s):
            p, opt = carry
            perm = jax.random.permutation(jax.random.fold_in(k, s // per_epoch), n)
            idx = jax.lax.dynamic_slice_in_dim(perm, (s % per_epoch) * batch_size, batch_size)
            batch = jax.tree.map(lambda a: a[idx], data)
            loss, g = jax.value_and_grad(sft_loss)(p, cfg, *batch)
            upd, opt = optimizer.update(g, opt, p)
            return (optax.apply_updates(p, upd), opt), loss

        (p, _), losses = jax.lax.scan(step, (p, opt), jnp.arange(num_steps))
        return p, losses

    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(m))
    return jax.vmap(member)(params, keys)


def sft_pool(
    params,
    cfg: DecoderConfig,
    data: SFTData,
    num_steps: int,
    batch_size: int,
    key,
    optimizer: optax.GradientTransformation | None = None,
):
    """Fine-tunes every member of a stacked pool on ``data`` (response-only loss).

    Args:
      params: stacked parameters [M, ...].
      cfg: the stack's configuration.
      data: ``SFTData`` with N pairs.
      num_steps: optimizer steps per member.
      batch_size: pairs per step (<= N); each member draws its own permutation
        of the N pairs every epoch.
      key: PRNG key; member m uses ``fold_in(key, m)``.
      optimizer: optax transformation (default ``optax.adamw(1e-3)``; a hashable
        object, since it is a static argument: build it once and reuse it).

    Returns:
      (new_params [M, ...], losses [M, num_steps] float32).

    Raises:
      ValueError: batch_size not in [1, N] or num_steps < 1.
    """
    n = int(np.shape(data.ids)[0])
    if not 1 <= batch_size <= n:
        raise ValueError(f"batch_size must be in [1, N={n}], got {batch_size}")
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    optimizer = optimizer or _DEFAULT_OPT
    data = SFTData(*(jnp.asarray(a) for a in data))
    return _train(params, cfg, data, optimizer, int(num_steps), int(batch_size), key)


_DEFAULT_OPT = optax.adamw(1e-3)


def save_params(path: str, params) -> None:
    """Saves a (stacked) parameter tree with orbax to the absolute folder ``path``."""
    import orbax.checkpoint as ocp  # heavy (about 2 s): imported only to save / restore params

    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(path, params)


def restore_params(path: str, like=None):
    """Restores a tree saved by ``save_params`` (``like``: optional target tree for shapes/dtypes)."""
    import orbax.checkpoint as ocp  # heavy (about 2 s): imported only to save / restore params

    with ocp.StandardCheckpointer() as ckpt:
        if like is None:
            return ckpt.restore(path)
        return ckpt.restore(path, jax.tree.map(ocp.utils.to_shape_dtype_struct, like))
