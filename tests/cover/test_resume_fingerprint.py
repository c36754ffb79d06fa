"""Resumable runs: fingerprints, overwrite, new deltas from a finished run, run_sar's input checks."""

import json
import re

import jax
import numpy as np
import pytest

from sarjax.cover import GreedySettings, SetSystemOracle, greedy_sar
from sarjax.cover.result import rederive
from sarjax.runtime.fingerprint import (
    FINGERPRINT_FILE,
    FingerprintMismatch,
    check_fingerprint,
    write_fingerprint,
)

pytest.importorskip("sarjax.attacks.joint")

from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import mlp
from sarjax.sar import SARSettings
from sarjax.sar.vision import run_sar

ARCH = mlp((8,), input_shape=(4, 4, 1), num_classes=3)


def _pool(m=3, seed=0):
    shapes = jax.eval_shape(ARCH.init, jax.random.PRNGKey(0))
    rng = np.random.default_rng(seed)
    params = jax.tree.map(
        lambda s: (rng.standard_normal((m,) + s.shape) / np.sqrt(s.shape[0])).astype(np.float32), shapes
    )
    return Pool([Stack(ARCH, params, tuple(f"m{i}" for i in range(m)))])


POOL = _pool()
ATTACK = make_joint_pgd(
    POOL.apply, steps=3, step=JointPGDStep(restarts=1)
)  # eps is a call argument: one kernel for the file
K0 = jax.random.PRNGKey(0)
X = np.random.default_rng(3).random((4, 4, 4, 1), dtype=np.float32)


def _sar(eps, deltas, ckpt, *, key=None, overwrite=False):
    key = jax.random.PRNGKey(0) if key is None else key  # run_sar requires a key
    return run_sar(
        POOL, X, eps, deltas, key=key, attack=ATTACK, settings=SARSettings(checkpoint_dir=ckpt, overwrite=overwrite)
    )


# -- fingerprint ----------------------------------------------------------------------------


def test_rerun_with_other_eps_or_key_raises_naming_the_setting(tmp_path):
    first = _sar(0.3, [0.0], tmp_path)
    assert json.loads((tmp_path / FINGERPRINT_FILE).read_text())["eps"] == 0.3
    # The old code loaded chunk_0/result and returned the eps=0.3 SAR for eps=0.05.
    with pytest.raises(ValueError, match=r"written with eps=0\.3, this run has eps=0\.05; pass overwrite=True"):
        _sar(0.05, [0.0], tmp_path)
    with pytest.raises(ValueError, match=r"key=\[0, 7\]"):
        _sar(0.3, [0.0], tmp_path, key=jax.random.PRNGKey(7))
    with pytest.raises(ValueError, match="pool="):
        run_sar(
            _pool(seed=1),
            X,
            0.3,
            [0.0],
            attack=ATTACK,
            settings=SARSettings(checkpoint_dir=tmp_path),
            key=jax.random.PRNGKey(0),
        )
    with pytest.raises(ValueError, match="images="):
        run_sar(
            POOL,
            X[::-1].copy(),
            0.3,
            [0.0],
            attack=ATTACK,
            settings=SARSettings(checkpoint_dir=tmp_path),
            key=jax.random.PRNGKey(0),
        )
    again = _sar(0.3, [0.0], tmp_path)  # same settings: resumes (loads the finished chunk)
    np.testing.assert_array_equal(again.sar, first.sar)


def test_overwrite_discards_the_old_run(tmp_path):
    _sar(0.3, [0.0], tmp_path)
    (tmp_path / "keep.txt").write_text("not ours")
    res = _sar(0.05, [0.0], tmp_path, overwrite=True)
    fresh = run_sar(POOL, X, 0.05, [0.0], attack=ATTACK, key=jax.random.PRNGKey(0))
    np.testing.assert_array_equal(res.sar, fresh.sar)
    np.testing.assert_array_equal(res.k_hat, fresh.k_hat)
    assert json.loads((tmp_path / FINGERPRINT_FILE).read_text())["eps"] == 0.05
    assert (tmp_path / "keep.txt").exists()  # only what run_sar wrote is removed


def test_checkpoint_without_fingerprint_is_refused(tmp_path):
    _sar(0.3, [0.0], tmp_path)
    (tmp_path / FINGERPRINT_FILE).unlink()  # as written by an older sarjax
    with pytest.raises(ValueError, match="without a fingerprint.json"):
        _sar(0.3, [0.0], tmp_path)


def test_other_deltas_unfinished_run_is_refused(tmp_path):
    write_fingerprint(tmp_path, {"a": 1, "deltas": [0.0]})
    with pytest.raises(FingerprintMismatch, match=r"written with a=1, this run has a=2; HINT"):
        check_fingerprint(tmp_path, {"a": 2, "deltas": [0.0]}, hint="HINT", holds_results=True)
    stored = check_fingerprint(tmp_path, {"a": 1, "deltas": [0.5]}, hint="HINT", holds_results=True, allow=("deltas",))
    assert stored["deltas"] == [0.0]
    # run_sar: a run killed after its first round (no chunk result yet) cannot give other deltas.
    _sar(0.3, [0.0], tmp_path / "r")
    import shutil

    shutil.rmtree(tmp_path / "r" / "chunk_0" / "result")
    with pytest.raises(
        ValueError, match=r"deltas=\[0\.0\], this run has deltas=\[0\.5\], and .*finish it first\); pass overwrite"
    ):
        _sar(0.3, [0.5], tmp_path / "r")


# -- new deltas from a finished run -----------------------------------------------------------


def test_new_delta_on_finished_run_is_derived_or_refused(tmp_path):
    # The old code loaded the finished chunk as is: the SAR of the old delta under the new one
    # (and a KeyError in demo.py). Now a delta the coverage order determines is read off it ...
    stored = _sar(0.8, [1 / 3], tmp_path / "a")  # M=3, tau=2
    derived = _sar(0.8, [2 / 3], tmp_path / "a")  # tau=1: every sample reached it on the way
    fresh = run_sar(POOL, X, 0.8, [2 / 3], attack=ATTACK, key=jax.random.PRNGKey(0))
    assert derived.deltas == (2 / 3,) and stored.deltas == (1 / 3,)
    np.testing.assert_array_equal(derived.sar, fresh.sar)
    np.testing.assert_array_equal(derived.k_hat, fresh.k_hat)
    assert not np.array_equal(derived.sar, stored.sar)
    # ... and one it does not determine is refused, naming the samples.
    _sar(0.3, [0.0], tmp_path / "b")  # tau=3: every sample stopped with a member left unbroken
    with pytest.raises(
        ValueError,
        match=r"delta=0.333333 \(tau=2 of M=3\) is not determined by the stored "
        r"run at deltas=\[0.0\]: samples \[0, 1, 2, 3\] .*overwrite=True",
    ):
        _sar(0.3, [1 / 3], tmp_path / "b")


def test_rederive_equals_a_separate_run_whenever_it_answers():
    # Set-system oracles (per-sample, deterministic): every delta rederive answers must equal a
    # fresh greedy run for that delta; the ones it refuses must include the cases where the old
    # SARResult.sar_at (a target between the requested ones) is wrong.
    rng = np.random.default_rng(0)
    answered = refused = 0
    for _ in range(150):
        sets = rng.random((6, 5, 6)) < 0.3
        vis = rng.random((6, 5)) < 0.6
        clean = rng.random((6, 6)) < 0.1
        old = [float(d) for d in rng.choice([0.0, 0.2, 0.5, 0.7], size=rng.integers(1, 3), replace=False)]
        new = [float(rng.choice([0.0, 0.1, 0.2, 0.4, 0.5, 0.7, 0.8]))]
        o1, o2 = SetSystemOracle(sets, vis), SetSystemOracle(sets, vis)
        stored = greedy_sar(o1.joint, o1.single, clean, old)
        want = greedy_sar(o2.joint, o2.single, clean, new)
        try:
            got = rederive(stored, new)
        except ValueError as e:
            assert "not determined" in str(e)
            refused += 1
            continue
        answered += 1
        for name in ("sar", "k_hat", "reached", "sar_singleton", "k_singleton"):
            if hasattr(want, name):
                np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    assert answered > 50 and refused > 20


def test_rederive_known_answer():
    # M=4; the only inputs break {0} and {1}; members 2 and 3 are unbreakable.
    sets = np.zeros((1, 2, 4), bool)
    sets[0, 0, 0] = sets[0, 1, 1] = True
    none = np.zeros((1, 4), bool)

    def run(deltas, **kw):
        o = SetSystemOracle(sets)
        return greedy_sar(o.joint, o.single, none, deltas, settings=GreedySettings(**kw))

    full = run([0.0])  # tau=4: {0}, {1}, fallback on 2 fails; 2 covered + 1 left < 4: stop
    assert full.sar.tolist() == [[1.0]] and full.unbreakable[0].tolist() == [False, False, True, False]
    assert rederive(full, [0.5]).k_hat.tolist() == [[2]]  # tau=2 was reached after 2 inputs
    assert rederive(full, [0.75]).k_hat.tolist() == [[1]]  # tau=1 after 1
    with pytest.raises(ValueError, match=r"delta=0\.25 \(tau=3 of M=4\) is not determined.*samples \[0\]"):
        rederive(full, [0.25])  # 2 covered + member 3 left: a tau=3 run would still attack 3
    literal = run([0.0], stop_when_unreachable=False)  # runs until I is empty: 2 and 3 unbreakable
    assert rederive(literal, [0.25]).sar.tolist() == [[1.0]]  # 2 covered + 0 left < 3: SAR 1
    loose = run([0.5])  # stops once {0}, {1} reach tau=2, with members 2, 3 untried
    with pytest.raises(ValueError, match=r"delta=0 \(tau=4 of M=4\) is not determined"):
        rederive(loose, [0.0])
    assert rederive(loose, [0.5, 0.75]).k_hat.tolist() == [[2, 1]]


# -- run_sar input checks ---------------------------------------------------------------------


def test_run_sar_rejects_bad_inputs_with_what_was_expected():
    with pytest.raises(TypeError, match=r"pool must be a sarjax.models.Pool .* got NoneType"):
        run_sar(None, X, 0.1, [0.0], key=K0)
    with pytest.raises(TypeError, match=r"x must be an array of images \[B, 4, 4, 1\].*got NoneType"):
        run_sar(POOL, None, 0.1, [0.0], key=K0)
    with pytest.raises(ValueError, match=r"at least one image, got an empty batch of shape \[0, 4, 4, 1\]"):
        run_sar(POOL, X[:0], 0.1, [0.0], key=K0)
    with pytest.raises(ValueError, match=r"expected inputs of shape \[B, 4, 4, 1\], got \[4, 4, 4\]"):
        run_sar(POOL, X[..., 0], 0.1, [0.0], key=K0)
    for eps in (float("inf"), float("nan"), -1.0):
        with pytest.raises(ValueError, match="eps must be a finite float > 0"):
            run_sar(POOL, X, eps, [0.0], key=K0)
    with pytest.raises(ValueError, match="delta"):
        run_sar(POOL, X, 0.1, [1.0], key=K0)
    with pytest.raises(ValueError, match="deltas must be a non-empty"):
        run_sar(POOL, X, 0.1, [], key=K0)


def test_run_sar_rejects_labels_outside_the_classes():
    # The old code ran and returned SAR 0 for every sample (every member "broken" on the clean image).
    with pytest.raises(
        ValueError,
        match=r"labels out of range \[0, C=3\): samples \[0, 1, 3\] "
        r"have \[10, 99, -1\]",
    ):
        run_sar(POOL, X, 0.1, [0.0], labels=np.array([10, 99, 2, -1]), key=K0)


def test_attack_rejects_a_wrong_input_shape_before_tracing():
    # The old code failed inside dot_general (a 5x5 image on a 4x4 model) or, for an MLP that
    # flattens, ran silently on a [B, 4, 4] batch.
    ref = np.zeros((4, 3), np.int32)
    wrong = np.random.default_rng(0).random((4, 5, 5, 1), dtype=np.float32)
    for x in (wrong, X[..., 0]):
        with pytest.raises(ValueError, match=re.escape(f"x0 must have shape [B, 4, 4, 1], got {list(x.shape)}")):
            ATTACK(POOL.params, x, ref, key=jax.random.PRNGKey(0), mask=np.ones((4, 3), np.float32), eps=0.1)
    bare = make_joint_pgd(
        lambda p, x: POOL.apply(p, x), steps=1, step=JointPGDStep(restarts=1)
    )  # no input_shape to compare
    with pytest.raises(ValueError, match=r"the model cannot take x0 of shape \[4, 5, 5, 1\].*dot_general"):
        bare(POOL.params, wrong, ref, key=jax.random.PRNGKey(0), mask=np.ones((4, 3), np.float32), eps=0.1)
