"""The four frontier plots are written from a report (smoke: files exist and are PNGs)."""

import numpy as np

from sarjax.frontier import TrajectoryPool, build_report, simple_pool
from sarjax.frontier.plots import plot_aoi_vs_budget, plot_curves, plot_ensemble_vs_fixed_eps, plot_rank_bump


def test_plots_are_written(tmp_path):
    rng = np.random.default_rng(0)
    traj = rng.gamma(2.0, 1.0, (4, 3, 20, 1)) * (1 + np.exp(-np.arange(20) / 5.0))
    traj[:, :, 0] = 0.0
    traj[:, :, 1] = np.inf
    pool = TrajectoryPool(traj, simple_pool("abc"), cap=200, models=("m0", "m1", "m2", "m3"))
    rep = build_report(pool, norm="l2", tiers=(100, 300), heldout=0.5)
    t = rep.tiers[-1]
    paths = [
        plot_curves(pool.distances(t.q), rep.models, t.doi, tmp_path / "curves.png", norm="2"),
        plot_aoi_vs_budget(
            [x.budget for x in rep.tiers],
            [x.train_aoi for x in rep.tiers],
            [x.heldout_aoi for x in rep.tiers],
            tmp_path / "aoi.png",
        ),
        plot_ensemble_vs_fixed_eps(
            rep.models,
            [x.budget for x in rep.tiers],
            [x.model_aoi for x in rep.tiers],
            tmp_path / "vs.png",
            fixed_eps_aoi=[0.9, np.nan, 0.95, 0.99],
        ),
        plot_rank_bump(rep.rank.eps, rep.rank.ranks, rep.models, tmp_path / "bump.png", highlight=2, eps_ref=1.0),
    ]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
