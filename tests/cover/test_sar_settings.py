"""run_sar's surface: one SARSettings, the default attack from default_sar_attack, its fingerprint."""

import dataclasses
import inspect
import json

import jax
import numpy as np
import pytest

from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import mlp
from sarjax.runtime.fingerprint import FINGERPRINT_FILE, FingerprintMismatch
from sarjax.sar import SARSettings, default_sar_attack, run_sar
from sarjax.sar.distributed import run_sar_across_processes

KEY = jax.random.key(4)


ARCH = mlp((8,), input_shape=(4, 4, 1), num_classes=3)


def _pool(seed: int = 0, m: int = 3) -> Pool:
    shapes = jax.eval_shape(ARCH.init, jax.random.key(0))
    rng = np.random.default_rng(seed)
    params = jax.tree.map(
        lambda s: (rng.standard_normal((m,) + s.shape) / np.sqrt(s.shape[0])).astype(np.float32), shapes
    )
    return Pool([Stack(ARCH, params, tuple(f"m{i}" for i in range(m)))])


POOL = _pool()
X = np.random.default_rng(5).random((4, 4, 4, 1), dtype=np.float32)


def _fields(result) -> dict:
    return {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}


def _assert_same(a, b) -> None:
    for name, v in _fields(a).items():
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(getattr(b, name), v, err_msg=name)


def test_pipelines_take_at_most_ten_parameters_and_a_required_key():
    for fn in (run_sar, run_sar_across_processes):
        sig = inspect.signature(fn)
        assert len(sig.parameters) <= 10, (fn.__name__, list(sig.parameters))
        key = sig.parameters["key"]
        assert key.kind is inspect.Parameter.KEYWORD_ONLY and key.default is inspect.Parameter.empty
        assert not {"steps", "restarts", "step_size", "use_best", "chunk_size"} & set(sig.parameters)


def test_default_attack_is_table_1_joint_pgd_bit_for_bit():
    # Known answer: run_sar's default is make_joint_pgd(pool.apply, steps=40, restarts=3) (the SAR
    # paper, Table 1), the attack the old run_sar built when given none.
    want = run_sar(
        POOL,
        X,
        0.3,
        [0.0, 0.5],
        key=KEY,
        attack=make_joint_pgd(POOL.apply, eps=0.3, steps=40, step=JointPGDStep(restarts=3)),
    )
    got = run_sar(POOL, X, 0.3, [0.0, 0.5], key=KEY)
    assert want.covered.any()
    _assert_same(want, got)


def test_fingerprint_records_the_default_attacks_hyperparameters(tmp_path):
    attack = default_sar_attack(POOL, steps=2, restarts=1, step_size=0.05)
    run_sar(POOL, X, 0.3, [0.0], key=KEY, attack=attack, settings=SARSettings(checkpoint_dir=tmp_path))
    fp = json.loads((tmp_path / FINGERPRINT_FILE).read_text())
    assert (fp["attack"], fp["steps"], fp["restarts"], fp["step_size"]) == ("joint_pgd", 2, 1, 0.05)
    # A resumed run with other hyperparameters is refused, naming them.
    other = default_sar_attack(POOL, steps=3, restarts=1, step_size=0.05)
    with pytest.raises(FingerprintMismatch, match=r"steps=2, this run has steps=3"):
        run_sar(POOL, X, 0.3, [0.0], key=KEY, attack=other, settings=SARSettings(checkpoint_dir=tmp_path))
    # ... and an attack built elsewhere is "custom" (its hyperparameters are unknown).
    custom = make_joint_pgd(POOL.apply, steps=2, step=JointPGDStep(restarts=1, step_size=0.05))
    with pytest.raises(FingerprintMismatch, match=r"written with attack=joint_pgd, .*this run has attack=custom"):
        run_sar(POOL, X, 0.3, [0.0], key=KEY, attack=custom, settings=SARSettings(checkpoint_dir=tmp_path))
    again = run_sar(POOL, X, 0.3, [0.0], key=KEY, attack=attack, settings=SARSettings(checkpoint_dir=tmp_path))
    assert again.batch_size == 4


def test_settings_reach_the_run():
    attack = default_sar_attack(POOL, steps=2, restarts=1)
    bare = run_sar(POOL, X, 0.3, [0.0], key=KEY, attack=attack, settings=SARSettings(store_inputs=False))
    kept = run_sar(POOL, X, 0.3, [0.0], key=KEY, attack=attack)
    assert bare.inputs is None and kept.inputs is not None
    chunked = run_sar(POOL, X, 0.3, [0.0], key=KEY, attack=attack, settings=SARSettings(chunk_size=3))
    np.testing.assert_array_equal(chunked.sar, kept.sar)  # per-sample streams: chunking changes nothing


def test_default_attack_of_another_pool_is_refused():
    with pytest.raises(ValueError, match=r"built on another pool"):
        run_sar(_pool(seed=1), X, 0.3, [0.0], key=KEY, attack=default_sar_attack(POOL, steps=1, restarts=1))


def test_bad_settings_name_what_was_expected():
    with pytest.raises(ValueError, match=r"chunk_size must be an int >= 1, got 0"):
        SARSettings(chunk_size=0)
    with pytest.raises(ValueError, match=r"chunk_size must be an int >= 1, got True"):
        SARSettings(chunk_size=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"pack_levels must be an int >= 0, got -1"):
        SARSettings(pack_levels=-1)
    with pytest.raises(TypeError, match=r"SARSettings.progress must be a bool, got str 'yes'"):
        SARSettings(progress="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"SARSettings.checkpoint_dir must be None, a str or a path, got int"):
        SARSettings(checkpoint_dir=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"settings must be a sarjax.sar.SARSettings or None, got dict"):
        run_sar(POOL, X, 0.3, [0.0], key=KEY, settings={"chunk_size": 2})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"attack must be a mask-driven attack entry or None, got str"):
        run_sar(POOL, X, 0.3, [0.0], key=KEY, attack="joint_pgd")  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        SARSettings().chunk_size = 2  # type: ignore[misc]
