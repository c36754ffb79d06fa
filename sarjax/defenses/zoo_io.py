"""Saving and loading the defense zoo (:mod:`sarjax.defenses.zoo`, trained by :mod:`sarjax.defenses.zoo_train`).

``DIR/zoo.json`` (:data:`ZOO_INDEX`, format :data:`ZOO_FORMAT`) indexes a trained zoo
(:func:`read_zoo_index`, :func:`write_zoo_index`); a zoo architecture is a pool checkpoint
``DIR/<name>/`` and the self-ensemble ``DIR/<name>/params.npz`` + ``model.json``
(:func:`save_self_ensemble`, :func:`load_self_ensemble`, verified on load).

:func:`load_zoo` restores them as :class:`ZooModel` (deterministic ``apply``, params, a one-member
:class:`~sarjax.models.pool.Pool`, and the stochastic ``apply(params, x, key)`` of the randomized
defenses for EOT); :func:`zoo_pool` puts defenses (the self-ensemble included) into one Pool and
:func:`save_zoo_pool` saves such a pool for the ``--pool`` commands (``sarjax zoo-pool``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks.eot import with_input_noise
from sarjax.defenses import self_ensemble as se
from sarjax.defenses.zoo import Defense, defense_names, get_defense
from sarjax.models.checkpoint import PROBE_RTOL, load_pool, probe_batch, save_pool
from sarjax.models.pool import Pool
from sarjax.models.stack import leaf_signature

ZOO_FORMAT = "sarjax-defense-zoo/1"
ZOO_INDEX = "zoo.json"
SELF_ENSEMBLE_FORMAT = "sarjax-self-ensemble/1"


@dataclass
class ZooModel:
    """A trained defense restored by :func:`load_zoo`.

    Attributes:
      name: the defense's name.
      defense: its :class:`~sarjax.defenses.zoo.Defense` entry.
      apply: deterministic ``apply(params, x [B, 28, 28, 1]) -> logits [B, C]`` (the
        self-ensemble's plain views; the noise defense without its noise).
      params: one model's params.
      pool: a one-member :class:`~sarjax.models.pool.Pool` of the deterministic model (a zoo
        architecture's stack, or the self-ensemble's
        :class:`~sarjax.defenses.self_ensemble.SelfEnsembleStack` with its noise off).
      stochastic_apply: ``apply(params, x, key) -> [B, C]``, the defense as deployed, for the
        randomized ones (EOT; ``make_apgd(..., eot=n)``), else None.
      info: its ``zoo.json`` record (clean accuracy, training time, fingerprint).
    """

    name: str
    defense: Defense
    apply: Callable
    params: Any
    pool: Any = None
    stochastic_apply: Callable | None = None
    info: dict = field(default_factory=dict)

    @property
    def stochastic(self) -> bool:
        """Whether the deployed model is randomized."""
        return self.stochastic_apply is not None


# ----------------------------------------------------------------------------- the index


def read_zoo_index(out: Path) -> dict:
    """``out/zoo.json`` (an empty index when absent). Raises ValueError if it is not a :data:`ZOO_FORMAT` index."""
    f = out / ZOO_INDEX
    if not f.is_file():
        return {"format": ZOO_FORMAT, "defenses": {}}
    try:
        idx = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{f} is not valid JSON ({e})") from e
    if not isinstance(idx, dict) or idx.get("format") != ZOO_FORMAT or not isinstance(idx.get("defenses"), dict):
        raise ValueError(f"{f} is not a {ZOO_FORMAT} index")
    return idx


def write_zoo_index(out: Path, idx: dict) -> None:
    """Write ``idx`` to ``out/zoo.json`` atomically (a temporary file, then a rename)."""
    tmp = out / (ZOO_INDEX + ".tmp")
    tmp.write_text(json.dumps(idx, indent=1))
    tmp.replace(out / ZOO_INDEX)


# ----------------------------------------------------------------------------- self-ensemble files


def _flat(params) -> dict[str, np.ndarray]:
    return {jax.tree_util.keystr(p): np.asarray(leaf) for p, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}


def _params_sha(params) -> str:
    h = hashlib.sha256()
    for k, a in sorted(_flat(params).items()):
        a = np.ascontiguousarray(a)
        h.update(repr((k, a.shape, str(a.dtype))).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def save_self_ensemble(path: str | os.PathLike, cfg, params, config: dict | None = None) -> Path:
    """Save a self-ensemble: ``params.npz`` (leaves by path), ``model.json`` (config, SHA-256 of the
    params, deterministic logits on the checkpoint probe batch) written last."""
    path = Path(path).absolute()
    path.mkdir(parents=True, exist_ok=True)
    np.savez(path / "params.npz", **_flat(params))
    x = probe_batch(cfg.input_shape)
    with jax.default_matmul_precision("highest"):
        probe = np.asarray(jax.jit(lambda p, x: se.apply(cfg, p, x))(params, x), np.float32)
    meta = {
        "format": SELF_ENSEMBLE_FORMAT,
        "model": cfg.spec(),
        "params_sha256": _params_sha(params),
        "probe_logits": probe.tolist(),
        "config": config or {},
    }
    tmp = path / "model.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1))
    tmp.replace(path / "model.json")
    return path


def load_self_ensemble(path: str | os.PathLike):
    """Restore :func:`save_self_ensemble`'s files: ``(cfg, params, meta)``, verified.

    Raises:
      ValueError: missing or corrupt files, params whose SHA-256 or probe logits differ.
    """
    path = Path(path).absolute()
    mf = path / "model.json"
    if not mf.is_file() or not (path / "params.npz").is_file():
        raise ValueError(f"self-ensemble checkpoint {path}: needs model.json and params.npz")
    meta = json.loads(mf.read_text())
    if meta.get("format") != SELF_ENSEMBLE_FORMAT:
        raise ValueError(f"self-ensemble checkpoint {path}: not a {SELF_ENSEMBLE_FORMAT} file")
    cfg = se.SelfEnsembleConfig.from_spec(meta["model"])
    abstract = jax.eval_shape(lambda k: se.init(cfg, k), jax.random.key(0))
    with np.load(path / "params.npz") as z:
        stored = {k: z[k] for k in z.files}
    leaves = []
    for p, a in jax.tree_util.tree_flatten_with_path(abstract)[0]:
        k = jax.tree_util.keystr(p)
        if k not in stored or stored[k].shape != a.shape:
            raise ValueError(
                f"self-ensemble checkpoint {path}: params leaf {k} missing or of shape "
                f"{getattr(stored.get(k), 'shape', None)}, the config gives {a.shape}"
            )
        leaves.append(jnp.asarray(stored[k]))
    params = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(abstract), leaves)
    if _params_sha(params) != meta.get("params_sha256"):
        raise ValueError(f"self-ensemble checkpoint {path}: params differ from the saved SHA-256")
    with jax.default_matmul_precision("highest"):
        got = np.asarray(jax.jit(lambda p, x: se.apply(cfg, p, x))(params, probe_batch(cfg.input_shape)))
    want = np.asarray(meta["probe_logits"], np.float32)
    if got.shape != want.shape or np.abs(got - want).max() > PROBE_RTOL * (1 + np.abs(want).max()):
        raise ValueError(f"self-ensemble checkpoint {path}: probe logits differ from the saved ones")
    return cfg, params, meta


# ----------------------------------------------------------------------------- loading


def load_zoo(path: str | os.PathLike, names: Sequence[str] | None = None) -> dict[str, ZooModel]:
    """Restore the defenses indexed in ``path/zoo.json`` (all, or ``names``), each verified.

    Returns:
      ``{name: ZooModel}`` in the zoo's order. Zoo architectures come with a one-member ``pool``;
      the randomized defenses (Gaussian noise at inference, the self-ensemble's stochastic views)
      with ``stochastic_apply(params, x, key)`` for EOT.

    Raises:
      ValueError: no index, an unknown or untrained name, or a checkpoint that fails verification.
    """

    path = Path(path).absolute()
    if not (path / ZOO_INDEX).is_file():
        raise ValueError(f"{path} has no {ZOO_INDEX} (train it with `sarjax train-defenses --out {path}`)")
    idx = read_zoo_index(path)
    avail = [n for n in defense_names() if n in idx["defenses"]]
    names = list(names) if names is not None else avail
    missing = [n for n in names if n not in idx["defenses"]]
    if missing:
        raise ValueError(f"{path}: defenses {missing} are not trained there (trained: {avail})")
    out: dict[str, ZooModel] = {}
    for n in names:
        rec = idx["defenses"][n]
        d = get_defense(n)
        spec = rec.get("defense", {})
        if spec and spec != d.spec():
            d = replace(d, hp=tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in spec.get("hp", {}).items()))
        if d.arch == "self-ensemble":
            cfg, params, _ = load_self_ensemble(path / rec["dir"])
            stack = se.SelfEnsembleStack(cfg, jax.tree.map(lambda a: a[None], params), (n,))
            out[n] = ZooModel(n, d, stack.member_apply, params, Pool([stack]), stack.member_stochastic_apply, rec)
            continue
        pool, _ = load_pool(path / rec["dir"])
        stack = pool.stacks[0]
        params = jax.tree.map(lambda a: a[0], stack.params)
        sigma = d.get("inference_sigma")
        rand = with_input_noise(stack.arch.apply, float(sigma)) if sigma is not None else None
        out[n] = ZooModel(n, d, stack.arch.apply, params, pool, rand, rec)
    return out


def zoo_pool(models: dict[str, ZooModel], names: Sequence[str] | None = None):
    """One :class:`~sarjax.models.pool.Pool` of zoo defenses, each in its deterministic form.

    Args:
      models: what :func:`load_zoo` returned.
      names: the members, in order (default: every model of ``models``). The zoo architectures
        (the Gaussian-noise CNN without its noise) and the self-ensemble (a
        :class:`~sarjax.defenses.self_ensemble.SelfEnsembleStack`, noise off; its deployed form for
        EOT: :func:`~sarjax.defenses.self_ensemble.pool_stochastic_apply` of the pool) all go in.

    Returns:
      The pool; members of one architecture share a stack (stacks in order of first appearance,
      so ``pool.names`` may reorder ``names`` across stacks, as :meth:`Pool.from_members`).

    Raises:
      ValueError: a name that ``models`` lacks, or a model without a pool.
    """

    names = list(names) if names is not None else list(models)
    missing = [n for n in names if n not in models]
    if missing:
        raise ValueError(f"{missing} are not among the loaded models {list(models)}")
    bad = [n for n in names if models[n].pool is None]
    if bad:
        raise ValueError(f"{bad} have no pool; use their apply / stochastic_apply")
    groups: dict[tuple, list[str]] = {}  # members of one stack kind, architecture and params layout
    for n in names:
        groups.setdefault(_stack_key(models[n].pool.stacks[0]), []).append(n)
    stacks = []
    for run in groups.values():
        first = models[run[0]].pool.stacks[0]
        params = [models[n].pool.stacks[0].params for n in run]
        stacks.append(first if len(run) == 1 else first.with_params(_stack_params(params), run))
    return Pool(stacks)


def _stack_key(stack) -> tuple:

    return (stack.kind, json.dumps(stack.spec(), sort_keys=True), leaf_signature(stack.member(0)))


def _stack_params(params: list):
    return jax.tree.map(lambda *a: jnp.concatenate(a, axis=0), *params)


def save_zoo_pool(zoo_dir: str | os.PathLike, out: str | os.PathLike, names: Sequence[str] | None = None) -> Path:
    """Save zoo defenses as ONE pool checkpoint (``sarjax zoo-pool``), loadable by every ``--pool`` command.

    Args:
      zoo_dir: a directory trained by :func:`sarjax.defenses.zoo_train.train_defenses`.
      out: the pool directory to write (:func:`sarjax.models.checkpoint.save_pool`; it must not be
        inside ``zoo_dir``'s defense directories).
      names: the defenses (default: every trained one), each in its deterministic form
        (:func:`zoo_pool`).

    Returns:
      The pool directory. Its config records, per member, the defense entry, whether the
      deployed model is randomized (attack those with EOT) and the zoo's clean accuracy.

    Raises:
      ValueError: as :func:`load_zoo` and :func:`zoo_pool`.
    """

    models = load_zoo(zoo_dir, names)
    pool = zoo_pool(models, names)
    config = {
        "zoo": str(Path(zoo_dir).absolute()),
        "members": {
            n: {
                "defense": m.defense.spec(),
                "stochastic": m.stochastic,
                "clean_acc": m.info.get("clean_acc"),
                "clean_acc_deterministic": m.info.get("clean_acc_deterministic"),
            }
            for n, m in models.items()
        },
    }
    return save_pool(pool, out, config=config)


__all__ = [
    "SELF_ENSEMBLE_FORMAT",
    "ZOO_FORMAT",
    "ZOO_INDEX",
    "ZooModel",
    "load_self_ensemble",
    "load_zoo",
    "read_zoo_index",
    "save_self_ensemble",
    "save_zoo_pool",
    "write_zoo_index",
    "zoo_pool",
]
