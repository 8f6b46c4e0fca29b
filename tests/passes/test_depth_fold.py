"""Depth folding on the plain problem: a block standing for copies of
itself counts them in the saved bytes, the plan's time, the simulated peak
and the memory model (which stays an upper bound), and the reduced problem
the MILP solves carries them in its representatives."""

from __future__ import annotations

import dataclasses
import random

import pytest

from adacc_compile.passes import peak_model
from adacc_compile.passes.milp import SolverOptions, solve_milp
from adacc_compile.passes.plan_problem import (
    BlockRepeat, Candidate, Decision, Lifetime, PlanProblem, StepLayout,
    added_seconds, repeated_held_bytes, saved_bytes,
)
from adacc_compile.passes.structure import reduce_identical_blocks

from .test_peak_model import legal_plans, modelled

BLOCKS = ("b.0", "b.1", "b.2")


def blocked_problem(rng: random.Random, per_block: int, copies: int, *, unfolded: bool = False) -> PlanProblem:
    """Three identical blocks of ``per_block`` chained values each (every
    value read once by its block's backward, which runs in reverse), the
    middle one repeated ``copies`` times; ``unfolded``: the same step with
    the copies as blocks of their own."""
    blocks = tuple(f"b.{i}" for i in range(3 + copies)) if unfolded else BLOCKS
    n = per_block * len(blocks)
    sizes = [rng.randint(10, 100) for _ in range(per_block)]
    seconds = [rng.uniform(0.1, 5) * 1e-6 for _ in range(per_block)]
    cands = []
    for i in range(n):
        block, k = divmod(i, per_block)
        back = n - 1 - i  # backward position: the last block first
        inputs = (f"v{i - 1}",) if k else ()
        cands.append(Candidate(
            name=f"v{i}", keep_bytes=sizes[k], recompute_seconds=seconds[k], inputs=inputs, required=True,
            can_recompute=k > 0, block=blocks[block],
            lifetime=Lifetime(produced=i, forward_last_use=i + 1 if i + 1 < n else i, forward_always=True,
                              forward_bytes=sizes[k], backward_bytes=sizes[k], reads=(back,)),
        ))
    layout = StepLayout(
        forward_positions=n, backward_positions=n, forward_base=(0,) * n,
        forward_layers=tuple(blocks[i // per_block] for i in range(n)),
        backward_layers=tuple(blocks[(n - 1 - p) // per_block] for p in range(n)),
    )
    repeat = None if unfolded else BlockRepeat(block="b.1", copies=copies)
    problem = PlanProblem(candidates=tuple(cands), layout=layout, repeat=repeat)
    return dataclasses.replace(problem, memory=peak_model.build_memory_model(problem))


@pytest.mark.parametrize("seed", range(12))
def test_copies_count_in_bytes_time_and_peak_and_the_model_bounds_them(seed):
    rng = random.Random(seed)
    copies = rng.randint(1, 5)
    problem = blocked_problem(rng, rng.randint(2, 3), copies)
    alone = dataclasses.replace(problem, repeat=None)
    alone = dataclasses.replace(alone, memory=peak_model.build_memory_model(alone))
    for plan in legal_plans(problem):
        held = repeated_held_bytes(problem, plan)
        middle = [c for c in problem.candidates if c.block == "b.1"]
        assert held == sum(c.keep_bytes for c in middle if plan.decision(c.name) is Decision.KEEP)
        assert saved_bytes(problem, plan) == saved_bytes(alone, plan) + copies * held
        extra = sum(c.recompute_seconds for c in middle if plan.decision(c.name) is Decision.RECOMPUTE)
        assert added_seconds(problem, plan) == pytest.approx(added_seconds(alone, plan) + copies * extra)
        simulated = peak_model.simulate(problem, plan)
        assert simulated.saved_bytes == saved_bytes(problem, plan)
        # The copies' values are held at the boundary, where both phases meet.
        assert simulated.peak_bytes >= peak_model.simulate(alone, plan).peak_bytes
        assert simulated.peak_bytes >= simulated.saved_bytes
        assert modelled(problem, plan) >= simulated.peak_bytes - 1e-6


def test_reduced_problem_carries_the_copies_and_milp_refuses_the_unreduced_one():
    rng = random.Random(7)
    problem = blocked_problem(rng, 3, copies=4)
    classes = (("b.2", "b.1", "b.0"),)
    nodes = {}  # classes are given: no signatures needed
    reduction = reduce_identical_blocks(problem, nodes, classes)
    assert reduction.problem.repeat is None
    rep = reduction.problem.by_name()["v6"]  # b.2's first value stands for all blocks' and the copies'
    assert rep.keep_bytes == problem.by_name()["v0"].keep_bytes * (3 + 4)
    solution = solve_milp(dataclasses.replace(reduction.problem, budget_bytes=None), SolverOptions())
    assert solution.status == "optimal"
    expanded = reduction.expand(solution)
    assert added_seconds(problem, expanded) == pytest.approx(added_seconds(reduction.problem, solution))
    assert saved_bytes(problem, expanded) == saved_bytes(reduction.problem, solution)
    with pytest.raises(ValueError, match="block-reduced"):
        solve_milp(problem, SolverOptions())


def test_a_repeated_block_outside_every_class_is_an_error():
    problem = blocked_problem(random.Random(1), 2, copies=2)
    with pytest.raises(ValueError, match="in no class"):
        reduce_identical_blocks(problem, {}, (("b.2", "b.0"),))


@pytest.mark.parametrize("seed", range(8))
def test_folded_figures_equal_the_unfolded_step(seed):
    """Every plan that treats the blocks alike: the folded problem's saved
    bytes, time and simulated peak are the unfolded step's, and its model
    bounds the unfolded simulation."""
    copies, per_block = 1 + seed % 4, 2 + seed % 2
    folded = blocked_problem(random.Random(seed), per_block, copies)
    deep = blocked_problem(random.Random(seed), per_block, copies, unfolded=True)
    for plan in legal_plans(folded):
        by_position = [plan.choices.get(f"v{i}") for i in range(per_block)]
        if any(plan.choices.get(c.name) != by_position[int(c.name[1:]) % per_block] for c in folded.candidates):
            continue  # the blocks decide differently: not a folded plan
        choices = {c.name: by_position[int(c.name[1:]) % per_block] for c in deep.candidates}
        deep_plan = dataclasses.replace(plan, choices={k: v for k, v in choices.items() if v is not None})
        assert saved_bytes(folded, plan) == saved_bytes(deep, deep_plan)
        assert added_seconds(folded, plan) == pytest.approx(added_seconds(deep, deep_plan))
        assert peak_model.simulate(folded, plan).peak_bytes == peak_model.simulate(deep, deep_plan).peak_bytes
        assert modelled(folded, plan) >= peak_model.simulate(deep, deep_plan).peak_bytes - 1e-6
