"""Plots of a frontier study (the frontier paper Figures 2, 3, 5 and 6).

* :func:`plot_curves`: every model's robustness-perturbation curve coloured by its DOI, the
  defense frontier dashed and shaded (Figure 6);
* :func:`plot_aoi_vs_budget`: global AOI per budget tier, train vs held-out models (Figure 2);
* :func:`plot_ensemble_vs_fixed_eps`: per-model AOI of the ensembles at each tier beside a
  fixed-eps attack's (AutoAttack's) AOI (Table 4 / Figure 3);
* :func:`plot_rank_bump`: ranks by robust accuracy along an eps grid, the most unstable models
  highlighted (Figure 5).

Every function writes one file (PNG/PDF by extension) and returns its path.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sarjax.frontier.curves import StepCurve
from sarjax.frontier.defense import defense_frontier


def _plt():
    import matplotlib  # heavy optional dependency: imported only to plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after matplotlib.use("Agg")

    return plt


def _step_xy(curve: StepCurve, upper: float) -> tuple[np.ndarray, np.ndarray]:
    """Points of the right-continuous step curve on ``[0, upper]`` for ``drawstyle='steps-post'``."""
    bp = curve.breakpoints
    bp = bp[bp <= upper]
    x = np.concatenate([[0.0], bp, [upper]])
    return x, curve(x)


def plot_curves(
    distances,
    names: Sequence[str],
    doi,
    path: str | os.PathLike,
    *,
    norm: str = "",
    title: str | None = None,
) -> Path:
    """Robustness-perturbation curves of ``M`` models coloured by DOI, the defense frontier
    dashed red and shaded (the frontier paper Figure 6).

    Args:
      distances: ``[M, B]`` ensemble distances per model (0: misclassified, inf: unbroken).
      names: ``M`` model names (legend).
      doi: ``[M]`` DOI per model (the colour).
      path: output file.
      norm: the norm's name for the x label.
      title: optional title.
    """
    plt = _plt()
    # heavy optional dependency: imported only to plot
    import matplotlib
    from matplotlib import cm, colors

    d = np.asarray(distances, np.float64)
    dv = np.asarray(doi, np.float64)
    front = StepCurve.from_distances(defense_frontier(d))
    upper = max(front.eps_zero, 1e-12) * 1.05
    cmap = matplotlib.colormaps["viridis"]
    normc = colors.Normalize(vmin=float(np.nanmin(dv)), vmax=float(np.nanmax(dv)) + 1e-12)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    x, y = _step_xy(front, upper)
    ax.fill_between(x, y, step="post", color="tab:red", alpha=0.12, lw=0)
    ax.plot(x, y, drawstyle="steps-post", color="tab:red", ls="--", lw=1.8, label="defense frontier")
    for i, name in enumerate(names):
        xs, ys = _step_xy(StepCurve.from_distances(d[i]), upper)
        ax.plot(xs, ys, drawstyle="steps-post", color=cmap(normc(dv[i])), lw=1.2, label=f"{name} (DOI {dv[i]:.3f})")
    sm = cm.ScalarMappable(norm=normc, cmap=cmap)
    fig.colorbar(sm, ax=ax, label="DOI")
    ax.set_xlim(0, upper)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(f"perturbation size ||δ||{'_' + norm if norm else ''}")
    ax.set_ylabel("robust accuracy ρ(ε)")
    if len(names) <= 12:
        ax.legend(fontsize=7, loc="upper right")
    ax.set_title(title or "robustness-perturbation curves (colour: DOI)")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return Path(path)


def plot_aoi_vs_budget(
    budgets: Sequence[int],
    train_aoi: Sequence[float],
    heldout_aoi: Sequence[float | None],
    path: str | os.PathLike,
    *,
    title: str | None = None,
) -> Path:
    """Global AOI per budget tier on the train and the held-out models (the frontier paper Figure 2)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.6))
    ax.plot(budgets, 100 * np.asarray(train_aoi), "o-", color="tab:blue", label="train models")
    held = [np.nan if h is None else h for h in heldout_aoi]
    if not np.all(np.isnan(held)):
        ax.plot(budgets, 100 * np.asarray(held, np.float64), "s-", color="tab:red", label="held-out models")
    ax.set_xlabel("query budget Q")
    ax.set_ylabel("AOI (%)")
    ax.set_xticks(list(budgets))
    ax.legend()
    ax.set_title(title or "attack optimality vs budget")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return Path(path)


def plot_ensemble_vs_fixed_eps(
    names: Sequence[str],
    budgets: Sequence[int],
    tier_aoi,
    path: str | os.PathLike,
    *,
    fixed_eps_aoi=None,
    fixed_eps_label: str = "AutoAttack",
    title: str | None = None,
) -> Path:
    """Per-model AOI of the ensembles at each tier, with a fixed-eps attack's AOI as markers
    (the frontier paper Table 4).

    Args:
      names: ``M`` model names.
      budgets: ``K`` tier budgets.
      tier_aoi: ``[K, M]`` per-model AOI per tier.
      path: output file.
      fixed_eps_aoi: optional ``[M]`` AOI of the fixed-eps attack's interpolated curve (NaN
        where not run).
      fixed_eps_label: its legend label.
    """
    plt = _plt()
    a = 100 * np.asarray(tier_aoi, np.float64)
    K, M = a.shape
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * M + 2), 3.8))
    w = 0.8 / K
    x = np.arange(M)
    for k in range(K):
        ax.bar(x + (k - (K - 1) / 2) * w, a[k], w, label=f"ensemble {budgets[k]}")
    if fixed_eps_aoi is not None:
        ax.plot(x, 100 * np.asarray(fixed_eps_aoi, np.float64), "k_", ms=18, mew=2, label=fixed_eps_label)
    lo = np.nanmin(a) if fixed_eps_aoi is None else np.nanmin([np.nanmin(a), 100 * np.nanmin(fixed_eps_aoi)])
    ax.set_ylim(max(0.0, lo - 2), 100.5)
    ax.set_xticks(x, list(names), rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("AOI (%)")
    ax.legend(fontsize=8)
    ax.set_title(title or "ensembles per tier" + (f" vs {fixed_eps_label}" if fixed_eps_aoi is not None else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return Path(path)


def plot_rank_bump(
    eps,
    ranks,
    names: Sequence[str],
    path: str | os.PathLike,
    *,
    highlight: int = 5,
    eps_ref: float | None = None,
    title: str | None = None,
) -> Path:
    """Bump chart of the ranks by robust accuracy along an eps grid (the frontier paper Figure 5).

    Args:
      eps: ``[E]`` the grid.
      ranks: ``[E, M]`` ranks (1 = most robust).
      names: ``M`` model names.
      path: output file.
      highlight: how many of the most unstable models (largest rank change) to colour.
      eps_ref: optional reference eps (dashed vertical line).
    """
    plt = _plt()
    r = np.asarray(ranks)
    e = np.asarray(eps, np.float64)
    shift = r.max(axis=0) - r.min(axis=0)
    top = set(np.argsort(-shift, kind="stable")[:highlight].tolist())
    fig, ax = plt.subplots(figsize=(6.5, 4))
    pos = np.arange(e.size)
    for m, name in enumerate(names):
        if m in top:
            ax.plot(pos, r[:, m], "o-", lw=2, label=f"{name} (moves {shift[m]})")
        else:
            ax.plot(pos, r[:, m], "-", color="0.75", lw=1)
    if eps_ref is not None:
        ax.axvline(float(np.interp(eps_ref, e, pos)), color="k", ls="--", lw=1)
    ax.set_xticks(pos, [f"{v:.3g}" for v in e], rotation=45, fontsize=8)
    ax.set_yticks(np.arange(1, r.shape[1] + 1))
    ax.invert_yaxis()
    ax.set_xlabel("ε")
    ax.set_ylabel("rank by robust accuracy")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.set_title(title or "rank instability across ε")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return Path(path)


__all__ = ["plot_aoi_vs_budget", "plot_curves", "plot_ensemble_vs_fixed_eps", "plot_rank_bump"]
