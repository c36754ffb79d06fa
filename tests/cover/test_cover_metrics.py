"""Known-answer tests for sarjax.cover.metrics."""

import math

import numpy as np
import pytest

from sarjax.cover import asr, coverage_target, jasc, tasc, theorem1_factor


@pytest.mark.parametrize(
    "delta, m, tau",
    [
        (0.0, 7, 7),
        (0.15, 20, 17),
        (1 / 6, 6, 5),
        (1 / 3, 6, 4),
        (0.5, 6, 3),
        (3 / 8, 8, 5),
        (0.25, 8, 6),
        (0.5, 8, 4),
        (0.99, 5, 1),
        (0.1, 20, 18),
        (0.05, 20, 19),
    ],
)
def test_coverage_target_known(delta, m, tau):
    assert coverage_target(delta, m) == tau


@pytest.mark.parametrize("delta", [1.0, -0.1, float("nan"), 1.5])
def test_coverage_target_rejects_bad_delta(delta):
    with pytest.raises(ValueError, match="delta"):
        coverage_target(delta, 5)


def test_coverage_target_rejects_bad_m():
    with pytest.raises(ValueError, match="num_members"):
        coverage_target(0.0, 0)
    with pytest.raises(TypeError, match="num_members"):
        coverage_target(0.0, 2.0)


def test_theorem1_factor():
    assert theorem1_factor(1) == 1.0
    assert theorem1_factor(7) == pytest.approx(1 + math.log(7))
    assert theorem1_factor(20, alpha=0.5) == pytest.approx(1 + 2 * math.log(20))
    for bad in (0.0, 1.5, -1.0):
        with pytest.raises(ValueError, match="alpha"):
            theorem1_factor(5, alpha=bad)
    with pytest.raises(ValueError, match="tau"):
        theorem1_factor(0)


def test_asr_known():
    s = np.array([[1, 0], [1, 1], [0, 0], [1, 0]], dtype=bool)
    np.testing.assert_allclose(asr(s), [0.75, 0.25])
    np.testing.assert_allclose(asr(s, valid=np.array([1, 1, 0, 0], bool)), [1.0, 0.5])
    with pytest.raises(TypeError, match="bool"):
        asr(s.astype(int))
    with pytest.raises(ValueError, match="valid"):
        asr(s, valid=np.zeros(4, bool))


def test_tasc_and_jasc_known():
    # B=2 samples, 3 sources = 3 targets.
    c = np.zeros((2, 3, 3), dtype=bool)
    c[0, 0] = [1, 1, 0]
    c[1, 0] = [1, 0, 0]
    c[0, 1] = [0, 1, 1]
    c[1, 1] = [1, 1, 1]
    c[0, 2] = [0, 0, 0]
    c[1, 2] = [0, 0, 1]
    np.testing.assert_allclose(tasc(c), [1.5 / 3, 2.5 / 3, 0.5 / 3])
    # Without the source itself: source 0 covers {1} and {}, source 1 {2} and {0,2}.
    np.testing.assert_allclose(tasc(c, exclude_source=True), [0.5 / 2, 1.5 / 2, 0.0])
    for j in range(3):  # tASC(j) = jASC({j})
        assert tasc(c)[j] == pytest.approx(jasc(c[:, j]))
    assert jasc(c[:, 1], valid=np.array([False, True])) == 1.0
    with pytest.raises(ValueError, match="M_source == M_target"):
        tasc(c[:, :2], exclude_source=True)
