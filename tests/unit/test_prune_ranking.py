"""Successive halving's ranking and its plan-time refusals, in-process."""

import math
import re

import pytest

from cifarflow.controller.prune import check_prune, survivors


def test_the_best_fraction_goes_on_ties_by_name_and_diverged_runs_last():
    scores = {"a": 0.5, "b": 0.7, "c": None, "d": math.nan, "e": 0.7, "f": 0.1}
    assert survivors(scores, "max", keep=0.5, min_runs=1) == ["b", "e", "a"]
    assert survivors(scores, "min", keep=0.33, min_runs=1) == ["f", "a"]  # ceil(6 x 0.33)
    assert survivors(scores, "max", keep=0.1, min_runs=2) == ["b", "e"]  # never fewer
    assert survivors({"a": 1.0}, "max", keep=0.5, min_runs=1) == ["a"]
    assert survivors({"x": None, "y": None}, "max", keep=0.5, min_runs=1) == ["x"]


@pytest.mark.parametrize("prune, message", [
    ({"metric": "test_acc", "keep": 0, "at_segments": [1]}, "keep 0 must be between 0 and 1"),
    ({"metric": "test_acc", "keep": 1, "at_segments": [1]}, "keep 1 must be between 0 and 1"),
    ({"metric": "test_acc", "keep": 0.5, "at_segments": [3]}, "at_segments [3]: a pruning point"),
    ({"metric": "accuracy", "keep": 0.5, "at_segments": [1]}, "metric 'accuracy' unknown"),
])
def test_invalid_prune_settings_are_refused(prune, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        check_prune(prune, segments=3)
