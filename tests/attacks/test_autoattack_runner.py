"""``run_autoattack`` (sarjax.experiments.autoattack): the in-memory runner, its JSON + npz, the
progress callback, and its checks.

One run on the two linear members of ``_aa_tiny`` (APGD-CE then APGD-T, chunks of 8 of 20 images)
is shared (module fixture) with a progress recorder; a second run without the callback must give
the same arrays bit for bit. The adversarial points are checked in float64 against the members'
own weights: every broken pair's point is misclassified and within eps of its image.
"""

import json
import warnings

import numpy as np
import pytest
from _aa_kw import run as run_autoattack
from _aa_kw import split
from _aa_tiny import BUDGET, EPS, images, logits64, make_pool

from sarjax.attacks.autoattack_checks import AutoAttackWarning
from sarjax.experiments.autoattack import load_autoattack

KW = dict(norm="linf", eps=EPS, batch_size=8, attacks=["apgd-ce", "apgd-t"], checks=False, log=False, **BUDGET)
IDS = np.arange(20) * 3 + 7


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("aa") / "aa.json"
    pool = make_pool(stacks=1)
    x, y = images()
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AutoAttackWarning)
        res = run_autoattack(
            pool, x, y, out=out, ids=IDS, progress=lambda *a: seen.append(a), meta={"data": "tiny"}, **KW
        )
        quiet = run_autoattack(pool, x, y, ids=IDS, **KW)
    return pool, x, y, out, res, quiet, seen


def test_progress_only_observes(run):
    _, _, _, _, res, quiet, _ = run
    for f in ("x_adv", "robust", "clean", "queries", "stage_queries", "stage_robust"):
        np.testing.assert_array_equal(getattr(quiet, f), getattr(res, f), err_msg=f)


def test_progress_counts_rows_to_the_stage_total(run):
    _, _, _, _, res, _, seen = run
    stages = [s.name for s in res.log]
    assert [a[0] for a in seen if a[1] == 0] == stages  # each stage starts at 0 ...
    for s in res.log:
        calls = [(d, t) for n, d, t in seen if n == s.name]
        done = [d for d, _ in calls]
        assert done == sorted(done) and len(done) > 2  # ... moves after every chunk ...
        totals = {t for _, t in calls}
        assert len(totals) == 1
        assert done[-1] == totals.pop()  # ... and ends at its total
    # APGD-T: the rows still robust for some member after APGD-CE, times its 4 targets (5 classes)
    n_rows = int(res.stage_robust[1].any(axis=1).sum())
    assert [t for n, _, t in seen if n == "apgd-t"][0] == 4 * n_rows


def test_npz_holds_the_per_image_result_the_json_reports(run):
    pool, x, y, out, res, _, _ = run
    report = json.loads(out.read_text())
    got = load_autoattack(out)
    assert report["npz"] == str(out.with_suffix(".npz").absolute()) and report["data"] == "tiny"
    assert report["samples"] == 20 and report["members"] == list(got.members) == ["lin0", "lin1"]
    assert got.robust.shape == got.clean.shape == (20, 2) and got.x_adv.shape == (20, 2, 4, 4, 1)
    assert got.x_adv.dtype == np.float32 and got.robust.dtype == bool
    np.testing.assert_array_equal(got.robust.mean(axis=0), report["robust_accuracy"])
    np.testing.assert_array_equal(got.clean.mean(axis=0), report["clean_accuracy"])
    assert got.queries.sum() == report["queries_total"]
    assert got.ids.tolist() == IDS.tolist() and got.y.tolist() == y.tolist()
    np.testing.assert_array_equal(got.x_adv, res.x_adv)
    assert load_autoattack(out.with_suffix(".npz")).report == report  # either file names the run


def test_broken_points_are_adversarial_in_float64(run):
    pool, x, y, out, _, _, _ = run
    got = load_autoattack(out)
    broken = got.broken
    assert broken.sum() >= 3 and got.robust.any()  # both outcomes occur
    for m in range(2):
        xa = got.x_adv[:, m].astype(np.float64)
        pred = logits64(pool, xa)[m].argmax(-1)
        dist = np.abs(xa - x.astype(np.float64)).reshape(20, -1).max(axis=1)
        assert np.all(pred[broken[:, m]] != y[broken[:, m]]), m
        assert np.all(dist[broken[:, m]] <= EPS * (1 + 1e-6)), dist[broken[:, m]].max()
        assert np.all(xa.min() >= 0) and np.all(xa.max() <= 1)
        np.testing.assert_array_equal(got.x_adv[~broken[:, m], m], x[~broken[:, m]])  # the clean image
    # the robust pairs stay correctly classified at the clean image
    z = logits64(pool, x).argmax(-1).T
    assert np.all(z[got.robust] == np.broadcast_to(y[:, None], z.shape)[got.robust])


def test_runner_checks_its_inputs_before_attacking(tmp_path):
    pool = make_pool(stacks=1)
    x, y = images(4)
    with pytest.raises(ValueError, match=r"x has images of shape \[4, 4, 2\], the pool takes \[4, 4, 1\]"):
        run_autoattack(pool, np.concatenate([x, x], axis=-1), y, **KW)
    with pytest.raises(ValueError, match=r"x must be in \[0, 1\]"):
        run_autoattack(pool, x * 3, y, **KW)
    with pytest.raises(ValueError, match=r"label y\[1\] = 5 is not a class of the pool \(0 .. 4\)"):
        run_autoattack(pool, x, np.array([0, 5, 1, 2]), **KW)
    with pytest.raises(ValueError, match="ids must be distinct, id 3 repeats"):
        run_autoattack(pool, x, y, ids=[3, 3, 1, 2], **KW)
    with pytest.raises(ValueError, match="OUT.npz beside it"):
        run_autoattack(pool, x, y, out=tmp_path / "aa.npz", **KW)
    with pytest.raises(ValueError, match=r"meta may not replace the report's own fields, got \['eps'\]"):
        run_autoattack(pool, x, y, out=tmp_path / "aa.json", meta={"eps": 1}, **KW)
    assert not list(tmp_path.iterdir())
    with pytest.raises(FileNotFoundError, match="aa.json: no such file"):
        load_autoattack(tmp_path / "aa.json")


def test_progress_must_be_callable():
    from sarjax.attacks.autoattack import AutoAttackSettings, autoattack_config, autoattack_pool

    pool = make_pool(stacks=1)
    x, y = images(4)
    c, s, _ = split(KW)
    with pytest.raises(TypeError, match="progress must be a callable"):
        AutoAttackSettings(**s, progress=3)  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match="distribute must be a bool"):
        AutoAttackSettings(**s, distribute=1)  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match="settings must be an AutoAttackSettings"):
        autoattack_pool(pool, x, y, attack=autoattack_config(**c), key=np.zeros(2, np.uint32), settings=s)  # pyright: ignore[reportArgumentType]
