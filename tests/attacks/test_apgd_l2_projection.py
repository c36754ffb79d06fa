"""APGD's l2 step rule: AutoAttack's reference rescales onto the ball and then clips to the box
(``projection="reference"``, the default); ``projection="exact"`` projects onto the ball ∩ box.
Hand-computed answers on a 2-element point and on one APGD step of an affine model whose
gradient pushes two elements out of the box."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.attacks import geometry as G
from sarjax.attacks.apgd import APGDSchedule, make_apgd, make_apgd_t, project_rescale_clip, random_on_sphere


def test_rescale_clip_hand_computed():
    x0 = jnp.asarray([0.9, 0.5])
    x = x0 + jnp.asarray([0.6, 0.8])  # ||d|| = 1, eps 0.5: rescaled to (0.3, 0.4), then clipped
    ref = project_rescale_clip(x, x0, 0.5)
    np.testing.assert_allclose(np.asarray(ref), [1.0, 0.9], atol=1e-6)
    # the exact projection keeps the whole budget: (1.0, 0.5 + sqrt(0.25 - 0.01))
    exact = G.project(x, x0, 0.5, 2)
    np.testing.assert_allclose(np.asarray(exact), [1.0, 0.5 + np.sqrt(0.24)], atol=1e-5)
    # inside the ball and the box: unchanged
    inner = x0 + jnp.asarray([0.03, 0.04])
    np.testing.assert_allclose(np.asarray(project_rescale_clip(inner, x0, 0.5)), np.asarray(inner), atol=1e-7)


def test_random_on_sphere_is_on_the_sphere():
    x0 = jnp.full((4, 4, 1), 0.5)
    keys = jax.random.split(jax.random.PRNGKey(0), 16)
    xs = jax.vmap(lambda k: random_on_sphere(k, x0, 0.2))(keys)  # no element reaches the box
    norms = np.linalg.norm(np.asarray(xs - x0).reshape(16, -1), axis=1)
    np.testing.assert_allclose(norms, 0.2, rtol=1e-5)
    assert np.all(norms <= 0.2)


def _affine():
    # 2 classes, z0 = x . w + 5, z1 = 0: label 0, CE ascent direction -w; elements 0 and 2 sit on
    # the box faces the ascent direction pushes into
    w = np.asarray([-1.0, -1.0, 1.0, 1.0], np.float32)
    W = np.stack([w, np.zeros(4, np.float32)], 1)
    params = {"W": jnp.asarray(W), "b": jnp.asarray([5.0, 0.0])}
    x0 = np.asarray([[1.0, 0.5, 0.0, 0.5]], np.float32)
    return params, x0, w


def linear(p, x):
    return x.reshape(x.shape[0], -1) @ p["W"] + p["b"]


@pytest.mark.parametrize("projection", ["reference", "exact"])
def test_one_apgd_step_hand_computed(projection):
    params, x0, w = _affine()
    eps = 0.3
    fn = make_apgd(linear, norm="l2", eps=eps, n_iter=1, loss="ce", schedule=APGDSchedule(projection=projection))
    res = fn(params, jnp.asarray(x0), jnp.asarray([0]), key=jax.random.PRNGKey(0), x_init=jnp.asarray(x0))
    u = -w / np.linalg.norm(w)  # the normalised CE gradient; the step is 2 eps
    if projection == "reference":  # rescale 2 eps u to eps u, then clip: elements 0 and 2 lost
        want = np.clip(x0[0] + eps * u, 0.0, 1.0)
        assert np.linalg.norm(want - x0[0]) < 0.75 * eps
    else:  # the nearest point of ball ∩ box, clip(x0 + t 2 eps u) on the sphere: elements 0 and 2
        # stay on their faces, elements 1 and 3 use the whole radius (t = 1 / (2 ||u_free||) < 1)
        free = np.asarray([0.0, 1.0, 0.0, 1.0])
        want = x0[0] + eps * u * free / np.linalg.norm(u * free)
        np.testing.assert_allclose(np.linalg.norm(want - x0[0]), eps, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(res.x_adv)[0], want, atol=1e-5)
    assert not bool(np.asarray(res.success).any())  # the bias keeps class 0


def test_projection_checked():
    with pytest.raises(ValueError, match="projection must be one of"):
        make_apgd(linear, norm="l2", schedule=APGDSchedule(projection="nearest"))
    with pytest.raises(ValueError, match="projection must be one of"):
        make_apgd_t(linear, norm="l2", schedule=APGDSchedule(projection=None))
