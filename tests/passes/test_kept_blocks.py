"""Full checkpointing's plan with its last blocks' values kept
(`passes.kept_blocks`): the order values are kept in, and a search that
stops at what fits and passes over a value too large for the room."""

from __future__ import annotations

from adacc_compile.passes.kept_blocks import blocks_in_forward_order, keep_order, most_kept
from adacc_compile.passes.plan_problem import Candidate, Decision, PlanProblem, saved_bytes
from adacc_compile.passes.policies import full_ac_policy, keep_all_policy


def _problem(big_in_last: bool = False) -> PlanProblem:
    """Three blocks of a chain: each block's first value is read by its
    backward, its output by the next block; ``big_in_last`` makes the last
    block's most valuable value 100x larger."""

    def cand(name, block, inputs=(), keep_bytes=8, seconds=1.0):
        return Candidate(name=name, keep_bytes=keep_bytes, recompute_seconds=seconds, inputs=inputs,
                         required=True, block=block)

    candidates = [cand("embedded", "")]
    previous = "embedded"
    for n in range(3):
        block = f"layers.{n}"
        big = big_in_last and n == 2
        candidates += [
            cand(f"h{n}", block, (previous,), keep_bytes=800 if big else 8, seconds=4.0),
            cand(f"g{n}", block, (f"h{n}",), seconds=2.0),
            cand(f"out{n}", block, (f"g{n}",)),
        ]
        previous = f"out{n}"
    candidates.append(cand("logits", "", (previous,)))
    return PlanProblem(candidates=tuple(candidates))


def test_blocks_are_ordered_as_the_forward_runs_them():
    assert blocks_in_forward_order(_problem()) == ["layers.0", "layers.1", "layers.2"]


def test_the_last_blocks_values_come_first_most_time_per_byte_first():
    problem = _problem()
    base, keep_all = full_ac_policy(problem, None), keep_all_policy(problem, None)
    order = keep_order(problem, base, keep_all)
    assert order[:2] == ["h2", "g2"]  # out2 is kept by full AC already (the head reads it)
    assert order[2:] == ["h0", "h1", "g0", "g1"]


def test_as_much_is_kept_as_fits():
    problem = _problem()
    base, keep_all = full_ac_policy(problem, None), keep_all_policy(problem, None)
    room = saved_bytes(problem, base) + 24
    plan, count = most_kept(problem, base, keep_all, lambda p: saved_bytes(problem, p) <= room)
    assert count == 3 and saved_bytes(problem, plan) == room
    assert [plan.decision(n) for n in ("h2", "g2", "h0", "h1")] == [Decision.KEEP] * 3 + [Decision.RECOMPUTE]


def test_a_value_too_large_for_the_room_is_passed_over():
    problem = _problem(big_in_last=True)
    base, keep_all = full_ac_policy(problem, None), keep_all_policy(problem, None)
    room = saved_bytes(problem, base) + 16
    plan, count = most_kept(problem, base, keep_all, lambda p: saved_bytes(problem, p) <= room)
    assert plan.decision("h2") == Decision.RECOMPUTE
    assert count == 2 and saved_bytes(problem, plan) == room


def test_nothing_fits_gives_the_base_plan():
    problem = _problem()
    base, keep_all = full_ac_policy(problem, None), keep_all_policy(problem, None)
    plan, count = most_kept(problem, base, keep_all, lambda p: False)
    assert count == 0 and plan is base
