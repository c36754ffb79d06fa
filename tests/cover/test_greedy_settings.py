"""greedy_sar's run options in one GreedySettings (issue 42 item 3): checked when built."""

from __future__ import annotations

import numpy as np
import pytest

from sarjax.cover import GreedySettings, SetSystemOracle, greedy_sar


@pytest.mark.parametrize(
    "field, value",
    [
        ("count_clean_input", 1),
        ("stop_when_unreachable", "no"),
        ("store_inputs", None),
        ("resume", 0),
        ("progress", "yes"),
        ("checkpoint_dir", 3),
    ],
)
def test_bad_settings_raise_naming_field_and_value(field, value):
    with pytest.raises(ValueError, match=rf"GreedySettings\.{field} must be .*got .*{value!r}"):
        GreedySettings(**{field: value})


def test_settings_not_a_greedy_settings():
    o = SetSystemOracle(np.ones((1, 1, 2), bool))
    with pytest.raises(TypeError, match="settings must be a GreedySettings, got dict"):
        greedy_sar(o.joint, o.single, np.zeros((1, 2), bool), [0.0], settings={"progress": True})  # type: ignore[arg-type]


def test_none_is_the_default_settings_and_options_take_effect(tmp_path):
    # known answer: 1 sample, 3 members; the only input breaks {0, 1}; member 2 is unbreakable
    sets = np.zeros((1, 1, 3), bool)
    sets[0, 0, :2] = True
    clean = np.zeros((1, 3), bool)
    run = lambda s: greedy_sar(*(lambda o: (o.joint, o.single))(SetSystemOracle(sets)), clean, [0.0], settings=s)
    a, b = run(None), run(GreedySettings())
    assert a.k_hat.tolist() == b.k_hat.tolist() == [[-1]] and a.sar.tolist() == [[1.0]]
    assert a.inputs is not None and run(GreedySettings(store_inputs=False)).inputs is None
    run(GreedySettings(checkpoint_dir=tmp_path))
    assert (tmp_path / "greedy_state.npz").exists()
