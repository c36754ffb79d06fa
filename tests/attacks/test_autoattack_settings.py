"""AutoAttack's pipelines take an attack (``AutoAttackConfig``) and one ``AutoAttackSettings``
(issue 42 item 3): both validated when built, no public function over 10 parameters, and the
default run and the fingerprints as before the split.

Known answers: the digests and the fingerprint below were computed by the code before the split
(a56fbec: ``autoattack_pool(pool, x, y, norm="linf", eps=0.05, key=PRNGKey(0), log=False, ...)``,
``run_autoattack(pool, x, y, norm="linf", eps=0.05, out=..., checkpoint_dir=..., log=False)``) on
``_aa_tiny``'s pool and first 8 images. The full-budget default runs with
``SARJAX_AUTOATTACK_FULL=1`` (about 10 s).
"""

import dataclasses
import hashlib
import inspect
import json
import os
import warnings

import jax
import numpy as np
import pytest
from _aa_tiny import images, make_pool

import sarjax.attacks.autoattack as aa
import sarjax.experiments.autoattack as runner
from sarjax.attacks.autoattack import (
    AutoAttackConfig,
    AutoAttackSettings,
    autoattack,
    autoattack_config,
    autoattack_pool,
    make_autoattack,
)
from sarjax.runtime.fingerprint import sarjax_version

FULL = os.environ.get("SARJAX_AUTOATTACK_FULL") == "1"
QUICK_DIGEST = "960f43646697dfb7e7da6951b61d131d0c27a1eb318ce1c3c0b556a7f287852c"  # apgd-ce, apgd-t; n_iter 3
DEFAULT_DIGEST = "e975142946670abf5135a5330f679966fadfde62090548531aea97b0fee6ffcb"  # every default
OLD_FINGERPRINT = {
    "pool": "6ab7410cb39cb62a88dd9b6a1cd6de000364d41367da659b28ea31abf506a3ad",
    "conv_impl": None,
    "images": "37e2bc6b7cefb29bca7d53ae6a84aa859fca3663535f6d05c9de01e505d6d5f1",
    "ids": "62b342bf01cd6f56f4a274367b97842f3feca305c5f022b7d71cf2be4a48eebc",
    "norm": "linf",
    "eps": 0.05,
    "version": "standard",
    "stages": ["apgd-ce", "apgd-t", "fab-t", "square"],
    "n_iter": 100,
    "fab_iter": 100,
    "square_queries": 5000,
    "batch_size": None,
    "seed": 0,
    "per_member": False,
    "checks": True,
    "wrap": False,
    "stochastic": None,
    "randomized": {},
}


def _digest(res) -> str:
    h = hashlib.sha256()
    for a in (res.robust, res.clean, res.queries, res.stage_queries, res.stage_robust, res.x_adv):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, err, match",
    [
        (dict(version="fast"), ValueError, "version must be one of"),
        (dict(norm="l0"), ValueError, "norm linf, l2 or l1"),
        (dict(eps=0.0), ValueError, "eps must be a finite float > 0"),
        (dict(eps=float("inf")), ValueError, "eps must be a finite float > 0"),
        (dict(eps=True), ValueError, "eps must be"),
        (dict(n_iter=0), ValueError, "n_iter must be an int >= 1"),
        (dict(n_iter=2.0), ValueError, "n_iter must be an int >= 1"),
        (dict(square_queries=True), ValueError, "square_queries must be an int >= 1"),
        (dict(fab_iter=2), ValueError, "fab_iter must be >= 3 when FAB runs"),
        (dict(attacks=["pgd"]), ValueError, "attacks must be a non-empty list"),
        (dict(attacks=[]), ValueError, "attacks must be a non-empty list"),
        (dict(attacks="apgd-ce"), ValueError, "attacks must be a non-empty list"),
        (dict(square_rescale_schedule=1), TypeError, "square_rescale_schedule must be a bool"),
        (dict(box=(1.0, 0.0)), ValueError, "lo < hi"),
        (dict(box=(0.0,)), ValueError, "box must be two finite floats"),
    ],
)
def test_config_is_checked_when_built(kw, err, match):
    with pytest.raises(err, match=match):
        autoattack_config(**{"norm": "linf", "eps": 0.1, **kw})


def test_config_defaults_are_autoattacks_and_frozen():
    c = autoattack_config("linf", 1)
    assert c == AutoAttackConfig("linf", 1.0, "standard", None, 100, 100, 5000, False, (0.0, 1.0))
    assert isinstance(c.eps, float) and c.stages == ("apgd-ce", "apgd-t", "fab-t", "square")
    assert autoattack_config("l2", 0.5, "plus").stages == aa.stages_of("plus", "l2")
    assert autoattack_config("l1", 5, "rand").stages == ("apgd-ce", "apgd-dlr")
    # FAB's minimum: only when FAB runs
    assert autoattack_config("linf", 0.1, attacks=["apgd-ce"], fab_iter=1).fab_iter == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.n_iter = 3  # pyright: ignore[reportAttributeAccessIssue]


@pytest.mark.parametrize(
    "kw, err, match",
    [
        (dict(batch_size=0), ValueError, "batch_size must be an int >= 1"),
        (dict(batch_size=True), ValueError, "batch_size must be an int >= 1"),
        (dict(batch_size=8.0), ValueError, "batch_size must be an int >= 1"),
        (dict(checks=1), TypeError, "AutoAttackSettings.checks must be a bool"),
        (dict(log="no"), TypeError, "AutoAttackSettings.log must be a bool"),
        (dict(distribute=1), TypeError, "AutoAttackSettings.distribute must be a bool"),
        (dict(per_member=None), TypeError, "AutoAttackSettings.per_member must be a bool"),
        (dict(overwrite=0), TypeError, "AutoAttackSettings.overwrite must be a bool"),
        (dict(progress=3), TypeError, "progress must be a callable"),
        (dict(checkpoint_dir=3), TypeError, "checkpoint_dir must be None, a str or a path"),
        (dict(out=["a.json"]), TypeError, "out must be None, a str or a path"),
    ],
)
def test_settings_are_checked_when_built(kw, err, match):
    with pytest.raises(err, match=match):
        AutoAttackSettings(**kw)  # pyright: ignore[reportArgumentType]


def test_pipelines_refuse_what_is_not_theirs(tmp_path):
    pool, (x, y) = make_pool(stacks=1), images(4)
    cfg, key = autoattack_config("linf", 0.05), jax.random.PRNGKey(0)
    st = pool.stacks[0]
    with pytest.raises(TypeError, match="attack must be an AutoAttackConfig"):
        autoattack_pool(pool, x, y, attack={"norm": "linf"}, key=key)  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match="settings must be an AutoAttackSettings"):
        autoattack(st.member_apply, st.params, x, y, attack=cfg, key=key, settings={"log": False}, stacked=True)  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="settings.out is written by run_autoattack only"):
        autoattack_pool(pool, x, y, attack=cfg, key=key, settings=AutoAttackSettings(out=tmp_path / "a.json"))
    with pytest.raises(TypeError, match="attack must be an AutoAttackConfig"):
        runner.run_autoattack(pool, x, y, attack="linf")  # pyright: ignore[reportArgumentType]
    # the runner's fingerprint records neither the box nor Square's schedule: refused, not ignored
    for bad in (dict(box=(0.0, 2.0)), dict(square_rescale_schedule=True)):
        with pytest.raises(ValueError, match="attack.box must be"):
            runner.run_autoattack(pool, x, y, attack=autoattack_config("linf", 0.05, **bad))  # pyright: ignore[reportArgumentType]
    # make_autoattack checks its hyperparameters when the entry is built
    with pytest.raises(ValueError, match="fab_iter must be >= 3"):
        make_autoattack(pool, norm="linf", eps=0.1, fab_iter=2)


def test_no_public_function_takes_more_than_ten_parameters():
    import sarjax.cli.autoattack as cli

    fns = [getattr(aa, n) for n in aa.__all__] + [getattr(runner, n) for n in runner.__all__]
    fns += [getattr(cli, n) for n in dir(cli) if not n.startswith("_") and inspect.isfunction(getattr(cli, n))]
    over = {}
    for f in fns:
        if inspect.isfunction(f):
            n = len(inspect.signature(f).parameters)
            if n > 10:
                over[f.__qualname__] = n
    assert over == {}
    for f in (autoattack, autoattack_pool, runner.run_autoattack, make_autoattack, autoattack_config):
        params = inspect.signature(f).parameters.values()
        assert not any(p.kind is p.VAR_KEYWORD for p in params), f.__name__  # no **kwargs back door
    assert len(inspect.signature(aa.AutoAttack.__call__).parameters) <= 10


# -- the same runs as before ----------------------------------------------------------------------


def test_pool_run_equals_the_old_code_bit_for_bit():
    """The two-stage quick run, as the code before the split computed it (QUICK_DIGEST), through the
    function, the entry and the runner."""
    pool, (x, y) = make_pool(stacks=2), images(8)
    cfg = autoattack_config("linf", 0.05, attacks=["apgd-ce", "apgd-t"], n_iter=3)
    quiet = AutoAttackSettings(log=False, checks=False)
    res = autoattack_pool(pool, x, y, attack=cfg, key=jax.random.PRNGKey(0), settings=quiet)
    assert _digest(res) == QUICK_DIGEST
    entry = make_autoattack(pool, norm="linf", eps=0.05, attacks=["apgd-ce", "apgd-t"], n_iter=3, settings=quiet)
    assert _digest(entry(pool.params, x, y, key=jax.random.PRNGKey(0))) == QUICK_DIGEST
    assert _digest(runner.run_autoattack(pool, x, y, attack=cfg, settings=quiet)) == QUICK_DIGEST  # seed 0


@pytest.mark.skipif(not FULL, reason="set SARJAX_AUTOATTACK_FULL=1 (full AutoAttack budgets, about 10 s)")
def test_default_run_equals_the_old_default_bit_for_bit():
    pool, (x, y) = make_pool(stacks=2), images(8)
    explicit = AutoAttackConfig("linf", 0.05, "standard", ("apgd-ce", "apgd-t", "fab-t", "square"), 100, 100, 5000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        default = autoattack_pool(
            pool, x, y, attack=autoattack_config("linf", 0.05), key=jax.random.PRNGKey(0),
            settings=AutoAttackSettings(log=False),
        )  # fmt: skip
        built = autoattack_pool(
            pool, x, y, attack=explicit, key=jax.random.PRNGKey(0), settings=AutoAttackSettings(log=False)
        )
    assert _digest(default) == _digest(built) == DEFAULT_DIGEST


def test_default_fingerprints_are_unchanged(tmp_path, monkeypatch):
    """run_autoattack's report and checkpoint fingerprints of the default run: the fields and values
    the code before the split wrote, so its outputs and checkpoints are still recognised."""

    def stand_in(pool, x, y, *, attack, **kw):
        b, m = len(x), pool.num_members
        z = np.ones((b, m), bool)
        return aa.AutoAttackResult(
            np.repeat(np.asarray(x)[:, None], m, axis=1), z, z, np.ones((b, m), np.int64), np.ones((1, b, m), np.int64),
            z[None], (), attack.version, attack.norm, attack.eps, tuple(pool.names), (),
        )  # fmt: skip

    monkeypatch.setattr(aa, "autoattack_pool", stand_in)
    pool, (x, y) = make_pool(stacks=2), images(8)
    out, ck = tmp_path / "a.json", tmp_path / "ck"
    settings = AutoAttackSettings(out=out, checkpoint_dir=ck, log=False)
    runner.run_autoattack(pool, x, y, attack=autoattack_config("linf", 0.05), settings=settings)
    report = json.loads(out.read_text())
    want = {**OLD_FINGERPRINT, "sarjax": sarjax_version()}
    assert report["fingerprint"] == want and set(want) == runner._FINGERPRINT_FIELDS
    assert report["budget"] == {"n_iter": 100, "fab_iter": 100, "square_queries": 5000}
    stored = json.loads((ck / "fingerprint.json").read_text())
    assert stored == {"format": "sarjax-run/1", **want, "processes": 1}
    # the same settings rerun (resume), other settings refused naming them
    runner.run_autoattack(pool, x, y, attack=autoattack_config("linf", 0.05), settings=settings)
    with pytest.raises(ValueError, match="this run has n_iter=99"):
        runner.run_autoattack(pool, x, y, attack=autoattack_config("linf", 0.05, n_iter=99), settings=settings)
    with pytest.raises(ValueError, match="this run has batch_size=8"):
        runner.run_autoattack(
            pool, x, y, attack=autoattack_config("linf", 0.05), settings=dataclasses.replace(settings, batch_size=8)
        )
