"""LLM pools on a device mesh: members over ``pool``, each member tensor-parallel over ``model``,
requests over ``data``.

The mesh has three axes, ``("pool", "model", "data")`` (:func:`llm_mesh`). A stack's params
``[M, ...]`` put their leading member axis on ``pool`` and shard each member's weights over
``model`` the way Megatron-LM (Shoeybi et al. 2019) and MaxText shard a decoder
(:func:`llm_param_specs`):

* attention: the query heads (``wq`` / ``bq`` columns) and the input rows of ``wo``; the key /
  value heads (``wk``, ``wv``, ``bk``, ``bv``) when ``num_kv_heads`` is a multiple of the
  ``model`` axis, else replicated (grouped-query attention with fewer kv heads than devices:
  every device keeps all kv heads, which are the small part);
* MLP: the columns of ``w_gate`` / ``w_up`` (and their biases), the rows of ``w_down``;
* vocabulary: the rows of ``embed`` and the columns of ``lm_head`` (logits come out
  vocabulary-sharded);
* replicated: every norm (``attn_norm``, ``mlp_norm``, ``final_norm``, Qwen3's ``q_norm`` /
  ``k_norm``), the output biases ``bo`` / ``b_down`` (added after the all-reduce), GPT-2's
  learned positions, and GPT-2's fused attention (``w_qkv`` / ``b_qkv`` / ``wo`` / ``bo``: its
  ``[q | k | v]`` columns are not grouped by head, so GPT-2 shards its MLP and vocabulary only).

The model code (:mod:`~sarjax.models.llm.decoder`) carries no sharding annotations: XLA's
propagation (GSPMD) carries the params' shardings through it, so every function of the package
runs on placed params unchanged, and the entries here (:func:`mesh_logits`,
:func:`mesh_target_nll`, :func:`mesh_greedy_generate`) pin the inputs and outputs with sharding
constraints. Members run under ``vmap`` (no Python loop over members).

Numerics: the ``model`` axis splits the contractions over heads (``wo``), over the MLP width
(``w_down``) and over the vocabulary (the embedding lookup) into per-device partial sums added by
an all-reduce, so the float32 sums are added in another order than on one device; results then
agree to float32 rounding, not bit for bit (tests/llm/test_llm_mesh.py states the measured
tolerance). With ``model=1`` nothing is split inside a member.

Example::

    mesh = llm_mesh(pool=2, model=2, data=2)          # 8 devices
    placed = shard_llm_pool(pool, mesh)               # each stack's params placed
    st = placed.stacks[0]
    lg = mesh_logits(st.params, st.cfg, ids, mask, mesh=mesh)                 # [M, B, T, V]
    out = mesh_greedy_generate(st.params, st.cfg, ids, mask, 16, mesh=mesh)   # [M, B, 16]
    res = make_gcg(placed)(pool_params(placed), requests, None, key=key)   # GCG on the placed params
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sarjax.models.llm import decoder, generate, scoring
from sarjax.models.llm.config import DecoderConfig
from sarjax.models.llm.pool import LLMPool

AXES = ("pool", "model", "data")

# which dimension of ONE member's weight (no member axis; per-layer weights carry [L] first) goes
# on "model", as (dimension, what must divide it)
_LLAMA_LAYER = {
    "wq": (-1, "heads"),
    "bq": (-1, "heads"),
    "wk": (-1, "kv_heads"),
    "bk": (-1, "kv_heads"),
    "wv": (-1, "kv_heads"),
    "bv": (-1, "kv_heads"),
    "wo": (-2, "heads"),
    "bo": None,
    "attn_norm": None,
    "mlp_norm": None,
    "q_norm": None,
    "k_norm": None,
    "w_gate": (-1, "ffn"),
    "b_gate": (-1, "ffn"),
    "w_up": (-1, "ffn"),
    "b_up": (-1, "ffn"),
    "w_down": (-2, "ffn"),
    "b_down": None,
}
_GPT2_LAYER = {
    "ln1": None,
    "ln1_b": None,
    "ln2": None,
    "ln2_b": None,
    "w_qkv": None,
    "b_qkv": None,
    "wo": None,
    "bo": None,
    "w_fc": (-1, "ffn"),
    "b_fc": (-1, "ffn"),
    "w_proj": (-2, "ffn"),
    "b_proj": None,
}
_TOP = {
    "embed": (0, "vocab"),
    "lm_head": (-1, "vocab"),
    "final_norm": None,
    "final_norm_b": None,
    "pos_embed": None,
}


def llm_mesh(pool: int = 1, model: int = 1, data: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
    """A ``("pool", "model", "data")`` mesh.

    Args:
      pool: devices on the member axis (each holds ``M / pool`` members of a stack).
      model: devices each member's weights are split over (tensor parallelism).
      data: devices the requests (token batches) are split over.
      devices: the devices to use, exactly ``pool * model * data`` of them (default: the first
        ``pool * model * data`` of ``jax.devices()``).

    Returns:
      The mesh (every axis ``AxisType.Auto``: XLA propagates the shardings through the model code).

    Raises:
      ValueError: an axis size below 1, or a device count other than ``pool * model * data``
        (naming the counts).
    """
    sizes = {"pool": pool, "model": model, "data": data}
    for k, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"llm_mesh: {k} must be an int >= 1, got {v!r}")
    need = int(pool) * int(model) * int(data)
    if devices is None:
        avail = jax.devices()
        if need > len(avail):
            raise ValueError(
                f"llm_mesh: pool={pool} x model={model} x data={data} needs {need} devices, {len(avail)} available"
            )
        devs = list(avail[:need])
    else:
        devs = list(np.asarray(devices, dtype=object).ravel())
        if len(devs) != need:
            raise ValueError(
                f"llm_mesh: pool={pool} x model={model} x data={data} needs {need} devices, {len(devs)} were given"
            )
    auto = jax.sharding.AxisType.Auto
    return jax.make_mesh((int(pool), int(model), int(data)), AXES, axis_types=(auto,) * 3, devices=devs)


def _sizes(mesh: Mesh | None, pool: int, model: int) -> tuple[int, int]:
    if mesh is None:
        return int(pool), int(model)
    missing = [a for a in ("pool", "model") if a not in mesh.shape]
    if missing:
        raise ValueError(f"expected a mesh with axes {AXES} (llm_mesh), got axes {tuple(mesh.shape)}")
    return int(mesh.shape["pool"]), int(mesh.shape["model"])


def _leaf_name(path) -> tuple[str, bool]:
    """(weight name, inside "layers") of a params path."""
    keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
    return str(keys[-1]), "layers" in keys[:-1]


def llm_param_specs(
    params,
    cfg: DecoderConfig,
    mesh: Mesh | None = None,
    *,
    pool: int = 1,
    model: int = 1,
    stacked: bool = True,
):
    """The ``PartitionSpec`` of every weight of a (stacked) LLM params tree.

    Only shapes are read, so ``params`` may be abstract (a ``jax.ShapeDtypeStruct`` tree, e.g.
    :func:`abstract_llm_params`): the specs of an 8B pool are computed without allocating it.

    Args:
      params: the params tree of one stack, ``[M, ...]`` per leaf (``stacked``), or of one model.
      cfg: the stack's configuration (its head, kv-head, MLP and vocabulary sizes are checked).
      mesh: the mesh whose ``pool`` / ``model`` sizes to check against (default: ``pool`` and
        ``model`` below).
      pool, model: axis sizes when no mesh is given.
      stacked: the leaves carry a leading member axis ``[M]`` (put on ``"pool"``).

    Returns:
      A tree of ``PartitionSpec`` with the structure of ``params`` (see the module docstring for
      what is sharded). The kv heads go on ``"model"`` when ``num_kv_heads % model == 0`` and are
      replicated otherwise.

    Raises:
      ValueError: sizes that the axes do not divide, naming every such weight, its dimension and
        the axis size (members ``M`` by ``pool``; query heads, MLP width or vocabulary by
        ``model``); a weight the decoder does not have (named).
    """
    n_pool, n_model = _sizes(mesh, pool, model)
    layer_rules = _GPT2_LAYER if cfg.family == "gpt2" else _LLAMA_LAYER
    divides = {
        "heads": (cfg.num_heads, "num_heads"),
        "kv_heads": (cfg.num_kv_heads, "num_kv_heads"),
        "ffn": (cfg.intermediate_size, "intermediate_size"),
        "vocab": (cfg.vocab_size, "vocab_size"),
    }
    lead = 1 if stacked else 0

    def spec(path, leaf):
        name, in_layers = _leaf_name(path)
        rules = layer_rules if in_layers else _TOP
        where = "layers/" if in_layers else ""
        if name not in rules:
            raise ValueError(f"llm_param_specs: unknown weight {where}{name!r} for a {cfg.family}-family decoder")
        shape = tuple(leaf.shape)
        axes: list[str | None] = [None] * len(shape)
        if stacked:
            if not shape or shape[0] % n_pool:
                bad.append(
                    f"{where}{name} has {shape[0] if shape else 0} members (dim 0), not divisible by the pool axis size {n_pool}"
                )
            axes[0] = "pool"
        rule = rules[name]
        if rule is not None and n_model > 1:
            dim, what = rule
            count, field = divides[what]
            d = lead + dim if dim >= 0 else len(shape) + dim
            if not lead <= d < len(shape):
                raise ValueError(f"llm_param_specs: {name} of shape {shape} has no dimension {dim} to shard")
            if count % n_model:
                if what == "kv_heads":
                    rule = None  # GQA with fewer kv heads than the model axis: replicated
                else:
                    bad.append(
                        f"{where}{name} dim {d} ({field}={count} of size {shape[d]}) is not "
                        f"divisible by the model axis size {n_model}"
                    )
            if rule is not None:
                axes[d] = "model"
        return P(*axes)

    bad: list[str] = []
    specs = jax.tree_util.tree_map_with_path(spec, params)
    if bad:
        raise ValueError(f"llm_param_specs: {len(bad)} weight(s) do not divide: " + "; ".join(bad))
    return specs


def _is_spec(x) -> bool:
    return isinstance(x, P)


def llm_param_shardings(params, cfg: DecoderConfig, mesh: Mesh, *, stacked: bool = True):
    """``NamedSharding`` tree of :func:`llm_param_specs` on ``mesh`` (for ``jit`` / ``device_put``)."""
    specs = llm_param_specs(params, cfg, mesh, stacked=stacked)
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=_is_spec)


def shard_llm_params(params, cfg: DecoderConfig, mesh: Mesh, *, stacked: bool = True):
    """Places a stack's params on ``mesh`` (members on ``"pool"``, weights split over ``"model"``).

    Args:
      params: a stacked params tree ``[M, ...]`` (or one model's with ``stacked=False``).
      cfg: its configuration.
      mesh: an :func:`llm_mesh` mesh.

    Returns:
      The same tree of ``jax.Array`` placed with :func:`llm_param_shardings` (each device holds
      ``1 / (pool * model)`` of a sharded weight).

    Raises:
      ValueError: as :func:`llm_param_specs`.
    """
    return jax.device_put(params, llm_param_shardings(params, cfg, mesh, stacked=stacked))


def shard_llm_pool(pool: LLMPool, mesh: Mesh) -> LLMPool:
    """A copy of ``pool`` whose every stack's params are placed by :func:`shard_llm_params`.

    Names, configs, tokenizers and decoding defaults are the pool's; every function taking an
    :class:`~sarjax.models.llm.pool.LLMPool` or a stack's params (scoring, decoding, the text
    attacks such as :func:`~sarjax.attacks.text.gcg.make_gcg`) then runs with the
    weights sharded (XLA propagates the params' shardings; inputs those functions build on the
    host are replicated, so only :func:`mesh_logits`, :func:`mesh_target_nll` and
    :func:`mesh_greedy_generate` split the requests over ``"data"``).

    Raises:
      ValueError: a stack whose member count the ``pool`` axis does not divide (or a weight the
        ``model`` axis does not divide), naming the stack.
    """
    stacks = []
    for s in pool.stacks:
        try:
            params = shard_llm_params(s.params, s.cfg, mesh)
        except ValueError as e:
            raise ValueError(f"stack {s.names}: {e}") from None
        stacks.append(dataclasses.replace(s, params=params))
    return LLMPool(tuple(stacks))


def request_sharding(mesh: Mesh) -> NamedSharding:
    """Requests / token batches ``[B, ...]`` split over ``"data"`` (``B`` a multiple of its size)."""
    return NamedSharding(mesh, P("data"))


def _pad_rows(a: np.ndarray, multiple: int) -> np.ndarray:
    """Pads a batch [B, ...] to a multiple of ``multiple`` rows with copies of its first row."""
    extra = (-a.shape[0]) % multiple
    return np.concatenate([a, np.repeat(a[:1], extra, axis=0)]) if extra else a


def _constrain_params(params, cfg, mesh):
    return jax.tree.map(jax.lax.with_sharding_constraint, params, llm_param_shardings(params, cfg, mesh))


def _spec(mesh, *axes):
    return NamedSharding(mesh, P(*axes))


@functools.partial(jax.jit, static_argnames=("cfg", "mesh"))
def _mesh_logits(params, cfg, ids, mask, *, mesh):
    params = _constrain_params(params, cfg, mesh)
    ids = jax.lax.with_sharding_constraint(ids, _spec(mesh, "data"))
    mask = jax.lax.with_sharding_constraint(mask, _spec(mesh, "data"))
    out = jax.vmap(lambda p: jax.vmap(lambda i, m: decoder.logits(p, cfg, i, m))(ids, mask))(params)
    vocab = "model" if cfg.vocab_size % mesh.shape["model"] == 0 else None
    return jax.lax.with_sharding_constraint(out, _spec(mesh, "pool", "data", None, vocab))


def _check_batch(name: str, a, ndim: int) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-d array, got shape {a.shape}")
    if a.shape[0] < 1:
        raise ValueError(f"{name}: expected at least one row, got shape {a.shape}")
    return a


def mesh_logits(params, cfg: DecoderConfig, ids, mask, *, mesh: Mesh) -> jax.Array:
    """Logits of every member of a stack on a batch of sequences, on ``mesh``.

    Args:
      params: stacked params ``[M, ...]`` (placed by :func:`shard_llm_params`, or not: they are
        constrained to :func:`llm_param_specs` inside).
      cfg: the stack's configuration.
      ids: ``[B, T]`` int token ids (left padding allowed); split over ``"data"`` (``B`` is
        padded to a multiple of its size with copies of row 0, cut off again).
      mask: ``[B, T]`` 0/1 padding mask.
      mesh: an :func:`llm_mesh` mesh.

    Returns:
      ``[M, B, T, V]`` float32, sharded ``("pool", "data", None, "model")``.

    Raises:
      ValueError: shapes; an id outside the vocabulary; a mask row that is not left-padded or
        has no real token; as :func:`llm_param_specs`.
    """
    ids = _check_batch("ids", ids, 2)
    mask = _check_batch("mask", mask, 2)
    if mask.shape != ids.shape:
        raise ValueError(f"mask: expected shape {ids.shape}, got {mask.shape}")
    decoder.check_token_ids("ids", ids, cfg.vocab_size)
    m = decoder.check_padding("mask", mask, "left")
    decoder.check_positions(cfg, "ids", m.sum(-1))
    b = ids.shape[0]
    n = mesh.shape["data"]
    dev = request_sharding(mesh)
    ids_p = jax.device_put(_pad_rows(ids.astype(np.int32), n), dev)
    mask_p = jax.device_put(_pad_rows(m.astype(np.int32), n), dev)
    out = _mesh_logits(params, cfg, ids_p, mask_p, mesh=mesh)
    return out if out.shape[1] == b else out[:, :b]


@functools.partial(jax.jit, static_argnames=("cfg", "mesh"))
def _mesh_nll(params, cfg, ids, mask, target, target_mask, *, mesh):
    params = _constrain_params(params, cfg, mesh)
    ids, mask = (jax.lax.with_sharding_constraint(a, _spec(mesh, "data")) for a in (ids, mask))
    target, target_mask = (jax.lax.with_sharding_constraint(a, _spec(mesh, "data")) for a in (target, target_mask))

    def member(p):
        return jax.vmap(lambda i, m, t, tm: scoring.target_nll(p, cfg, i, m, t, tm))(ids, mask, target, target_mask)

    return jax.lax.with_sharding_constraint(jax.vmap(member)(params), _spec(mesh, "pool", "data"))


def mesh_target_nll(params, cfg: DecoderConfig, ids, mask, target, target_mask=None, *, mesh: Mesh) -> jax.Array:
    """Per-token target NLL of every member of a stack (:func:`~sarjax.models.llm.scoring.stack_target_nll`)
    on ``mesh``, the candidates split over ``"data"``.

    Args:
      params: stacked params ``[M, ...]``.
      cfg: configuration.
      ids: ``[N, T]`` int32 candidate prompts, left-padded; mask: ``[N, T]`` 0/1.
      target: ``[Tt]`` (shared) or ``[N, Tt]`` target ids, right-padded; target_mask: like
        ``target`` (default all ones).
      mesh: an :func:`llm_mesh` mesh.

    Returns:
      ``[M, N, Tt]`` float32, sharded ``("pool", "data")``.

    Raises:
      ValueError / TypeError: as :func:`~sarjax.models.llm.scoring.stack_target_nll`.
    """
    ids = _check_batch("ids", ids, 2)
    target = np.asarray(target)
    if target.ndim not in (1, 2) or (target.ndim == 2 and target.shape[0] != ids.shape[0]):
        raise ValueError(f"target: expected [Tt] or [N={ids.shape[0]}, Tt], got shape {target.shape}")
    target_mask = np.ones(target.shape, np.int32) if target_mask is None else np.asarray(target_mask)
    if target_mask.shape != target.shape:
        raise ValueError(f"target_mask: expected shape {target.shape}, got {target_mask.shape}")
    # the one-device entry's checks (ids, padding, positions), on the host
    decoder.check_token_ids("ids", ids, cfg.vocab_size)
    decoder.check_token_ids("target", target, cfg.vocab_size)
    mask = _check_batch("mask", mask, 2)
    if mask.shape != ids.shape:
        raise ValueError(f"mask: expected shape {ids.shape}, got {mask.shape}")
    m = decoder.check_padding("mask", mask, "left")
    tm = decoder.check_padding("target_mask", target_mask, "right", allow_empty=True)
    decoder.check_positions(cfg, "ids + target", m.sum(-1) + tm.sum(-1))
    b = ids.shape[0]
    if target.ndim == 1:
        target, tm = np.broadcast_to(target, (b,) + target.shape), np.broadcast_to(tm, (b,) + tm.shape)
    n = mesh.shape["data"]
    dev = request_sharding(mesh)
    arrs = [jax.device_put(_pad_rows(np.asarray(a, np.int32), n), dev) for a in (ids, m, target, tm)]
    out = _mesh_nll(params, cfg, *arrs, mesh=mesh)
    return out if out.shape[1] == b else out[:, :b]


@functools.partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "mesh"))
def _mesh_greedy(params, cfg, ids, mask, eos, pad_id, *, max_new_tokens, mesh):
    params = _constrain_params(params, cfg, mesh)
    ids = jax.lax.with_sharding_constraint(ids, _spec(mesh, "data"))
    mask = jax.lax.with_sharding_constraint(mask, _spec(mesh, "data"))

    def member(p):
        return jax.vmap(lambda i, m: generate.greedy_one(p, cfg, i, m, max_new_tokens, eos, pad_id))(ids, mask)

    return jax.lax.with_sharding_constraint(jax.vmap(member)(params), _spec(mesh, "pool", "data"))


def mesh_greedy_generate(
    params,
    cfg: DecoderConfig,
    ids,
    mask=None,
    max_new_tokens: int = 32,
    *,
    mesh: Mesh,
    eos_id: int | Sequence[int] | None = None,
    pad_id: int = 0,
) -> jax.Array:
    """Greedy decoding (:func:`~sarjax.models.llm.generate.stack_greedy_generate`) of a batch by
    every member of a stack on ``mesh``: members on ``"pool"``, weights and KV cache heads on
    ``"model"``, prompts on ``"data"``.

    Args:
      params: stacked params ``[M, ...]``.
      cfg: configuration.
      ids: ``[B, P]`` int32 prompts, left-padded; mask: ``[B, P]`` 0/1 (default all ones).
      max_new_tokens: tokens to produce.
      mesh: an :func:`llm_mesh` mesh.
      eos_id, pad_id: as in :func:`~sarjax.models.llm.generate.greedy_generate`.

    Returns:
      ``[M, B, max_new_tokens]`` int32, sharded ``("pool", "data")``.

    Raises:
      ValueError / TypeError: as :func:`~sarjax.models.llm.generate.greedy_generate`.
    """
    ids_j, mask_j = generate._validate(cfg, ids, mask, max_new_tokens)
    eos = generate._eos_array(cfg, eos_id)
    b = ids_j.shape[0]
    n = mesh.shape["data"]
    dev = request_sharding(mesh)
    ids_p = jax.device_put(_pad_rows(np.asarray(ids_j), n), dev)
    mask_p = jax.device_put(_pad_rows(np.asarray(mask_j), n), dev)
    out = _mesh_greedy(params, cfg, ids_p, mask_p, eos, jnp.int32(pad_id), max_new_tokens=max_new_tokens, mesh=mesh)
    return out if out.shape[1] == b else out[:, :b]


def abstract_llm_params(cfg: DecoderConfig, members: int | None = None, dtype=jnp.bfloat16):
    """The params tree of ``cfg`` as ``jax.ShapeDtypeStruct`` leaves (nothing allocated).

    Args:
      cfg: configuration.
      members: a stack of this many members (leading ``[M]``), or None for one model.
      dtype: the weights' dtype.

    Returns:
      A tree with :func:`~sarjax.models.llm.decoder.init_params`'s layout, for
      :func:`llm_param_specs` and memory estimates.
    """
    one = jax.eval_shape(lambda k: decoder.init_params(cfg, k, dtype), jax.random.key(0))
    if members is None:
        return one
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct((int(members),) + tuple(s.shape), s.dtype), one)


def bytes_per_device(params, cfg: DecoderConfig, mesh: Mesh | None = None, *, pool: int = 1, model: int = 1) -> int:
    """Bytes of ``params`` (concrete or abstract, stacked) each device holds once placed by
    :func:`shard_llm_params` on a mesh of these ``pool`` / ``model`` sizes (``data`` replicates)."""
    n_pool, n_model = _sizes(mesh, pool, model)
    specs = llm_param_specs(params, cfg, pool=n_pool, model=n_model)
    size = {"pool": n_pool, "model": n_model}

    def one(leaf, spec) -> int:
        n = int(np.prod(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
        for ax in spec:
            if ax is not None:
                n //= size[ax]
        return n

    return int(sum(jax.tree.leaves(jax.tree.map(one, params, specs))))


__all__ = [
    "abstract_llm_params",
    "bytes_per_device",
    "llm_mesh",
    "llm_param_shardings",
    "llm_param_specs",
    "mesh_greedy_generate",
    "mesh_logits",
    "mesh_target_nll",
    "request_sharding",
    "shard_llm_params",
    "shard_llm_pool",
]
