"""``sarjax sar``'s engine takes settings, not argument lists (issue 42, item 3): the two settings
dataclasses refuse bad values when built, the entry points refuse another type, and no public
function of the SAR and demo experiments takes more than ten parameters (``evaluate_pool`` took 14,
``run_sar_on_saved_pool`` 15)."""

import inspect
from pathlib import Path

import numpy as np
import pytest

from sarjax.experiments import demo, sar
from sarjax.experiments.sar import PoolSARSettings, SavedPoolSARSettings


@pytest.mark.parametrize("module", [sar, demo])
def test_no_public_function_takes_more_than_ten_parameters(module):
    wide = {
        name: len(inspect.signature(fn).parameters)
        for name, fn in vars(module).items()
        if inspect.isfunction(fn) and fn.__module__ == module.__name__ and not name.startswith("_")
    }
    assert wide and {k: v for k, v in wide.items() if v > 10} == {}


def test_pool_sar_settings_defaults_are_table_1():
    s = PoolSARSettings()
    assert (s.steps, s.restarts, s.progress, s.checkpoint_dir, s.overwrite) == (40, 3, True, None, False)
    assert PoolSARSettings(checkpoint_dir=Path("c")).checkpoint_dir == Path("c")


@pytest.mark.parametrize(
    "kw, err, msg",
    [
        ({"steps": 0}, ValueError, r"PoolSARSettings.steps must be an int >= 1, got 0"),
        ({"steps": 2.0}, ValueError, r"PoolSARSettings.steps must be an int >= 1, got 2.0"),
        ({"steps": True}, ValueError, r"PoolSARSettings.steps must be an int >= 1, got True"),
        ({"restarts": -1}, ValueError, r"PoolSARSettings.restarts must be an int >= 1, got -1"),
        ({"progress": "no"}, TypeError, r"PoolSARSettings.progress must be a bool, got str 'no'"),
        ({"overwrite": 1}, TypeError, r"PoolSARSettings.overwrite must be a bool, got int 1"),
        ({"checkpoint_dir": 3}, TypeError, r"PoolSARSettings.checkpoint_dir must be None, a str or a path, got int"),
    ],
)
def test_pool_sar_settings_refuse_bad_values(kw, err, msg):
    with pytest.raises(err, match=msg):
        PoolSARSettings(**kw)


def test_saved_pool_sar_settings_defaults_and_devices():
    s = SavedPoolSARSettings()
    assert (s.steps, s.restarts, s.seed, s.progress, s.conv_impl, s.overwrite, s.devices) == (
        40,
        3,
        0,
        True,
        None,
        False,
        None,
    )
    assert SavedPoolSARSettings(devices=[2, np.int64(4)]).devices == (2, 4)  # a list from JSON, numpy ints
    assert SavedPoolSARSettings(conv_impl="fused", seed=np.int32(7)).conv_impl == "fused"


@pytest.mark.parametrize(
    "kw, err, msg",
    [
        ({"steps": 0}, ValueError, r"SavedPoolSARSettings.steps must be an int >= 1, got 0"),
        ({"restarts": 1.5}, ValueError, r"SavedPoolSARSettings.restarts must be an int >= 1, got 1.5"),
        ({"seed": 1.0}, ValueError, r"SavedPoolSARSettings.seed must be an int, got 1.0"),
        ({"seed": None}, ValueError, r"SavedPoolSARSettings.seed must be an int, got None"),
        ({"progress": None}, TypeError, r"SavedPoolSARSettings.progress must be a bool, got NoneType None"),
        (
            {"conv_impl": "cudnn"},
            ValueError,
            r"conv_impl must be None or one of \('im2col', 'xla', 'fused'\), got 'cudnn'",
        ),
        ({"devices": (0, 1)}, ValueError, r"devices must be None or \(P, D\), two ints >= 1, got \(0, 1\)"),
        ({"devices": (2,)}, ValueError, r"devices must be None or \(P, D\), two ints >= 1, got \(2,\)"),
        ({"devices": "pool=2"}, ValueError, r"devices must be None or \(P, D\), two ints >= 1, got 'pool=2'"),
        ({"devices": (2.0, 1)}, ValueError, r"devices must be None or \(P, D\), two ints >= 1, got \(2.0, 1\)"),
    ],
)
def test_saved_pool_sar_settings_refuse_bad_values(kw, err, msg):
    with pytest.raises(err, match=msg):
        SavedPoolSARSettings(**kw)


def test_the_entry_points_refuse_settings_of_another_type(tmp_path):
    x = np.zeros((2, 28, 28, 1), np.float32)
    with pytest.raises(TypeError, match="settings must be None or a PoolSARSettings, got dict"):
        sar.evaluate_pool(None, x, 0.1, [0.0], key=None, settings={"steps": 2})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="settings must be None or a SavedPoolSARSettings, got PoolSARSettings"):
        sar.run_sar_on_saved_pool(str(tmp_path), 0.1, 0.0, out=str(tmp_path / "o"), settings=PoolSARSettings())  # type: ignore[arg-type]
    assert not (tmp_path / "o").exists()  # refused before anything was written
