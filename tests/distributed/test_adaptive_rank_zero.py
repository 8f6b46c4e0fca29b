"""Adaptive re-planning on 2 gloo ranks that train on different batches:
rank 0 calibrates for both and its drift verdict is both ranks', so they
re-plan at the same step and every plan version is the same on both."""

from __future__ import annotations

import pytest

from adacc_dist_utils import adaptive_rank_zero_worker, spawn

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_ranks_replan_together_on_rank_zero_statistics(tmp_path):
    results = spawn(adaptive_rank_zero_worker, 2, str(tmp_path), 10, 24, timeout_s=400)
    for result in results:
        assert "error" not in result, result["error"]
    zero, one = results
    # Calibration ran (before, distributed runs used the declared bounds only).
    assert all(zero["calibrated"]) and all(one["calibrated"])
    # One re-plan after the shift, at the same step on both ranks, one recompile each.
    assert zero["versions"] == one["versions"] and len(zero["versions"]) == 2, (zero["versions"], one["versions"])
    assert zero["versions"][1][2] == "drift"
    assert zero["compiles"] == one["compiles"] == 2
    # The same plans, made from rank 0's measurements.
    assert zero["hashes"] == one["hashes"]
    assert zero["calibration"] == one["calibration"]
    assert any(value is not None for value in zero["calibration"][1].values())
