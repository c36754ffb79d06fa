"""The resumable run both SAR pipelines share (sarjax.sar.driver.ResumableRun), on a synthetic set
system: a finished part is read back without building its oracles, other deltas are re-derived
from a finished run and refused on an unfinished one, cached steps run once."""

import numpy as np
import pytest

from sarjax.cover import SetSystemOracle, greedy_sar
from sarjax.runtime.fingerprint import FingerprintMismatch
from sarjax.sar.driver import ResumableRun

B, N, M = 5, 6, 4
HINT = "pass overwrite=True to discard it"


def _sets():
    rng = np.random.default_rng(0)
    sets = rng.random((B, N, M)) < 0.4
    sets[:, np.arange(M), np.arange(M)] = True  # every member breakable alone
    return sets


SETS = _sets()
CLEAN = np.zeros((B, M), bool)


def _open(root, deltas, overwrite=False, **extra):
    run = ResumableRun(root, hint=HINT)
    fp = {"kind": "test", "deltas": list(deltas), **extra}
    run.open(fp, overwrite=overwrite, files=("fingerprint.json", "part"), results=("part",), parts=("part/result",))
    return run


def _greedy(run, deltas, built):
    def oracles():
        built.append(1)
        o = SetSystemOracle(SETS)
        return o.joint, o.single

    return run.greedy(oracles, CLEAN, deltas, checkpoint="part", result="part/result")


def test_a_finished_part_is_read_back_and_other_deltas_rederived(tmp_path):
    built: list = []
    first = _greedy(_open(tmp_path, (0.0,)), (0.0,), built)
    o = SetSystemOracle(SETS)
    ref = greedy_sar(o.joint, o.single, CLEAN, (0.0,))
    np.testing.assert_array_equal(first.k_hat, ref.k_hat)
    again = _greedy(_open(tmp_path, (0.0,)), (0.0,), built)
    assert len(built) == 1  # the rerun built no oracles
    np.testing.assert_array_equal(again.k_hat, first.k_hat)
    looser = _greedy(_open(tmp_path, (0.0, 0.5)), (0.0, 0.5), built)
    assert len(built) == 1 and looser.deltas == (0.0, 0.5)
    o = SetSystemOracle(SETS)
    ref2 = greedy_sar(o.joint, o.single, CLEAN, (0.0, 0.5))
    np.testing.assert_array_equal(looser.k_hat, ref2.k_hat)


def test_other_settings_raise_and_other_deltas_need_a_finished_run(tmp_path):
    _open(tmp_path, (0.0,), seed=1)
    with pytest.raises(FingerprintMismatch, match=r"seed.*pass overwrite=True"):
        _open(tmp_path, (0.0,), seed=2)
    # nothing finished yet (no part/result): other deltas are refused
    with pytest.raises(FingerprintMismatch, match=r"finish it first\); pass overwrite=True"):
        _open(tmp_path, (0.5,), seed=1)
    _open(tmp_path, (0.5,), overwrite=True, seed=2)  # overwrite starts afresh


def test_cached_steps_run_once(tmp_path):
    calls = []

    def step():
        calls.append(1)
        return {"a": [1, 2]}

    def arrays():
        calls.append(2)
        return {"x": np.arange(3)}

    for _ in range(2):
        run = _open(tmp_path, (0.0,))
        assert run.cached_json("step.json", step) == {"a": [1, 2]}
        np.testing.assert_array_equal(run.cached_arrays("x.npz", arrays)["x"], np.arange(3))
    assert calls == [1, 2]
    nowhere = ResumableRun(None, hint=HINT)  # no directory: every step runs
    nowhere.cached_json("step.json", step)
    assert calls == [1, 2, 1]
