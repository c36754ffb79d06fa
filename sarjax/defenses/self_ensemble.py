"""The multi-resolution self-ensemble of Fort & Lakshminarayanan (2024), scaled to MNIST.

"Ensemble everything everywhere: multi-scale aggregation for adversarial robustness"
(arXiv:2408.05446) builds a classifier from three pieces, each kept here:

1. **Multi-resolution input** (their Sec. 3.1): the image at several resolutions, each down-sampled
   and up-sampled back to the full size, stacked on the channel axis (CIFAR: 32/16/8/4 -> 3 x 4
   channels). Here: 28/14/7 (a 28 x 28 x 1 digit becomes 28 x 28 x 3; :func:`multires_stack`),
   down by averaging ``f x f`` blocks and up by repeating each pixel ``f x f`` times (``f = 28 / r``:
   exact, so a test can build the stack by hand; the paper interpolates).
2. **Stochastic views at train and test time** (their Sec. 3.1: every resolution copy gets its own
   random jitter, noise and colour change): each channel of the stack is shifted by its own random
   integer offset in ``[-jitter, jitter]`` pixels (zero fill) and gets Gaussian noise of
   ``noise_std``, then is clipped to [0, 1]; grey digits have no colour to change. The defaults
   (``jitter=2`` px of 28, ``noise_std=0.1``) are ours, scaled from their CIFAR-sized jitter.
3. **Self-ensemble of intermediate layers with CrossMax** (their Sec. 3.2-3.3 and Algorithm 1):
   a linear head on the flattened activations of each block of ONE backbone (here a 3-block CNN
   and its dense layer: 4 heads), all heads trained jointly (mean cross-entropy over heads), and
   the heads' logits aggregated by :func:`crossmax`.

The model is two pure functions over plain dict params: ``init(key) -> params`` and ``apply(params,
x [B, 28, 28, 1], key=None) -> logits [B, C]`` (with a key: the paper's stochastic test-time
views, the randomized defense an attack must meet with EOT; without one: the deterministic
views, no jitter and no noise). :func:`make_self_ensemble` returns them; :func:`train_self_ensemble`
trains one with a jitted ``lax.scan`` epoch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sarjax.models.stack import BaseStack, register_kind, stack_trees
from sarjax.models.zoo import conv2d, max_pool2
from sarjax.runtime.progress import progress_bar

Params = dict[str, Any]


def crossmax(z: jax.Array, k: int | None = 2) -> jax.Array:
    """CrossMax aggregation of N predictors' logits (Fort & Lakshminarayanan 2024, Algorithm 1).

    1. ``Z <- Z - max_c Z``: subtract each predictor's max over classes (no predictor dominates);
    2. ``Z <- Z - max_n Z``: subtract each class's max over predictors (no class dominates);
    3. per class, the ``k``-th highest value over predictors (their Vickrey-auction motivation: the
       second-highest bid wins; the public reproductions of the self-ensemble use ``k = 2``), or the
       median over predictors when ``k`` is None (Algorithm 1's other choice).

    Args:
      z: [B, N, C] logits of N predictors (N >= k).
      k: which highest value per class to keep (1 = max), or None for the median.

    Returns:
      [B, C] aggregated logits (all <= 0).

    Raises:
      ValueError: z is not 3-D, or k is not in [1, N].
    """
    if z.ndim != 3:
        raise ValueError(f"crossmax expects logits [B, N, C], got shape {list(z.shape)}")
    n = z.shape[1]
    if k is not None and not (isinstance(k, int) and 1 <= k <= n):
        raise ValueError(f"k must be an int in [1, N={n}] or None (median), got {k!r}")
    z = z - jnp.max(z, axis=2, keepdims=True)
    z = z - jnp.max(z, axis=1, keepdims=True)
    if k is None:
        return jnp.median(z, axis=1)
    return -jnp.sort(-z, axis=1)[:, k - 1, :]


@dataclass(frozen=True)
class SelfEnsembleConfig:
    """The self-ensemble's architecture and its stochastic views (module docstring for the sources).

    Attributes:
      resolutions: side lengths of the resolution copies; each divides the input side (28).
      channels: conv channels of the backbone's blocks (3 x 3 conv, ReLU, 2 x 2 max-pool each).
      dense: width of the dense layer after the blocks.
      jitter: maximum random shift in pixels per copy (0 = none).
      noise_std: Gaussian noise standard deviation per copy (0 = none).
      crossmax_k: CrossMax's ``k`` (None = median).
      input_shape: one input's shape (H, W, 1).
      num_classes: number of logits.
    """

    resolutions: tuple[int, ...] = (28, 14, 7)
    channels: tuple[int, ...] = (16, 32, 64)
    dense: int = 128
    jitter: int = 2
    noise_std: float = 0.1
    crossmax_k: int | None = 2
    input_shape: tuple[int, ...] = (28, 28, 1)
    num_classes: int = 10

    def __post_init__(self):
        object.__setattr__(self, "resolutions", tuple(int(r) for r in self.resolutions))
        object.__setattr__(self, "channels", tuple(int(c) for c in self.channels))
        object.__setattr__(self, "input_shape", tuple(int(s) for s in self.input_shape))
        h, w, c = self.input_shape
        if h != w or c != 1:
            raise ValueError(f"input_shape must be square grey (H, H, 1), got {self.input_shape}")
        if not self.resolutions or any(r < 1 or h % r for r in self.resolutions):
            raise ValueError(f"every resolution must divide the input side {h}, got {self.resolutions}")
        if not self.channels or any(ch < 1 for ch in self.channels):
            raise ValueError(f"channels must be positive ints, got {self.channels}")
        if self.jitter < 0 or not self.noise_std >= 0:
            raise ValueError(f"jitter and noise_std must be >= 0, got {self.jitter}, {self.noise_std}")
        if self.crossmax_k is not None and not 1 <= self.crossmax_k <= self.num_heads:
            raise ValueError(f"crossmax_k must be in [1, {self.num_heads}] or None, got {self.crossmax_k}")

    @property
    def num_heads(self) -> int:
        """One head per conv block and one on the dense layer."""
        return len(self.channels) + 1

    def spec(self) -> dict:
        """A JSON-able description; ``SelfEnsembleConfig.from_spec(cfg.spec()) == cfg``."""
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_spec(cls, spec: dict) -> SelfEnsembleConfig:
        """Rebuild from :meth:`spec`."""
        s = dict(spec)
        for k in ("resolutions", "channels", "input_shape"):
            s[k] = tuple(s[k])
        return cls(**s)


def multires_stack(x: jax.Array, resolutions=(28, 14, 7)) -> jax.Array:
    """The multi-resolution input: x [B, H, H, 1] -> [B, H, H, len(resolutions)].

    Channel i is x averaged over ``f x f`` blocks (``f = H / resolutions[i]``) and each block
    value repeated back over its ``f x f`` pixels; resolution H is x itself.
    """
    b, h, w, c = x.shape
    outs = []
    for r in resolutions:
        f = h // r
        down = x.reshape(b, r, f, r, f, c).mean(axis=(2, 4))
        outs.append(jnp.repeat(jnp.repeat(down, f, axis=1), f, axis=2))
    return jnp.concatenate(outs, axis=-1)


def _shift(img: jax.Array, dy: jax.Array, dx: jax.Array, j: int) -> jax.Array:
    """img [H, W] moved by (dy, dx) pixels, zero fill (|dy|, |dx| <= j)."""
    h, w = img.shape
    p = jnp.pad(img, j)
    return jax.lax.dynamic_slice(p, (j - dy, j - dx), (h, w))


def random_views(key: jax.Array, xs: jax.Array, jitter: int, noise_std: float) -> jax.Array:
    """Each channel of each sample shifted by its own random offset in ``[-jitter, jitter]``
    (zero fill), plus Gaussian noise of ``noise_std``, clipped to [0, 1]. xs: [B, H, W, R]."""
    b, h, w, r = xs.shape
    ks, kn = jax.random.split(key)
    if jitter > 0:
        d = jax.random.randint(ks, (2, b, r), -jitter, jitter + 1)
        per = jax.vmap(jax.vmap(lambda im, dy, dx: _shift(im, dy, dx, jitter), in_axes=(2, 0, 0), out_axes=2))
        xs = per(xs, d[0], d[1])
    if noise_std > 0:
        xs = xs + noise_std * jax.random.normal(kn, xs.shape, xs.dtype)
    return jnp.clip(xs, 0.0, 1.0)


def _dense(key, fan_in, fan_out, gain=2.0):
    return {
        "w": jax.random.normal(key, (fan_in, fan_out), jnp.float32) * math.sqrt(gain / fan_in),
        "b": jnp.zeros((fan_out,), jnp.float32),
    }


def init(cfg: SelfEnsembleConfig, key: jax.Array) -> Params:
    """Params of one self-ensemble (He-normal weights, zero biases; heads with gain 1)."""
    keys = iter(jax.random.split(key, 4 * cfg.num_heads + 4))
    h = cfg.input_shape[0]
    cin = len(cfg.resolutions)
    p: Params = {}
    for i, ch in enumerate(cfg.channels):
        w = jax.random.normal(next(keys), (3, 3, cin, ch), jnp.float32) * math.sqrt(2.0 / (9 * cin))
        p[f"conv{i}"] = {"w": w, "b": jnp.zeros((ch,), jnp.float32)}
        h //= 2
        cin = ch
        p[f"head{i}"] = _dense(next(keys), h * h * ch, cfg.num_classes, gain=1.0)
    p["dense"] = _dense(next(keys), h * h * cin, cfg.dense)
    p[f"head{len(cfg.channels)}"] = _dense(next(keys), cfg.dense, cfg.num_classes, gain=1.0)
    return p


def head_logits(
    cfg: SelfEnsembleConfig, params: Params, x: jax.Array, key: jax.Array | None = None, *, fixed: bool = False
) -> jax.Array:
    """Every head's logits: x [B, H, H, 1] in [0, 1] -> [B, num_heads, C] (shallowest head first).

    With ``key`` the stochastic views (:func:`random_views`; with ``fixed``, :func:`fixed_views`:
    one draw shared by the batch), without it the plain stack.
    """
    b = x.shape[0]
    z = multires_stack(x, cfg.resolutions)
    if key is not None:
        z = (fixed_views if fixed else random_views)(key, z, cfg.jitter, cfg.noise_std)
    outs = []
    for i in range(len(cfg.channels)):
        z = max_pool2(jax.nn.relu(conv2d(z, params[f"conv{i}"])))
        hd = params[f"head{i}"]
        outs.append(z.reshape(b, -1) @ hd["w"] + hd["b"])
    z = jax.nn.relu(z.reshape(b, -1) @ params["dense"]["w"] + params["dense"]["b"])
    hd = params[f"head{len(cfg.channels)}"]
    outs.append(z @ hd["w"] + hd["b"])
    return jnp.stack(outs, axis=1)


def apply(
    cfg: SelfEnsembleConfig, params: Params, x: jax.Array, key: jax.Array | None = None, *, fixed: bool = False
) -> jax.Array:
    """CrossMax of the heads: x [B, H, H, 1] -> logits [B, C] (with ``key``: stochastic views;
    with ``key`` and ``fixed``: the one draw of :func:`fixed_views`)."""
    return crossmax(head_logits(cfg, params, x, key, fixed=fixed), cfg.crossmax_k)


def make_self_ensemble(cfg: SelfEnsembleConfig = SelfEnsembleConfig()) -> tuple[Callable, Callable]:
    """``(init(key) -> params, apply(params, x, key=None) -> [B, C])`` closed over ``cfg``."""

    def _init(key):
        return init(cfg, key)

    def _apply(params, x, key=None):
        return apply(cfg, params, x, key)

    return _init, _apply


# ----------------------------------------------------------------------------- as a pool member


@functools.cache
def _member_apply(cfg: SelfEnsembleConfig, view_seed: int | None) -> Callable:
    """One member's deterministic apply; cached so that every stack of (cfg, view_seed) returns
    the SAME function object (attack kernels are cached on it)."""
    if view_seed is None:

        def member_apply(params, x):
            return apply(cfg, params, x)

    else:

        def member_apply(params, x):
            return apply(cfg, params, x, jax.random.key(view_seed), fixed=True)

    return member_apply


@functools.cache
def _member_stochastic_apply(cfg: SelfEnsembleConfig) -> Callable:
    def member_stochastic_apply(params, x, key):
        return apply(cfg, params, x, key)

    return member_stochastic_apply


@register_kind
class SelfEnsembleStack(BaseStack):
    """``K`` self-ensembles of one :class:`SelfEnsembleConfig` as a stack (kind ``"self-ensemble"``).

    The self-ensemble as a member of a :class:`~sarjax.models.pool.Pool`: every pool command,
    attack, cover and checkpoint (:func:`~sarjax.models.checkpoint.save_pool` /
    ``load_pool``, no builder needed: the config is in the spec) takes it.

    Its :attr:`member_apply` is deterministic, as the Stack protocol asks (stochastic layers off):

    - ``view_seed=None`` (the default): **noise off**, the plain multi-resolution stack with no
      jitter and no noise (what the zoo reports as ``clean_acc_deterministic``). It is the
      default because it is the one deterministic view that favours no particular draw, and the
      protocol's requirements hold (a sample's logits do not depend on its batch).
    - ``view_seed=s``: a **fixed key**, ONE draw of the jitter and noise (:func:`fixed_views`,
      from ``jax.random.key(s)``) applied to every input alike. A fixed draw is not the defense as
      deployed (every query draws anew), and an attack on it can exploit that one draw; it is
      offered to reproduce "fixed-randomness" evaluations, not as the default.

    The defense as deployed, for EOT (Athalye et al. 2018; ``eot=n`` of the attacks):
    :meth:`stochastic_apply` (this stack) and :func:`pool_stochastic_apply` (a whole pool).

    Args:
      cfg: the architecture and its views.
      params: stacked params, every leaf ``[K, ...]`` (the tree :func:`init` gives, stacked).
      names: ``K`` member names.
      view_seed: None (noise off) or an int (one fixed draw of views).

    Raises:
      TypeError: ``cfg`` not a :class:`SelfEnsembleConfig`, or ``view_seed`` not None / an int.
      ValueError: params not the config's tree (naming the leaf), no shared member axis, or a
        names count that differs.
    """

    kind: ClassVar[str] = "self-ensemble"
    needs_builder: ClassVar[bool] = False

    def __init__(self, cfg: SelfEnsembleConfig, params: Params, names: Sequence[str], *, view_seed: int | None = None):
        if not isinstance(cfg, SelfEnsembleConfig):
            raise TypeError(f"SelfEnsembleStack: cfg must be a SelfEnsembleConfig, got {type(cfg).__name__}")
        if view_seed is not None and (isinstance(view_seed, bool) or not isinstance(view_seed, (int, np.integer))):
            raise TypeError(f"view_seed must be None (noise off) or an int, got {view_seed!r}")
        self.cfg = cfg
        self.view_seed = None if view_seed is None else int(view_seed)
        self.params = params
        self.names = tuple(str(n) for n in names)
        self._check_members()
        want = jax.eval_shape(lambda k: init(cfg, k), jax.random.key(0))
        w_leaves, w_def = jax.tree_util.tree_flatten_with_path(want)
        g_leaves, g_def = jax.tree_util.tree_flatten_with_path(params)
        if w_def != g_def:
            raise ValueError(
                f"SelfEnsembleStack: params must be the config's tree (keys {sorted(want)}), stacked; got the "
                f"structure {g_def}"
            )
        for (path, w), (_, g) in zip(w_leaves, g_leaves):
            if tuple(np.shape(g)[1:]) != tuple(w.shape):
                raise ValueError(
                    f"SelfEnsembleStack: params leaf {jax.tree_util.keystr(path)} has member shape "
                    f"{tuple(np.shape(g)[1:])}, the config gives {tuple(w.shape)}"
                )

    @classmethod
    def from_members(
        cls, cfg: SelfEnsembleConfig, members: Sequence[Params], names: Sequence[str], *, view_seed: int | None = None
    ) -> SelfEnsembleStack:
        """Stack one-member params (each as :func:`init` gives them)."""
        return cls(cfg, stack_trees(list(members)), names, view_seed=view_seed)

    @property
    def name(self) -> str:
        return "self-ensemble"

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.cfg.input_shape

    @property
    def num_classes(self) -> int:
        return self.cfg.num_classes

    @property
    def member_apply(self) -> Callable:
        """The deterministic ``f(params_one, x [B, H, H, 1]) -> [B, C]`` (noise off, or the fixed draw)."""
        return _member_apply(self.cfg, self.view_seed)

    @property
    def member_stochastic_apply(self) -> Callable:
        """``f(params_one, x, key) -> [B, C]``: one member as deployed (fresh views per key)."""
        return _member_stochastic_apply(self.cfg)

    def stochastic_apply(self, params: Params, x: jax.Array, key: jax.Array) -> jax.Array:
        """Every member as deployed: stacked params, x [B, H, H, 1] -> [K, B, C]; member ``k`` draws
        its views from ``fold_in(key, k)`` (independent members)."""
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(self.size))
        return jax.vmap(self.member_stochastic_apply, in_axes=(0, None, 0))(params, x, keys)

    def spec(self) -> dict:
        return {
            "kind": self.kind,
            "name": self.name,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "config": self.cfg.spec(),
            "view_seed": self.view_seed,
        }

    def with_params(self, params: Params, names: Sequence[str] | None = None) -> SelfEnsembleStack:
        return SelfEnsembleStack(self.cfg, params, self.names if names is None else names, view_seed=self.view_seed)

    def with_views(self, view_seed: int | None) -> SelfEnsembleStack:
        """The same members with another deterministic view (None: noise off; an int: a fixed draw)."""
        return SelfEnsembleStack(self.cfg, self.params, self.names, view_seed=view_seed)

    @classmethod
    def restore(cls, spec, leaves, paths, names, built) -> SelfEnsembleStack:
        """Rebuild from the spec's config (``built`` is unused: no builder needed)."""
        del paths, built
        cfg = SelfEnsembleConfig.from_spec(spec["config"])
        treedef = jax.tree.structure(jax.eval_shape(lambda k: init(cfg, k), jax.random.key(0)))
        if treedef.num_leaves != len(leaves):
            raise ValueError(f"the config gives {treedef.num_leaves} params leaves, the checkpoint {len(leaves)}")
        return cls(cfg, jax.tree.unflatten(treedef, list(leaves)), names, view_seed=spec.get("view_seed"))


def pool_stochastic_apply(pool) -> Callable:
    """A pool with its self-ensembles as deployed: ``apply(params, x, key) -> [M, B, C]`` for EOT.

    Stacks with a ``stochastic_apply`` (:class:`SelfEnsembleStack`) draw their views (stack ``i``
    from ``fold_in(key, i)``); every other stack runs its deterministic ``apply``. Give it to an
    attack with ``eot=n`` (``make_pgd(pool_stochastic_apply(pool), eot=10)(pool.params, ...)``).

    Args:
      pool: a :class:`~sarjax.models.pool.Pool`.

    Returns:
      ``apply(params, x [B, *S], key) -> [M, B, C]`` over ``pool.params``.

    Raises:
      ValueError: no stack of the pool is randomized (use ``pool.apply``).
    """
    stacks = tuple(pool.stacks)
    if not any(hasattr(s, "stochastic_apply") for s in stacks):
        raise ValueError(
            f"no stack of {pool!r} is randomized (none has a stochastic_apply); attack pool.apply without EOT"
        )

    def stochastic(params, x, key):
        outs = [
            s.stochastic_apply(p, x, jax.random.fold_in(key, i)) if hasattr(s, "stochastic_apply") else s.apply(p, x)
            for i, (s, p) in enumerate(zip(stacks, params))
        ]
        return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=0)

    return stochastic


def fixed_views(key: jax.Array, xs: jax.Array, jitter: int, noise_std: float) -> jax.Array:
    """ONE draw of :func:`random_views`' shifts and noise, the same for every sample of the batch.

    The deterministic "fixed key" views: a sample's output does not depend on the batch it is in
    (unlike ``random_views(key, ...)``, whose draw for sample ``b`` depends on the batch shape).
    xs: [B, H, W, R] -> [B, H, W, R].
    """
    b, h, w, r = xs.shape
    ks, kn = jax.random.split(key)
    if jitter > 0:
        d = jax.random.randint(ks, (2, 1, r), -jitter, jitter + 1)
        d = jnp.broadcast_to(d, (2, b, r))
        per = jax.vmap(jax.vmap(lambda im, dy, dx: _shift(im, dy, dx, jitter), in_axes=(2, 0, 0), out_axes=2))
        xs = per(xs, d[0], d[1])
    if noise_std > 0:
        xs = xs + noise_std * jax.random.normal(kn, (1, h, w, r), xs.dtype)
    return jnp.clip(xs, 0.0, 1.0)


def train_self_ensemble(
    cfg: SelfEnsembleConfig,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int = 6,
    batch_size: int = 64,
    lr: float = 2e-3,
    seed: int = 0,
    progress: bool = True,
) -> tuple[Params, list[float]]:
    """Train one self-ensemble: Adam, mean cross-entropy over the heads at stochastic views.

    All heads and the backbone train jointly, every batch through fresh random views (the paper
    trains at the views it tests on). One jitted ``lax.scan`` per epoch.

    Args:
      cfg: the architecture.
      x: [N, H, H, 1] training inputs in [0, 1].
      y: [N] int labels.
      epochs: passes over the data.
      batch_size: batch size (the last partial batch of an epoch is dropped).
      lr: Adam learning rate (the trainer's default, :class:`sarjax.models.train.MemberConfig`).
      seed: init, data order and view seed.
      progress: show a progress bar.

    Returns:
      (params, the mean training loss of each epoch).

    Raises:
      ValueError: inputs or labels of the wrong shape.
    """
    x = np.asarray(x, np.float32)
    y = np.asarray(y)
    if x.shape[1:] != cfg.input_shape or y.shape != (len(x),):
        raise ValueError(
            f"expected x [N, {', '.join(map(str, cfg.input_shape))}] and y [N], got {list(x.shape)}, {list(y.shape)}"
        )
    tx = optax.adam(lr)
    params = init(cfg, jax.random.key(seed))
    state = tx.init(params)
    steps = len(x) // batch_size

    def loss_fn(p, xb, yb, k):
        z = head_logits(cfg, p, xb, k)  # [B, H, C]
        logp = jax.nn.log_softmax(z, axis=-1)
        return -jnp.take_along_axis(logp, yb[:, None, None], axis=-1).mean()

    @jax.jit
    def epoch(p, s, xd, yd, idx, keys):
        def body(carry, inp):
            p, s = carry
            ib, k = inp
            loss, g = jax.value_and_grad(loss_fn)(p, xd[ib], yd[ib], k)
            u, s = tx.update(g, s, p)
            return (optax.apply_updates(p, u), s), loss

        (p, s), losses = jax.lax.scan(body, (p, s), (idx, keys))
        return p, s, losses.mean()

    xd, yd = jnp.asarray(x), jnp.asarray(y.astype(np.int32))
    hist = []
    base = jax.random.key(seed + 1)
    with progress_bar(progress) as bar:
        task = bar.add_task("train self-ensemble", total=epochs)
        for ep in range(epochs):
            order = np.random.default_rng([seed, ep]).permutation(len(x))[: steps * batch_size]
            keys = jax.random.split(jax.random.fold_in(base, ep), steps)
            params, state, loss = epoch(params, state, xd, yd, jnp.asarray(order.reshape(steps, batch_size)), keys)
            hist.append(float(loss))
            bar.update(task, advance=1, description=f"train self-ensemble loss {hist[-1]:.3f}")
    return params, hist


__all__ = [
    "SelfEnsembleConfig",
    "SelfEnsembleStack",
    "apply",
    "crossmax",
    "fixed_views",
    "head_logits",
    "init",
    "make_self_ensemble",
    "multires_stack",
    "pool_stochastic_apply",
    "random_views",
    "train_self_ensemble",
]
