"""Analytic FLOP counts of the zoo's architectures (host-side, no JAX).

:func:`step_flops` turns a machine's matmul peak into a throughput ceiling for attack steps
(``benchmarks/joint_attack_throughput.py``); checked against XLA's cost analysis in
``tests/attacks/test_benchmark_flops.py``.
"""

from __future__ import annotations


def step_flops(arch) -> int:
    """FLOPs of one joint-PGD step for one member on one sample: forward + gradient to the input.

    Counts the multiply-adds of every dense and convolutional layer (2 FLOPs each) of the forward
    pass; the input gradient runs each layer's transposed product (the same multiply-adds, no
    weight gradients), so a step is twice the forward.  Activations, pooling, the loss and the
    projection are not counted (they are O(activations), not O(weights x activations)); the taps of
    a "same" convolution on the zero padding are (as im2col and PyTorch compute them).

    Args:
      arch: a :mod:`sarjax.models.zoo` architecture of family ``"mlp"`` or ``"cnn"``.

    Raises:
      ValueError: for any other family.
    """
    h, w, c = arch.input_shape
    macs = 0
    if arch.family == "mlp":
        fan = h * w * c
        for width in arch.widths:
            macs += fan * width
            fan = width
        macs += fan * arch.num_classes
    elif arch.family == "cnn":
        cin = c
        for ch in arch.widths:  # "same" convolution, then a 2x2 pool
            macs += h * w * arch.kernel * arch.kernel * cin * ch
            cin, h, w = ch, h // 2, w // 2
        macs += h * w * cin * arch.dense + arch.dense * arch.num_classes
    else:
        raise ValueError(f"step_flops: no FLOP count for family {arch.family!r}")
    return 2 * (2 * macs)


__all__ = ["step_flops"]
