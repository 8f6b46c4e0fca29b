"""Pipeline schedules, the step-time simulator and the recompute-aware
stage partitioner, on small problems with exact answers."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from adacc_compile.pipelining import (
    CostOptions, InfeasiblePartitionError, LayerCost, PlanLevel, StageTimes, even_split, in_flight, in_flight_1f1b, layer_cost,
    partition, plan_split, rank_actions, simulate,
)
from adacc_compile.pipelining.partition import stage_counts


def test_in_flight_1f1b_is_stages_minus_position():
    assert [in_flight("1f1b", s, 4, 8) for s in range(4)] == [[4], [3], [2], [1]]
    assert [in_flight_1f1b(s, 4) for s in range(4)] == [4, 3, 2, 1]
    assert stage_counts("1f1b", 4, 2) == [2, 2, 2, 1]  # fewer micro-batches than stages


def test_interleaved_actions_cover_every_chunk_and_microbatch():
    for rank in range(4):
        actions = rank_actions("interleaved_1f1b", rank, 4, 8, 2)
        for kind in "FB":
            done = sorted((a.chunk, a.microbatch) for a in actions if a.kind == kind)
            assert done == [(c, m) for c in range(2) for m in range(8)]
        seen = set()
        for a in actions:  # a backward never precedes its forward
            if a.kind == "F":
                seen.add((a.chunk, a.microbatch))
            else:
                assert (a.chunk, a.microbatch) in seen
    # Megatron's warm-up: 2(p - r - 1) + (v - 1) p chunk forwards before the first backward.
    first_backward = [next(i for i, a in enumerate(rank_actions("interleaved_1f1b", r, 4, 8, 2)) if a.kind == "B")
                      for r in range(4)]
    assert first_backward == [2 * (4 - r - 1) + 4 + 1 for r in range(4)]


def test_simulated_1f1b_two_ranks_by_hand():
    """F=1, B=2, R=1, free transfers, 2 micro-batches.

    on demand   rank 0: F0 0-1, F1 1-2, B0 5-8, B1 9-12
                rank 1: F0 1-2, B0 2-5, F1 5-6, B1 6-9      -> 12
    ahead       rank 0: F0, F1, R0 2-3, B0 5-7, R1 7-8, B1 9-11
                rank 1: F0 1-2, R0 2-3, B0 3-5, F1 5-6, R1 6-7, B1 7-9  -> 11
    """
    stages = [StageTimes(forward=1, backward=2, recompute=1)] * 2
    assert simulate(stages, schedule="1f1b", n_ranks=2, n_microbatches=2).step_seconds == 12
    ahead = simulate(stages, schedule="1f1b", n_ranks=2, n_microbatches=2, recompute="ahead")
    assert ahead.step_seconds == 11
    assert ahead.busy_seconds == [8, 8]  # the same work, less waiting


def test_simulated_interleaved_runs_and_beats_1f1b_bubble():
    plain = simulate([StageTimes(forward=2, backward=4)] * 4, schedule="1f1b", n_ranks=4, n_microbatches=8)
    chunks = simulate([StageTimes(forward=1, backward=2)] * 8, schedule="interleaved_1f1b", n_ranks=4,
                      n_microbatches=8)
    assert chunks.busy_seconds == plain.busy_seconds
    assert chunks.step_seconds < plain.step_seconds  # smaller warm-up/cool-down bubble


def _level(name, saved, rec, working=0):
    return PlanLevel(name=name, saved_bytes=saved, recompute_seconds=rec, working_bytes=working)


def _random_layers(rng: random.Random, n: int) -> list[LayerCost]:
    layers = []
    for i in range(n):
        keep = rng.randint(50, 120)
        levels = (_level("keep", keep, 0.0), _level("mid", keep // 3, rng.uniform(0.1, 0.5), rng.randint(0, 30)),
                  _level("rec", keep // 8, rng.uniform(0.5, 0.9), rng.randint(20, 60)))
        layers.append(LayerCost(name=f"l{i}", forward_seconds=rng.uniform(0.5, 1.5),
                                backward_seconds=rng.uniform(1, 3), levels=levels, static_bytes=rng.randint(0, 20)))
    return layers


def _brute_force(layers, n_stages, budget, counts, objective="bottleneck", n_microbatches=8, ahead=False) -> float:
    """Every split, every level of every layer: the least slowest stage
    (or 1F1B step estimate) that fits."""
    best = float("inf")
    n = len(layers)
    for points in itertools.combinations(range(1, n), n_stages - 1):
        bounds = [0, *points, n]
        worst, fill = 0.0, 0.0
        for s in range(n_stages):
            chunk = layers[bounds[s]:bounds[s + 1]]
            cheapest = float("inf")
            for picks in itertools.product(*[range(len(layer.levels)) for layer in chunk]):
                levels = [layer.levels[k] for layer, k in zip(chunk, picks)]
                memory = (sum(layer.static_bytes for layer in chunk) + counts[s] * sum(lv.saved_bytes for lv in levels)
                          + max(lv.working_bytes for lv in levels))
                if memory <= budget:
                    cheapest = min(cheapest, sum(lv.recompute_seconds for lv in levels))
            compute = sum(layer.forward_seconds + layer.backward_seconds for layer in chunk)
            worst = max(worst, compute + cheapest)
            fill += compute + (0.0 if ahead and s < n_stages - 1 else cheapest)
        best = min(best, worst if objective == "bottleneck" else (n_microbatches - 1) * worst + fill)
    return best


def _step_estimate(found, n_microbatches, ahead):
    fill = sum(st.forward_seconds + st.backward_seconds + (0.0 if ahead and k < len(found.stages) - 1
               else st.recompute_seconds) for k, st in enumerate(found.stages))
    return (n_microbatches - 1) * found.bottleneck_seconds + fill


@pytest.mark.parametrize("seed", range(4))
def test_partition_matches_brute_force(seed):
    rng = random.Random(seed)
    layers = _random_layers(rng, 7)
    budget = rng.randint(450, 700)
    counts = stage_counts("1f1b", 3, 8)
    expected = _brute_force(layers, 3, budget, counts)
    if expected == float("inf"):
        with pytest.raises(InfeasiblePartitionError):
            partition(layers, 3, budget)
        return
    found = partition(layers, 3, budget, objective="bottleneck")
    assert found.bottleneck_seconds == pytest.approx(expected, rel=1e-12)
    assert found.feasible
    assert [s.in_flight for s in found.stages] == counts
    for ahead in (False, True):
        step = _brute_force(layers, 3, budget, counts, "step", n_microbatches=3, ahead=ahead)
        found = partition(layers, 3, budget, n_microbatches=3, recompute="ahead" if ahead else "on_demand")
        assert _step_estimate(found, 3, ahead) == pytest.approx(step, rel=1e-12)


def test_partition_unloads_the_first_stage():
    """Identical layers, equal budgets: the even split makes stage 0 (four
    micro-batches in flight) recompute most; the searched split gives it
    fewer layers and is faster."""
    levels = (_level("keep", 100, 0.0), _level("mid", 30, 0.3, 50), _level("rec", 10, 0.4, 90))
    layers = [LayerCost(name=f"l{i}", forward_seconds=1, backward_seconds=2, levels=levels, static_bytes=10)
              for i in range(48)]
    even = plan_split(layers, even_split(layers, 4), 1500, n_microbatches=16, method="even")
    found = partition(layers, 4, 1500, n_microbatches=16)
    assert even.feasible and found.feasible
    assert found.bottleneck_seconds < even.bottleneck_seconds
    assert found.split_points[0] < even.split_points[0]
    assert found.search_seconds < 5


def test_partition_infeasible_budget_is_an_error():
    levels = (_level("keep", 100, 0.0),)
    layers = [LayerCost(name=f"l{i}", forward_seconds=1, backward_seconds=1, levels=levels) for i in range(4)]
    with pytest.raises(InfeasiblePartitionError, match="fits budgets"):
        partition(layers, 2, 150)


def test_layer_cost_of_a_gpt_block_from_adacc_plans():
    from adacc_examples.models import GPTBlock, GPTConfig

    cfg = GPTConfig(d_model=32, n_head=4, seq_len=16)
    cost = layer_cost("block", lambda: GPTBlock(cfg), lambda: (torch.zeros(2, 16, 32, requires_grad=True),),
                      dtype=torch.float32, options=CostOptions(ratios=()))
    assert cost.forward_seconds > 0 and cost.backward_seconds > 0
    assert cost.boundary_bytes == 2 * 16 * 32 * 4
    assert cost.static_bytes == 16 * sum(p.numel() for p in GPTBlock(cfg).parameters())
    saved = [lv.saved_bytes for lv in cost.levels]
    recompute = [lv.recompute_seconds for lv in cost.levels]
    assert saved == sorted(saved, reverse=True) and recompute == sorted(recompute)
    assert len(cost.levels) >= 2 and cost.levels[0].name == "keep all" and recompute[0] == 0
    assert cost.levels[-1].saved_bytes < cost.levels[0].saved_bytes / 4


def test_best_by_simulation_never_loses_to_even_or_balanced():
    from adacc_compile.passes.comm_model import link_by_name
    from adacc_compile.pipelining import balanced_split, predict_step
    from adacc_compile.pipelining.predict import best_by_simulation

    rng = random.Random(7)
    layers = _random_layers(rng, 12)
    link = link_by_name("nvlink")
    for mode in ("on_demand", "ahead"):
        best = best_by_simulation(layers, 4, 900, link, n_microbatches=8, recompute=mode)
        step = predict_step(best, link, n_microbatches=8, recompute=mode)[0].step_seconds
        for points in (even_split(layers, 4), balanced_split(layers, 4)):
            other = plan_split(layers, points, 900, n_microbatches=8)
            if other.feasible:
                assert step <= predict_step(other, link, n_microbatches=8, recompute=mode)[0].step_seconds
