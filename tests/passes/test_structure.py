"""Identical-block reduction on hand-made problems."""

from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from adacc_compile.passes.milp import SolverOptions, solve_milp
from adacc_compile.passes.plan_problem import Candidate, PlanProblem, added_seconds, check_solution, saved_bytes
from adacc_compile.passes.structure import reduce_identical_blocks


def chain_problem(n_blocks: int, budget_ratio: float) -> tuple[PlanProblem, dict[str, fx.Node]]:
    """emb -> [a_i -> b_i -> c_i] x n, each block reading the previous c.

    a: cheap to recompute, b: an expensive matmul-like value, c: the block
    output. The backward reads a_i and b_i of every block.
    """
    graph = fx.Graph()
    nodes = {}
    cands = [Candidate(name="emb", keep_bytes=64, recompute_seconds=1e-6, can_recompute=False)]
    nodes["emb"] = graph.placeholder("emb")
    previous = "emb"
    for i in range(n_blocks):
        for short, nbytes, seconds, deps, required in (
            ("a", 64, 1e-6, (previous,), True),
            ("b", 256, 50e-6, (f"a{i}",), True),
            ("c", 64, 2e-6, (f"b{i}",), False),
        ):
            name = f"{short}{i}"
            node = graph.call_function(torch.relu, (nodes[deps[0]],), name=name)
            node.meta["val"] = torch.empty(4)
            from adacc_compile.passes.annotate import NodeAnnotation
            from adacc_compile.passes.op_class import OpClass

            node.meta["adacc"] = NodeAnnotation(
                op=f"op_{short}", op_class=OpClass.ELEMENTWISE, side="forward", nbytes=nbytes,
                storage_bytes=nbytes, flops=0, bytes_moved=0, runtime_s=seconds, layer=f"blocks.{i}",
                module_path=f"blocks.{i}",
            )
            nodes[name] = node
            cands.append(
                Candidate(name=name, keep_bytes=nbytes, recompute_seconds=seconds, inputs=deps,
                          required=required, block=f"blocks.{i}")
            )
        previous = f"c{i}"
    total = sum(c.keep_bytes for c in cands if c.required)
    return PlanProblem(candidates=tuple(cands), budget_bytes=int(budget_ratio * total)), nodes


def test_reduction_folds_identical_blocks_and_expands_back():
    problem, nodes = chain_problem(4, 0.5)
    reduction = reduce_identical_blocks(problem, nodes)
    # The representative is the block the backward differentiates first: the last.
    assert reduction.used and reduction.classes == (("blocks.3", "blocks.2", "blocks.1", "blocks.0"),)
    assert len(reduction.problem.candidates) == 1 + 3
    a_rep = next(c for c in reduction.problem.candidates if c.name == "a3")
    assert a_rep.keep_bytes == 4 * 64 and a_rep.recompute_seconds == 4e-6
    assert set(a_rep.inputs) == {"emb", "c3"}
    c_rep = next(c for c in reduction.problem.candidates if c.name == "c3")
    assert c_rep.inputs == ("b3",)
    assert reduction.rep_of == {f"{s}{i}": f"{s}3" for s in "abc" for i in range(3)}
    solution = reduction.expand(solve_milp(reduction.problem))
    assert check_solution(problem, solution) == []
    for i in range(3):
        for short in "abc":
            assert solution.decision(f"{short}{i}") is solution.decision(f"{short}3")


def test_reduced_plan_is_legal_and_bounded_by_the_full_optimum():
    """The full MILP is a lower bound; on this coarse toy (three values per
    block) symmetric plans can cost up to 4x more at some budgets (only
    whole-class decisions exist), and match it where the budget divides
    evenly. Real models, with dozens of values per block, are compared in
    tests/e2e/test_compression.py."""
    for ratio in (0.9, 0.6, 0.45, 0.3, 0.2):
        problem, nodes = chain_problem(4, ratio)
        full = solve_milp(problem, SolverOptions(mip_rel_gap=0))
        reduction = reduce_identical_blocks(problem, nodes)
        reduced = reduction.expand(solve_milp(reduction.problem, SolverOptions(mip_rel_gap=0)))
        assert check_solution(problem, reduced) == []
        assert saved_bytes(problem, reduced) <= problem.budget_bytes
        assert added_seconds(problem, full) <= added_seconds(problem, reduced) + 1e-12
        if ratio == 0.2:
            assert added_seconds(problem, reduced) == added_seconds(problem, full)


def test_different_blocks_are_not_folded():
    problem, nodes = chain_problem(3, 0.5)
    changed = [
        dataclasses.replace(c, keep_bytes=128) if c.name == "b2" else c for c in problem.candidates
    ]
    problem = dataclasses.replace(problem, candidates=tuple(changed))
    reduction = reduce_identical_blocks(problem, nodes)
    assert reduction.classes == (("blocks.1", "blocks.0"),)
    assert {"b2", "a2", "c2"} <= {c.name for c in reduction.problem.candidates}
