"""Plots of a SAR run: the collective vulnerability curve and the SAR distribution."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from sarjax.cover.result import SARResult


def plot_sar(result: SARResult, path: str | os.PathLike, title: str | None = None) -> Path:
    """Write a three-panel figure (PNG/PDF by extension) of a SAR run.

    Left: mean share of the pool covered after ``k`` distinct inputs (valid
    samples), with the coverage targets ``tau / M`` as dashed lines (the
    collective vulnerability curve of the SAR paper). Middle: the distribution of
    ``SAR_{1-delta}`` over samples, one histogram per delta. Right: the same
    for the singleton-completed SAR (the SAR paper, Figures 7 and 8), which
    stays below 1 where the target was out of reach. Legends give the mean
    ± standard error over the valid samples.

    Args:
        result: a :class:`SARResult`.
        path: output file.
        title: optional figure title.

    Returns:
        The written path.
    """
    import matplotlib  # heavy dependency: imported only to plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after matplotlib.use("Agg")

    m = result.num_members
    v = result.valid
    curve = result.coverage_curve()[v] / m
    fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=(15, 4))
    if curve.size:
        ks = np.arange(curve.shape[1])
        ax0.plot(ks, curve.mean(axis=0), marker="o", label="mean covered share")
    for tau in sorted(set(result.taus)):
        ax0.axhline(tau / m, linestyle="--", linewidth=0.8, color="gray")
    ax0.set_xlabel("distinct inputs k")
    ax0.set_ylabel("covered share of the pool")
    ax0.set_ylim(0, 1.02)
    ax0.legend(loc="lower right")
    bins = (np.arange(m + 2) - 0.5) / m  # one bin per k / M, k = 0..M

    def label(delta: float, mean: float | None, se: float | None) -> str:
        if mean is None:
            return f"delta={delta:.3g}"
        return f"delta={delta:.3g}: {mean:.3f}" + ("" if se is None else f" ± {se:.3f}")

    for j, (delta, st) in enumerate(zip(result.deltas, result.sar_stats())):
        ax1.hist(result.sar[v, j], bins=bins, alpha=0.5, label=label(delta, st["mean_sar"], st["se_sar"]))
        ax2.hist(
            result.sar_singleton[v, j],
            bins=bins,
            alpha=0.5,
            label=label(delta, st["mean_sar_singleton"], st["se_sar_singleton"]),
        )
    ax1.set_xlabel("SAR (k_hat / M; 1 = target not reached)")
    ax2.set_xlabel("singleton-completed SAR (missing members: one input each)")
    for ax in (ax1, ax2):
        ax.set_ylabel("samples")
        ax.legend(fontsize=8)
    return save_figure(fig, path, title)


def save_figure(fig, path: str | os.PathLike, title: str | None = None) -> Path:
    """Titles (when given), lays out, writes (parent folders created) and closes ``fig``;
    returns the written path."""
    import matplotlib.pyplot as plt  # heavy dependency: imported only to plot

    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
