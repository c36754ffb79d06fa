"""Vmapped training of every member of a stack at once, and distillation.

One optax update per step for the whole stack (``jax.vmap`` over members, ``lax.scan`` over
the steps of an epoch). Each member has its own PRNG seed, data order, data subset,
augmentation strength, learning rate, weight decay, label smoothing and dropout; early stopping
is per member on a shared validation split (a stopped member's update is masked and its best
params are kept).

The loss is a function, the *objective* (default :func:`cross_entropy`)::

    objective(apply, params, x [B, *S], y [B, C], key, hp) -> scalar loss

written for ONE member and vmapped over the stack with the update. ``apply(params, x, key=None)
-> logits [B, C]`` is the member's model: with a key the training-mode forward pass (dropout at
the member's rate), without one the deterministic pass (what an inner attack should see);
``y`` holds the soft targets after label smoothing; ``key`` is the member's key of this step;
``hp`` maps each name of ``train_stack(objective_hp=...)`` to this member's value (traced, so
per-member values never recompile). This module knows nothing of attacks: adversarial
objectives built from them (PGD-AT, TRADES) live in :mod:`sarjax.defenses`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sarjax.data.augment import random_affine
from sarjax.models import fused_members
from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import Arch, init_members
from sarjax.runtime.progress import progress_bar


@dataclass(frozen=True)
class MemberConfig:
    """Training hyperparameters of ONE member.

    Attributes:
      seed: init / dropout / augmentation seed.
      data_seed: data-order seed (members sharing it see batches in the same order).
      lr: Adam(W) learning rate.
      weight_decay: decoupled weight decay (AdamW).
      label_smoothing: in [0, 1).
      dropout: dropout rate on the penultimate features, in [0, 1).
      aug_strength: random-affine augmentation strength (0 = off).
      data_fraction: share of the training split this member trains on, in (0, 1].
    """

    seed: int = 0
    data_seed: int = 0
    lr: float = 2e-3
    weight_decay: float = 0.0
    label_smoothing: float = 0.0
    dropout: float = 0.0
    aug_strength: float = 0.0
    data_fraction: float = 1.0

    def validate(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.label_smoothing < 1 or not 0 <= self.dropout < 1:
            raise ValueError(
                f"label_smoothing and dropout must be in [0, 1), got {self.label_smoothing}, {self.dropout}"
            )
        if not 0 < self.data_fraction <= 1:
            raise ValueError(f"data_fraction must be in (0, 1], got {self.data_fraction}")
        if self.weight_decay < 0 or self.aug_strength < 0:
            raise ValueError("weight_decay and aug_strength must be >= 0")


@dataclass(frozen=True)
class TrainConfig:
    """Shared training settings.

    Attributes:
      epochs: maximum epochs.
      batch_size: per-member batch size.
      patience: epochs without validation improvement before a member stops (0 = never stop).
      val_fraction: share of the training split held out for validation / early stopping.
      val_seed: seed of the validation hold-out.
      lr_schedule: ``"constant"`` (each member's ``lr`` throughout) or ``"cosine"`` (each
        member's ``lr`` times ``(1 + cos(pi t / T)) / 2`` at step ``t`` of ``T = epochs x
        steps per epoch``: cosine decay to zero without restarts, Loshchilov & Hutter 2017,
        SGDR; optax.cosine_decay_schedule's shape). Early stopping does not shorten ``T``.
    """

    epochs: int = 10
    batch_size: int = 32
    patience: int = 3
    val_fraction: float = 0.1
    val_seed: int = 0
    lr_schedule: str = "constant"


@dataclass(frozen=True, eq=False)
class TrainMonitor:
    """What :func:`train_stack` watches and reports while it trains (not what it learns).

    Attributes:
      validation: ``(x_val [N_val, *S], y_val [N_val] int or [N_val, C] soft)``, the split
        early stopping reads; None (default): ``config.val_fraction`` of the training data is
        held out (the same hold-out for every member).
      progress: show a progress bar per epoch with mean/min validation accuracy (default True).
      label: the progress bar's label (default ``""``: the architecture's name).
      callback: called after every epoch as ``callback(epoch, params)`` with the epoch number
        (1-based) and the current stacked params (e.g. to snapshot students during
        distillation); default None.

    Raises:
      ValueError: ``validation`` not None or a pair of arrays, ``progress`` not a bool,
        ``label`` not a str, ``callback`` not None or callable (the message names the field and
        the value).
    """

    validation: tuple[Any, Any] | None = None
    progress: bool = True
    label: str = ""
    callback: Callable[[int, Any], None] | None = None

    def __post_init__(self) -> None:
        v = self.validation
        if v is not None and not (isinstance(v, (tuple, list)) and len(v) == 2 and all(a is not None for a in v)):
            raise ValueError(
                f"TrainMonitor.validation must be None or a pair (x_val, y_val), got {type(v).__name__} "
                f"{v if not isinstance(v, (tuple, list)) else f'of length {len(v)}'!r}"
            )
        if not isinstance(self.progress, (bool, np.bool_)):
            raise ValueError(
                f"TrainMonitor.progress must be a bool, got {type(self.progress).__name__} {self.progress!r}"
            )
        if not isinstance(self.label, str):
            raise ValueError(f"TrainMonitor.label must be a str, got {type(self.label).__name__} {self.label!r}")
        if self.callback is not None and not callable(self.callback):
            raise ValueError(
                f"TrainMonitor.callback must be None or callable(epoch, params), got "
                f"{type(self.callback).__name__} {self.callback!r}"
            )


@dataclass
class TrainHistory:
    """Per-epoch validation accuracy [epochs, K] and the epoch at which each member stopped."""

    val_acc: list = field(default_factory=list)
    stopped_epoch: list = field(default_factory=list)
    best_val_acc: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


LR_SCHEDULES = ("constant", "cosine")


def lr_scales(schedule: str, epoch: int, steps: int, epochs: int) -> np.ndarray:
    """[steps] float32 factors on each member's ``lr`` for the steps of ``epoch`` (0-based).

    ``"constant"``: ones. ``"cosine"``: ``(1 + cos(pi t / T)) / 2`` at global step ``t = epoch x
    steps + s`` of ``T = epochs x steps`` (1 at the first step, decaying towards 0 at the last).
    """
    if schedule == "constant":
        return np.ones(steps, np.float32)
    if schedule == "cosine":
        t = epoch * steps + np.arange(steps)
        return (0.5 * (1.0 + np.cos(np.pi * t / (epochs * steps)))).astype(np.float32)
    raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {schedule!r}")


def _soft_xent(logits, target):
    return -jnp.sum(target * jax.nn.log_softmax(logits), axis=-1).mean()


Objective = Callable[..., jax.Array]
"""``objective(apply, params, x [B, *S], y [B, C], key, hp) -> scalar loss`` of ONE member (module docstring)."""


def cross_entropy(apply: Callable, params: Any, x: jax.Array, y: jax.Array, key: jax.Array, hp: Mapping) -> jax.Array:
    """The standard objective: softmax cross-entropy of the training-mode logits.

    Args:
      apply: the member's ``apply(params, x, key=None) -> logits [B, C]``.
      params: the member's params.
      x: [B, *S] the (augmented) batch.
      y: [B, C] soft targets (one-hot labels after label smoothing, or distillation targets).
      key: the member's key of this step; dropout draws from ``fold_in(key, 2)``.
      hp: unused (no hyperparameters).

    Returns:
      The mean cross-entropy over the batch (scalar).
    """
    del hp
    return _soft_xent(apply(params, x, key=jax.random.fold_in(key, 2)), y)


cross_entropy.name = "standard"  # type: ignore[attr-defined]
cross_entropy.hparams = {}  # type: ignore[attr-defined]


def objective_name(objective: Objective | None) -> str:
    """A short name of an objective for logs and pool configs (``.name`` if it has one)."""
    if objective is None:
        return "standard"
    return str(getattr(objective, "name", getattr(objective, "__name__", type(objective).__name__)))


def _objective_hp(objective: Objective, hp: Mapping[str, Any] | None, k: int, what: str = "members") -> dict:
    """Per-member objective hyperparameters as float32 ``[k]`` arrays (validated on the host).

    ``hp`` maps names to a scalar (every member) or ``k`` values (one per member). An objective
    with an ``hparams`` mapping of defaults names every hyperparameter it reads: an unknown name is
    an error and a missing one takes its default; its ``check_hp(values)``, if any, checks the
    values (e.g. eps >= 0).
    """
    hp = dict(hp or {})
    known = getattr(objective, "hparams", None)
    if known is not None:
        unknown = sorted(set(hp) - set(known))
        if unknown:
            raise ValueError(
                f"objective {objective_name(objective)!r} takes hyperparameters {sorted(known)}; got unknown {unknown}"
            )
        hp = {**dict(known), **hp}
    out = {}
    for name, v in hp.items():
        a = np.asarray(v, np.float64)
        if a.ndim == 0:
            a = np.full(k, float(a))
        if a.shape != (k,):
            raise ValueError(
                f"objective hyperparameter {name!r} must be a scalar or one value per member "
                f"({k} {what}), got shape {list(a.shape)}"
            )
        if not np.all(np.isfinite(a)):
            bad = np.flatnonzero(~np.isfinite(a)).tolist()
            raise ValueError(f"objective hyperparameter {name!r} must be finite; members {bad} have {a[bad].tolist()}")
        out[name] = a.astype(np.float32)
    check = getattr(objective, "check_hp", None)
    if check is not None:
        check(out)
    return {n: jnp.asarray(a) for n, a in out.items()}


def _member_order(cfgs: Sequence[MemberConfig], n: int, epoch: int) -> np.ndarray:
    """[K, n] per-member index order for one epoch: each member's own subset, permuted, tiled to n."""
    out = np.empty((len(cfgs), n), np.int64)
    for k, c in enumerate(cfgs):
        sub = np.random.default_rng([c.data_seed, 7]).permutation(n)[: max(1, int(round(c.data_fraction * n)))]
        perm = np.random.default_rng([c.data_seed, 11, epoch]).permutation(sub)
        out[k] = np.resize(perm, n)
    return out


def _make_epoch_fn(
    arch: Arch,
    augment: bool,
    tx: optax.GradientTransformation,
    dropout: bool = True,
    objective: Objective | None = None,
    scheduled: bool = False,
):
    """The jitted epoch: ``lax.scan`` over steps of a member step vmapped over the stack.

    ``masked`` (static) selects the variant that keeps stopped members' params and optimizer
    state (a ``where`` over every leaf each step); while all members are active the unmasked
    variant runs. ``dropout=False`` skips drawing dropout masks when every rate is 0.
    ``objective`` is the member loss (default :func:`cross_entropy`); its per-member
    hyperparameters travel in ``hp["obj"]`` (a dict of ``[K]`` arrays; absent = none).
    ``scheduled``: each step sets the members' learning rate to ``hp["lr"]`` times that step's
    entry of the epoch's ``scales [steps]`` (:attr:`TrainConfig.lr_schedule`); otherwise
    ``scales`` is unused and the rate stays as initialised.
    """
    objective = cross_entropy if objective is None else objective
    # conv_impl="fused" CNNs: the deterministic pass through the fused kernel's input gradient, members
    # on their own inputs (inner attacks of adversarial objectives); gradients in the params are arch.apply's
    fast = fused_members.member_apply(arch) if arch.conv_impl == "fused" and fused_members.supports(arch) else None

    def member_step(params, opt_state, xb, yb, key, hp, active, masked, scale):
        if scheduled:  # inject_hyperparams reads the rate from its state at every update
            opt_state = opt_state._replace(hyperparams={**opt_state.hyperparams, "learning_rate": hp["lr"] * scale})
        if augment:
            ka = jax.random.split(jax.random.fold_in(key, 1), xb.shape[0])
            xb = jax.vmap(lambda k, im: random_affine(k, im, hp["aug"]))(ka, xb)
        target = yb * (1.0 - hp["ls"]) + hp["ls"] / yb.shape[-1]

        def apply(p, x, key=None):
            # key None: the deterministic pass (inner attacks); dropout=False: every rate is 0, no draws
            if fast is not None and (key is None or not dropout):
                return fast(p, x)
            return arch.apply(p, x, key=key if dropout else None, dropout=hp["dropout"])

        def loss_fn(p):
            return objective(apply, p, xb, target, key, hp.get("obj", {}))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, new_state = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        if not masked:
            return new_params, new_state, loss
        keep = lambda new, old: jnp.where(active, new, old)
        return jax.tree.map(keep, new_params, params), jax.tree.map(keep, new_state, opt_state), loss

    stack_step = jax.vmap(member_step, in_axes=(0, 0, 0, 0, 0, 0, 0, None, None))

    def epoch(params, opt_state, x, y, idx, keys, hp, active, masked, scales=None):
        # idx: [steps, K, bs]; keys: [steps, K]; scales: [steps] (None: ones, for unscheduled callers)
        if scales is None:
            scales = jnp.ones(idx.shape[0], jnp.float32)

        def body(carry, inp):
            p, s = carry
            ib, kb, sc = inp
            p, s, loss = stack_step(p, s, x[ib], y[ib], kb, hp, active, masked, sc)
            return (p, s), loss

        (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), (idx, keys, scales))
        return params, opt_state, losses.mean(0)

    return jax.jit(epoch, static_argnames="masked")


@functools.lru_cache(maxsize=64)
def _eval_fn(arch: Arch):
    """The jitted validation accuracy of a stack of ``arch`` (one per architecture: equal
    architectures share its programs across :func:`train_stack` calls)."""

    @jax.jit
    def acc(params, x, y):
        logits = jax.vmap(arch.apply, in_axes=(0, None))(params, x)
        return (jnp.argmax(logits, -1) == y[None]).mean(-1)

    return acc


_TX = optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3, weight_decay=0.0)
"""Every member's optimizer: AdamW whose rate and weight decay live in its state (set per member)."""


def _init_member_state(params: Any, lr: jax.Array, wd: jax.Array) -> Any:
    s = _TX.init(params)
    assert isinstance(s, optax.InjectStatefulHyperparamsState)  # what inject_hyperparams builds
    s.hyperparams["learning_rate"] = lr
    s.hyperparams["weight_decay"] = wd
    return s


# one program per architecture and member count (eager, optax's init compiled a program per leaf shape)
_init_states = jax.jit(jax.vmap(_init_member_state))


@functools.partial(jax.jit, static_argnums=2)
def _epoch_keys(base_keys: tuple, epoch: jax.Array, steps: int) -> jax.Array:
    """``[steps, K]`` keys of an epoch: ``fold_in(fold_in(base_keys[k], epoch), step)``."""
    return jax.vmap(
        lambda kk: jax.vmap(lambda s: jax.random.fold_in(jax.random.fold_in(kk, epoch), s))(jnp.arange(steps))
    )(jnp.stack(base_keys)).transpose(1, 0)


@functools.lru_cache(maxsize=32)
def _cached_epoch_fn(arch: Arch, augment: bool, dropout: bool, objective: Objective | None, scheduled: bool):
    return _make_epoch_fn(arch, augment, _TX, dropout=dropout, objective=objective, scheduled=scheduled)


def _epoch_fn(arch: Arch, augment: bool, dropout: bool, objective: Objective | None, scheduled: bool):
    """:func:`_make_epoch_fn` on :data:`_TX`, one per (architecture, flags, objective): a second
    :func:`train_stack` with the same ones reuses the compiled epochs (an unhashable objective
    builds its own)."""
    try:
        return _cached_epoch_fn(arch, augment, dropout, objective, scheduled)
    except TypeError:  # an unhashable objective
        return _make_epoch_fn(arch, augment, _TX, dropout=dropout, objective=objective, scheduled=scheduled)


def train_stack(
    arch: Arch,
    cfgs: Sequence[MemberConfig],
    x: np.ndarray,
    y: np.ndarray,
    *,
    config: TrainConfig = TrainConfig(),
    init_params: Any = None,
    names: Sequence[str] | None = None,
    objective: Objective | None = None,
    objective_hp: Mapping[str, Any] | None = None,
    monitor: TrainMonitor | None = None,
) -> tuple[Stack, TrainHistory]:
    """Train every member of one architecture at once.

    Args:
      arch: the architecture.
      cfgs: one :class:`MemberConfig` per member (K members).
      x: [N, *S] training inputs in [0, 1].
      y: [N] int labels, or [N, C] soft targets (distillation).
      config: shared settings (epochs, batch size, patience, validation hold-out).
      init_params: stacked initial params; default ``vmap(arch.init)`` over the members' seeds
        (computed by :func:`sarjax.models.zoo.init_members`, the same bits from one program).
      names: member names.
      objective: the member loss ``objective(apply, params, x, y, key, hp) -> scalar`` (module
        docstring); default :func:`cross_entropy` (standard training). Adversarial objectives:
        :func:`sarjax.defenses.pgd_at`, :func:`sarjax.defenses.trades`. Early stopping still
        reads the clean validation accuracy.
      objective_hp: per-member hyperparameters of the objective, name -> scalar (every member)
        or K values (e.g. ``{"eps": [0.1, 0.2, 0.3]}``); traced, so new values never
        recompile. An objective with an ``hparams`` mapping fills the names not given with its
        defaults and rejects unknown names.
      monitor: the validation split early stopping reads, the progress bar and the per-epoch
        callback (:class:`TrainMonitor`); default ``TrainMonitor()``: a hold-out of
        ``config.val_fraction``, a progress bar, no callback.

    Returns:
      (stack with each member's best-validation params, history).

    Raises:
      ValueError: no member, a bad member config, inputs or labels of the wrong shape, or an
        objective hyperparameter that is unknown, non-finite or not one value per member.
    """
    if monitor is None:
        monitor = TrainMonitor()
    if not isinstance(monitor, TrainMonitor):
        raise TypeError(f"monitor must be a TrainMonitor, got {type(monitor).__name__}")
    x_val, y_val = monitor.validation if monitor.validation is not None else (None, None)
    progress, label, callback = monitor.progress, monitor.label, monitor.callback
    if not cfgs:
        raise ValueError("need at least one member config")
    if config.lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {config.lr_schedule!r}")
    for c in cfgs:
        c.validate()
    if objective is not None and not callable(objective):
        raise TypeError(
            f"objective must be callable objective(apply, params, x, y, key, hp), got {type(objective).__name__}"
        )
    obj_hp = _objective_hp(cross_entropy if objective is None else objective, objective_hp, len(cfgs))
    x = np.asarray(x, np.float32)
    if x.shape[1:] != arch.input_shape:
        raise ValueError(f"training inputs must be [N, {', '.join(map(str, arch.input_shape))}], got {list(x.shape)}")
    y = np.asarray(y)
    if y.ndim == 1:
        y_soft = np.eye(arch.num_classes, dtype=np.float32)[y]
        y_hard = y.astype(np.int32)
    elif y.ndim == 2 and y.shape[1] == arch.num_classes:
        y_soft = y.astype(np.float32)
        y_hard = y.argmax(-1).astype(np.int32)
    else:
        raise ValueError(f"labels must be [N] ints or [N, {arch.num_classes}] soft targets, got {list(y.shape)}")
    if len(y) != len(x):
        raise ValueError(f"{len(x)} inputs but {len(y)} labels")
    if x_val is None:
        n_val = int(round(config.val_fraction * len(x)))
        perm = np.random.default_rng(config.val_seed).permutation(len(x))
        vi, ti = perm[:n_val], perm[n_val:]
        x_val, y_val = x[vi], y_hard[vi]
        x, y_soft = x[ti], y_soft[ti]
    y_val = np.asarray(y_val)
    if y_val.ndim == 2:
        y_val = y_val.argmax(-1)
    k = len(cfgs)
    bs = min(config.batch_size, len(x))
    steps = len(x) // bs
    # host bookkeeping in numpy: eager jnp on small arrays compiles a program per shape (issue 43 item 2)
    if init_params is None:
        init_params = init_members(arch, [c.seed for c in cfgs])  # vmap(arch.init) bit for bit, one program
    hp: dict[str, Any] = {
        "aug": np.array([c.aug_strength for c in cfgs], np.float32),
        "ls": np.array([c.label_smoothing for c in cfgs], np.float32),
        "dropout": np.array([c.dropout for c in cfgs], np.float32),
        "lr": np.array([c.lr for c in cfgs], np.float32),
    }
    if obj_hp:
        hp["obj"] = obj_hp
    lrs = np.array([c.lr for c in cfgs], np.float32)
    wds = np.array([c.weight_decay for c in cfgs], np.float32)
    opt_state = _init_states(init_params, lrs, wds)
    scheduled = config.lr_schedule != "constant"
    epoch_fn = _epoch_fn(
        arch,
        any(c.aug_strength > 0 for c in cfgs),
        any(c.dropout > 0 for c in cfgs),
        objective,
        scheduled,
    )
    eval_fn = _eval_fn(arch)
    xd, yd, xv, yv = jax.device_put((x, y_soft, x_val, y_val))  # jnp.asarray compiles a program per shape
    params = init_params
    best = params
    best_acc = np.full(k, -1.0)
    since = np.zeros(k, int)
    active = np.ones(k, bool)
    hist = TrainHistory(stopped_epoch=[config.epochs] * k)
    base_keys = tuple(jax.random.key(c.seed) for c in cfgs)

    with progress_bar(progress) as bar:
        task = bar.add_task(f"train {label or arch.name} (K={k})", total=config.epochs)
        for ep in range(config.epochs):
            order = _member_order(cfgs, len(x), ep)[:, : steps * bs].reshape(k, steps, bs).transpose(1, 0, 2)
            params, opt_state, _ = epoch_fn(
                params,
                opt_state,
                xd,
                yd,
                order,
                _epoch_keys(base_keys, np.int32(ep), steps),
                hp,
                active.copy(),
                masked=not bool(active.all()),
                scales=lr_scales(config.lr_schedule, ep, steps, config.epochs),
            )
            acc = np.asarray(eval_fn(params, xv, yv))
            improved = (acc > best_acc) & active
            best = jax.tree.map(  # on the host: a where per leaf shape would compile a program each
                lambda b, p: np.where(improved.reshape((-1,) + (1,) * (np.ndim(p) - 1)), np.asarray(p), np.asarray(b)),
                best,
                params,
            )
            best_acc = np.where(improved, acc, best_acc)
            since = np.where(improved, 0, since + 1)
            hist.val_acc.append(acc.tolist())
            if callback is not None:
                callback(ep + 1, params)
            if config.patience > 0:
                stop = active & (since >= config.patience)
                for i in np.flatnonzero(stop):
                    hist.stopped_epoch[i] = ep + 1
                active &= ~stop
            bar.update(
                task,
                advance=1,
                description=f"train {label or arch.name} (K={k}) val mean {acc.mean():.3f} min {acc.min():.3f} active {active.sum()}",
            )
            if not active.any():
                break
    hist.best_val_acc = best_acc.tolist()
    names = tuple(names) if names is not None else tuple(f"{arch.name}/{i}" for i in range(k))
    return Stack(arch, jax.device_put(best), names), hist


def train_pool(
    members: Sequence[tuple[Arch, MemberConfig]],
    x: np.ndarray,
    y: np.ndarray,
    *,
    config: TrainConfig = TrainConfig(),
    names: Sequence[str] | None = None,
    progress: bool = True,
    x_val: np.ndarray | None = None,
    y_val: np.ndarray | None = None,
    objective: Objective | None = None,
    objective_hp: Mapping[str, Any] | None = None,
) -> tuple[Pool, dict]:
    """Train a (possibly heterogeneous) pool: members are grouped by architecture and each group is
    trained with one vmapped update per step (:func:`train_stack`).

    Args:
      members: (arch, member config) per member.
      x: [N, *S] inputs; y: [N] labels or [N, C] soft targets.
      config: shared settings.
      names: member names (default ``m00``, ``m01``, ...).
      progress: progress bars.
      x_val, y_val: optional explicit validation split.
      objective: the member loss (:func:`train_stack`; default standard cross-entropy).
      objective_hp: per-member objective hyperparameters, name -> scalar or one value per
        member of ``members`` (in its order; each stack gets its members' values).

    Returns:
      (pool, info) where info maps each stack's architecture name to its :class:`TrainHistory` dict.
    """
    if not members:
        raise ValueError("need at least one member")
    obj_hp = _objective_hp(cross_entropy if objective is None else objective, objective_hp, len(members))
    names = list(names) if names is not None else [f"m{i:02d}" for i in range(len(members))]
    groups: dict[Arch, list[int]] = {}
    for i, (arch, _) in enumerate(members):
        groups.setdefault(arch, []).append(i)
    stacks, info = [], {}
    for arch, idx in groups.items():
        stack, hist = train_stack(
            arch,
            [members[i][1] for i in idx],
            x,
            y,
            config=config,
            names=[names[i] for i in idx],
            objective=objective,
            objective_hp={n: np.asarray(v)[idx] for n, v in obj_hp.items()},
            monitor=TrainMonitor(
                validation=None if x_val is None else (x_val, y_val), progress=progress, label=arch.name
            ),
        )
        stacks.append(stack)
        info[arch.name] = hist.to_dict()
    return Pool(stacks), info


def teacher_targets(
    teacher: Pool, x: np.ndarray, *, soft: bool = True, temperature: float = 1.0, batch: int = 1000
) -> np.ndarray:
    """Targets for distillation from the first member of ``teacher``.

    Args:
      teacher: a pool whose member 0 is the teacher.
      x: [N, *S] transfer set.
      soft: softmax(logits / temperature) if True, else one-hot argmax (hard labels).

    Returns:
      [N, C] float32 targets.
    """
    outs = []
    for i in range(0, len(x), batch):
        logits = teacher.logits(jnp.asarray(x[i : i + batch]))[0]
        outs.append(
            np.asarray(
                jax.nn.softmax(logits / temperature) if soft else jax.nn.one_hot(logits.argmax(-1), logits.shape[-1])
            )
        )
    return np.concatenate(outs).astype(np.float32)
