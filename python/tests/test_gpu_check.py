"""The GPU check's own statistics (scripts/gpu_check/check.py), which the
report's intervals come from: Student's t against the tables, the block
model against the two-way table by hand, a missing run, and intervals that
stay inside their bounds."""
import importlib.util
import math
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "gpu_check", Path(__file__).resolve().parents[2] / "scripts" / "gpu_check" / "check.py"
)
check = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(check)


@pytest.mark.parametrize("df,want", [(1, 12.706), (2, 4.303), (4, 2.776), (8, 2.306), (29, 2.045)])
def test_t_quantile_matches_the_tables(df, want):
    assert abs(check.t_quantile(0.975, df) - want) < 0.001


def test_block_model_is_the_two_way_table():
    # Three rounds whose machine speed moves 1.0, 1.5, 0.8; b is 2x a, c 1.1x a,
    # with a little noise; every effect difference is the mean of the rounds'
    # log ratios, df = (3 - 1)(3 - 1).
    noise = {(0, "a"): 1.01, (0, "b"): 0.99, (0, "c"): 1.0, (1, "a"): 0.98, (1, "b"): 1.02,
             (1, "c"): 1.01, (2, "a"): 1.0, (2, "b"): 1.0, (2, "c"): 0.99}
    base = {"a": 100.0, "b": 200.0, "c": 110.0}
    speed = [1.0, 1.5, 0.8]
    cells = {(r, n): base[n] * speed[r] * noise[(r, n)] for r in range(3) for n in base}
    model, fit = check.block_model(cells, ["a", "b", "c"], "a")
    assert fit["df"] == 4
    want = math.exp(sum(math.log(cells[(r, "b")] / cells[(r, "a")]) for r in range(3)) / 3)
    assert abs(model["b"]["speedup"] - want) < 1e-9
    assert model["b"]["low"] < want < model["b"]["high"]
    assert model["b"]["low"] > 1.8 and model["b"]["high"] < 2.2
    assert model["c"]["low"] > 1.0, "a 10% difference with 1-2% noise is called"
    assert model["a"] == {"speedup": 1.0, "low": None, "high": None}


def test_block_model_with_a_failed_run_and_without_the_reference():
    cells = {(0, "a"): 100.0, (0, "b"): 150.0, (1, "a"): 90.0, (1, "b"): 140.0, (2, "b"): 160.0}
    model, fit = check.block_model(cells, ["a", "b", "c"], "a")
    assert fit["df"] == 5 - 3 - 1
    assert set(model) == {"a", "b"}, "c never ran"
    assert check.block_model({(0, "b"): 1.0}, ["a", "b"], "a") == ({}, None)


def test_intervals_stay_in_their_bounds():
    iv = check.mean_interval([10.0, 95.0, 99.0], bounds=(0, 100))
    assert 0 <= iv["low"] <= iv["mean"] <= iv["high"] <= 100
    rate = check.mean_interval([100.0, 400.0], log=True)
    assert rate["low"] > 0 and abs(rate["mean"] - 200.0) < 1e-9
    assert check.mean_interval([None]) is None
    assert check.mean_interval([5.0])["low"] is None
