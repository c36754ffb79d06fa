"""Random affine (and elastic) warps of images, written for one image and vmapped.

Used for per-member training augmentation and for the distillation transfer set.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.ndimage import map_coordinates


def _warp(img: jax.Array, rows: jax.Array, cols: jax.Array) -> jax.Array:
    """Bilinear resample of one image [H, W, C] at coordinates [H, W] (zero outside)."""
    return jnp.stack(
        [map_coordinates(img[..., c], [rows, cols], order=1, mode="constant", cval=0.0) for c in range(img.shape[-1])],
        axis=-1,
    )


def random_affine(
    key: jax.Array,
    img: jax.Array,
    strength: float | jax.Array = 1.0,
    *,
    max_rotate: float = 15.0,
    max_shift: float = 0.1,
    max_scale: float = 0.1,
    max_shear: float = 0.2,
    elastic: float | jax.Array = 0.0,
) -> jax.Array:
    """Random affine warp of one image about its centre.

    Args:
      key: PRNG key.
      img: [H, W, C] in [0, 1].
      strength: multiplies every range below (0 = identity); may be a traced per-member value.
      max_rotate: rotation range in degrees (uniform in +-).
      max_shift: translation range as a fraction of the side.
      max_scale: zoom range (scale uniform in 1 +- max_scale).
      max_shear: shear range (radians-ish factor, uniform in +-).
      elastic: amplitude in pixels of a smooth random displacement field (0 = off).

    Returns:
      [H, W, C] warped image in [0, 1].
    """
    h, w = img.shape[0], img.shape[1]
    k = jax.random.split(key, 6)
    s = jnp.asarray(strength, jnp.float32)
    ang = jnp.deg2rad(jax.random.uniform(k[0], (), minval=-max_rotate, maxval=max_rotate)) * s
    scale = 1.0 + jax.random.uniform(k[1], (), minval=-max_scale, maxval=max_scale) * s
    shear = jax.random.uniform(k[2], (), minval=-max_shear, maxval=max_shear) * s
    shift = jax.random.uniform(k[3], (2,), minval=-max_shift, maxval=max_shift) * s * jnp.array([h, w])
    cy, cx = (h - 1) / 2.0, (w - 1) / 2.0
    r, c = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32), jnp.arange(w, dtype=jnp.float32), indexing="ij")
    y, x = r - cy - shift[0], c - cx - shift[1]
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    # inverse map: output pixel -> source pixel
    src_y = (cos * y - sin * x) / scale + cy
    src_x = (sin * y + cos * x + shear * y) / scale + cx
    if not (isinstance(elastic, (int, float)) and elastic == 0.0):
        coarse = jax.random.normal(k[4], (2, 4, 4)) * jnp.asarray(elastic, jnp.float32)
        field = jax.image.resize(coarse, (2, h, w), method="cubic")
        src_y = src_y + field[0]
        src_x = src_x + field[1]
    return jnp.clip(_warp(img, src_y, src_x), 0.0, 1.0)


def transfer_set(
    key: jax.Array,
    images: np.ndarray,
    n: int,
    *,
    strength: float = 1.0,
    elastic: float = 0.0,
    batch: int = 2048,
) -> np.ndarray:
    """Draw ``n`` augmented images from ``images`` for distillation (when EMNIST is not at hand).

    Each output picks a source image uniformly at random and applies :func:`random_affine`
    (rotation, shift, scale, shear; optional elastic). Deterministic given ``key``.

    Args:
      key: PRNG key.
      images: [N, H, W, C] in [0, 1].
      n: number of images to generate (> 0).
      strength: augmentation strength (see :func:`random_affine`).
      elastic: elastic displacement amplitude in pixels.
      batch: generation chunk size (memory only; the result does not depend on it).

    Returns:
      [n, H, W, C] float32 in [0, 1].
    """
    images = np.asarray(images, np.float32)
    if images.ndim != 4:
        raise ValueError(f"images must be [N, H, W, C], got shape {images.shape}")
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    src = np.asarray(jax.random.randint(jax.random.fold_in(key, 0), (n,), 0, len(images)))
    keys = jax.random.split(jax.random.fold_in(key, 1), n)
    fn = jax.jit(jax.vmap(lambda k, im: random_affine(k, im, strength, elastic=elastic)))
    out = [np.asarray(fn(keys[i : i + batch], images[src[i : i + batch]])) for i in range(0, n, batch)]
    return np.concatenate(out, axis=0)
