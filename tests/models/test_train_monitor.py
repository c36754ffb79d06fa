"""train_stack's validation split, progress bar and callback in one TrainMonitor (issue 42 item 3):
checked when built."""

from __future__ import annotations

import numpy as np
import pytest

from sarjax.models import zoo
from sarjax.models.train import MemberConfig, TrainMonitor, train_stack


@pytest.mark.parametrize(
    "field, value, shown",
    [
        ("validation", np.zeros((4, 2)), "ndarray"),
        ("validation", (np.zeros((4, 2)),), "of length 1"),
        ("validation", (np.zeros((4, 2)), None), "tuple"),
        ("progress", 1, "1"),
        ("label", 3, "3"),
        ("callback", "print", "'print'"),
    ],
)
def test_bad_monitor_raises_naming_field_and_value(field, value, shown):
    with pytest.raises(ValueError, match=rf"TrainMonitor\.{field} must be .*got .*{shown}"):
        TrainMonitor(**{field: value})


def test_train_stack_refuses_another_monitor_type():
    with pytest.raises(TypeError, match="monitor must be a TrainMonitor, got dict"):
        train_stack(
            zoo.mlp((4,)), [MemberConfig()], np.zeros((8, 28, 28, 1)), np.zeros(8, int), monitor={"progress": False}
        )  # type: ignore[arg-type]


def test_good_monitor_builds():
    seen = []
    m = TrainMonitor(validation=(np.zeros((2, 3)), np.zeros(2, int)), progress=False, label="x", callback=seen.append)
    assert m.progress is False and m.label == "x" and len(m.validation) == 2
    assert TrainMonitor().validation is None and TrainMonitor().progress is True
