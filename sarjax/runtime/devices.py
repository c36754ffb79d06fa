"""Accelerator datasheet figures for ``sarjax plan``'s roofline projections.

Every figure is the vendor's own, from the document named in ``source`` (dense peaks: NVIDIA's
datasheets print the tensor-core peaks "with sparsity" and state the dense figure is half). Memory
is in bytes as printed (GB = 10^9 bytes, conservative where the part holds 80 GiB).

Google's TPU pages give no float32 peak: XLA runs float32 matmuls on the MXU as bfloat16 passes
(JAX's default precision on TPU: one pass, so the bfloat16 peak; ``Precision.HIGHEST``: six). The
``fp32`` entry of a TPU is None and a plan of a float32 program on a TPU uses the bfloat16 peak,
saying so.
"""

from __future__ import annotations

import dataclasses

_NVIDIA_H100 = "NVIDIA H100 Tensor Core GPU Datasheet (H100 SXM column)"
_NVIDIA_A100 = "NVIDIA A100 Tensor Core GPU Datasheet (A100 SXM columns)"
_TPU_V5E = "Google Cloud TPU documentation, 'TPU v5e' (system architecture: chip specifications)"
_TPU_V5P = "Google Cloud TPU documentation, 'TPU v5p' (system architecture: chip specifications)"


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """One accelerator chip's datasheet figures.

    Attributes:
      name: the ``--device`` name.
      label: a human-readable name.
      memory_bytes: on-chip HBM, bytes.
      bandwidth: HBM bandwidth, bytes / s.
      peak_flops: dense peak FLOP/s per dtype key (``"fp32"``, ``"tf32"``, ``"bf16"``); None when
        the datasheet gives none.
      source: the datasheet (document name).
    """

    name: str
    label: str
    memory_bytes: float
    bandwidth: float
    peak_flops: dict
    source: str

    def peak(self, dtype: str) -> tuple[float, str]:
        """``(peak FLOP/s, note)`` for ``dtype`` (``fp32``, ``tf32`` or ``bf16``).

        Raises:
          ValueError: an unknown dtype key.
        """
        if dtype not in ("fp32", "tf32", "bf16"):
            raise ValueError(f"peak dtype must be fp32, tf32 or bf16, got {dtype!r}")
        v = self.peak_flops.get(dtype)
        if v is not None:
            return float(v), f"{dtype} peak of the datasheet"
        return float(
            self.peak_flops["bf16"]
        ), f"no {dtype} peak on the datasheet: the bf16 peak (XLA's default MXU pass)"


DEVICES: dict[str, DeviceSpec] = {
    d.name: d
    for d in (
        # H100 SXM5: FP32 67 TFLOPS; TF32 989 and BF16 1,979 TFLOPS "with sparsity" (dense: half);
        # 80 GB HBM3 at 3.35 TB/s
        DeviceSpec("h100-80gb", "NVIDIA H100 SXM 80 GB", 80e9, 3.35e12,
                   {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12}, _NVIDIA_H100),
        # A100 SXM: FP32 19.5 TFLOPS; TF32 156, BF16 312 TFLOPS dense; 40 GB HBM2 at 1,555 GB/s
        DeviceSpec("a100-40gb", "NVIDIA A100 SXM 40 GB", 40e9, 1.555e12,
                   {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12}, _NVIDIA_A100),
        # A100 80GB SXM: same compute; 80 GB HBM2e at 2,039 GB/s
        DeviceSpec("a100-80gb", "NVIDIA A100 SXM 80 GB", 80e9, 2.039e12,
                   {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12}, _NVIDIA_A100),
        # TPU v5e: 197 TFLOPS bf16 (394 int8) per chip; 16 GB HBM2 at 819 GB/s
        DeviceSpec("tpu-v5e", "Google TPU v5e", 16e9, 819e9, {"fp32": None, "tf32": None, "bf16": 197e12}, _TPU_V5E),
        # TPU v5p: 459 TFLOPS bf16 (918 int8) per chip; 95 GB HBM2e at 2,765 GB/s
        DeviceSpec("tpu-v5p", "Google TPU v5p", 95e9, 2.765e12, {"fp32": None, "tf32": None, "bf16": 459e12}, _TPU_V5P),
    )
}  # fmt: skip


def device_spec(name: str) -> DeviceSpec:
    """The :class:`DeviceSpec` named ``name``.

    Raises:
      ValueError: an unknown device, naming the known ones.
    """
    if name not in DEVICES:
        raise ValueError(f"unknown device {name!r}: expected one of {sorted(DEVICES)}")
    return DEVICES[name]


__all__ = ["DEVICES", "DeviceSpec", "device_spec"]
