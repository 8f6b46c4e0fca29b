"""The MILP against brute-force enumeration on small problems."""

from __future__ import annotations

import itertools
import random

import pytest

from adacc_compile.passes.milp import SolverOptions, solve_milp, with_start
from adacc_compile.passes.plan_problem import (
    Candidate,
    Choice,
    CompressOption,
    Decision,
    PlanProblem,
    PlanSolution,
    added_seconds,
    check_solution,
    saved_bytes,
)


def brute_force(problem: PlanProblem) -> float | None:
    """Minimum added time over every legal assignment (None: infeasible)."""
    per_candidate = []
    for cand in problem.candidates:
        opts = [Choice(decision=Decision.NONE)]
        if cand.can_keep:
            opts.append(Choice(decision=Decision.KEEP))
        if cand.can_recompute:
            opts.append(Choice(decision=Decision.RECOMPUTE))
        opts += [Choice(decision=Decision.COMPRESS, codec=o.codec) for o in cand.compress]
        per_candidate.append(opts)
    best = None
    for combo in itertools.product(*per_candidate):
        choices = {
            c.name: ch for c, ch in zip(problem.candidates, combo) if ch.decision is not Decision.NONE
        }
        sol = PlanSolution(choices=choices, status="brute", solver="brute")
        if check_solution(problem, sol):
            continue
        cost = added_seconds(problem, sol)
        if best is None or cost < best:
            best = cost
    return best


def random_problem(rng: random.Random, n: int, with_codecs: bool) -> PlanProblem:
    cands = []
    for i in range(n):
        inputs = tuple(f"v{j}" for j in range(i) if rng.random() < 0.3)
        compress = ()
        if with_codecs and rng.random() < 0.4:
            b = rng.randint(10, 100)
            compress = (
                CompressOption(
                    codec="c8", nbytes=b // 2, seconds=rng.uniform(0.5, 3) * 1e-6,
                    feeds_recompute=rng.random() < 0.7,
                ),
            )
        cands.append(
            Candidate(
                name=f"v{i}",
                keep_bytes=rng.randint(10, 100),
                recompute_seconds=rng.uniform(0.1, 10) * 1e-6,
                inputs=inputs,
                required=rng.random() < 0.5,
                can_keep=rng.random() > 0.1,
                can_recompute=rng.random() > 0.15,
                compress=compress,
            )
        )
    total = sum(c.keep_bytes for c in cands)
    return PlanProblem(candidates=tuple(cands), budget_bytes=int(total * rng.uniform(0.1, 0.7)))


@pytest.mark.parametrize("seed", range(25))
def test_milp_matches_brute_force(seed):
    rng = random.Random(seed)
    problem = random_problem(rng, n=rng.randint(4, 9), with_codecs=seed % 2 == 0)
    expected = brute_force(problem)
    solution = solve_milp(problem, SolverOptions(mip_rel_gap=0.0))
    if expected is None:
        assert solution.status == "infeasible"
        return
    assert solution.status == "optimal"
    assert check_solution(problem, solution) == []
    assert added_seconds(problem, solution) == pytest.approx(expected, rel=1e-6, abs=1e-12)


def test_chain_recompute_needs_inputs():
    """a -> b -> c, backward reads c; budget fits one value.

    Keeping c costs 0 time; with a budget below c's bytes the cheapest legal
    plan keeps a (the smallest) and recomputes b and c from it.
    """
    problem = PlanProblem(
        candidates=(
            Candidate(name="a", keep_bytes=10, recompute_seconds=5e-6, can_recompute=False),
            Candidate(name="b", keep_bytes=40, recompute_seconds=1e-6, inputs=("a",)),
            Candidate(name="c", keep_bytes=40, recompute_seconds=1e-6, inputs=("b",), required=True),
        ),
        budget_bytes=20,
    )
    sol = solve_milp(problem)
    assert {k: v.decision for k, v in sol.choices.items()} == {
        "a": Decision.KEEP,
        "b": Decision.RECOMPUTE,
        "c": Decision.RECOMPUTE,
    }
    assert saved_bytes(problem, sol) == 10


def test_minimize_bytes_and_lp_file(tmp_path):
    problem = PlanProblem(
        candidates=(
            Candidate(name="x", keep_bytes=100, recompute_seconds=1e-6, required=True),
            Candidate(name="y", keep_bytes=8, recompute_seconds=1e-6, required=True, can_recompute=False),
        ),
    )
    lp = tmp_path / "model.lp"
    sol = solve_milp(problem, SolverOptions(lp_path=str(lp)), minimize="bytes")
    assert saved_bytes(problem, sol) == 8
    text = lp.read_text()
    assert "keep_x" in text and "recompute_x" in text


@pytest.mark.parametrize("seed", range(15))
def test_greedy_and_baseline_policies_are_legal(seed):
    from adacc_compile.passes.greedy import solve_greedy
    from adacc_compile.passes.policies import keep_all_policy, recompute_all_policy

    rng = random.Random(100 + seed)
    problem = random_problem(rng, n=rng.randint(4, 9), with_codecs=True)
    optimum = brute_force(problem)
    greedy = solve_greedy(problem)
    if greedy.status == "greedy":
        assert check_solution(problem, greedy) == []
        assert optimum is not None and added_seconds(problem, greedy) >= optimum - 1e-12
    unconstrained = PlanProblem(candidates=problem.candidates)
    for policy in (keep_all_policy, recompute_all_policy):
        solution = policy(unconstrained, SolverOptions())
        if solution.status != "infeasible":
            assert check_solution(unconstrained, solution) == []


def test_solver_time_limit_warns_and_still_returns_a_legal_plan():
    from adacc_compile.passes.policies import milp_policy

    rng = random.Random(7)
    problem = random_problem(rng, n=9, with_codecs=True)
    problem = PlanProblem(candidates=problem.candidates, budget_bytes=sum(c.keep_bytes for c in problem.candidates))
    with pytest.warns(UserWarning, match="time limit|recomputes everything"):
        solution = milp_policy(problem, SolverOptions(time_limit_s=1e-9))
    assert solution.status in ("time_limit", "heuristic", "feasible")
    assert check_solution(problem, solution) == []


def _correlated_knapsack(n: int) -> PlanProblem:
    """Every value kept or recomputed, recomputing costs its bytes plus a
    constant: a knapsack whose LP bound is loose, so HiGHS branches."""
    rng = random.Random(0)
    sizes = [rng.randint(100, 1000) for _ in range(n)]
    candidates = tuple(
        Candidate(name=f"v{i}", keep_bytes=b, recompute_seconds=(b + 100) * 1e-6, required=True)
        for i, b in enumerate(sizes)
    )
    return PlanProblem(candidates=candidates, budget_bytes=sum(sizes) // 2)


def test_the_node_limit_stops_every_solve_at_the_same_plan():
    """A time limit stops HiGHS where the machine's load lets it; the node
    limit at the same place in every solve, so the plan is the same in
    every process. Stopped there, the plan is legal, no better than the
    optimum, and the policy uses it without a warning (the note says how
    far from the bound it stopped)."""
    import warnings

    from adacc_compile.passes.policies import milp_policy

    problem = _correlated_knapsack(30)
    optimum = solve_milp(problem, SolverOptions(mip_rel_gap=0.0))
    limited = [solve_milp(problem, SolverOptions(node_limit=2)) for _ in range(3)]
    assert optimum.status == "optimal"
    assert [s.status for s in limited] == ["node_limit"] * 3
    assert limited[0].choices == limited[1].choices == limited[2].choices
    assert check_solution(problem, limited[0]) == []
    assert added_seconds(problem, limited[0]) >= added_seconds(problem, optimum) * (1 - 1e-9)
    assert "node limit (2)" in limited[0].notes[-1] and "above its bound" in limited[0].notes[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert milp_policy(problem, SolverOptions(node_limit=2)).choices == limited[0].choices


@pytest.mark.parametrize("seed", range(12))
def test_a_start_plan_never_changes_the_optimum(seed):
    """Re-plans start HiGHS from the plan they replace: from the optimum
    itself, from a plan that no longer fits (everything kept) and from a
    partial plan, the solve ends at the cold solve's optimum."""
    rng = random.Random(seed)
    problem = random_problem(rng, n=rng.randint(5, 9), with_codecs=seed % 2 == 0)
    cold = solve_milp(problem, SolverOptions(mip_rel_gap=0.0))
    if cold.status == "infeasible":
        return
    keep_all = {c.name: Choice(decision=Decision.KEEP) for c in problem.candidates if c.can_keep}
    partial = dict(list(cold.choices.items())[: len(cold.choices) // 2])
    for start in (cold.choices, keep_all, partial):
        warm = solve_milp(problem, SolverOptions(mip_rel_gap=0.0, start=start))
        assert warm.status == "optimal" and check_solution(problem, warm) == []
        assert added_seconds(problem, warm) == pytest.approx(added_seconds(problem, cold), rel=1e-6, abs=1e-12)
    accepted = solve_milp(problem, SolverOptions(mip_rel_gap=0.0, start=cold.choices))
    assert "started from the given plan" in accepted.notes


def test_with_start_names_its_plan_and_keeps_a_given_start():
    """The solves at the reachable minimum start from a plan found before
    them; the solution's note says which; a re-plan's own start wins; an
    empty plan is no start."""
    problem = random_problem(random.Random(3), n=6, with_codecs=False)
    cold = solve_milp(problem)
    assert cold.choices
    started = with_start(SolverOptions(), cold, "the cold optimum")
    assert started.start == cold.choices and started.start_from == "the cold optimum"
    assert "started from the cold optimum" in solve_milp(problem, started).notes
    given = SolverOptions(start={})
    assert with_start(given, cold, "the cold optimum") is given
    assert with_start(SolverOptions(), PlanSolution(choices={}, status="infeasible", solver="milp"), "nothing").start is None


def test_a_solve_after_another_highs_user_with_other_threads_still_solves():
    """HiGHS sizes one thread scheduler per process at its first solve; a
    later solve asking for another thread count fails at once with no model
    status. An earlier solve with two threads (a benchmark's own LP, a
    user's model) once made every plan fall back to recomputing everything."""
    import highspy

    other = highspy.Highs()
    other.setOptionValue("output_flag", False)
    other.setOptionValue("threads", 2)
    other.addVar(0.0, 1.0)
    other.run()
    solution = solve_milp(_chain(), SolverOptions(threads=1))
    assert solution.status == "optimal" and solution.decision("c") is Decision.RECOMPUTE


def _chain() -> PlanProblem:
    return PlanProblem(
        candidates=(
            Candidate(name="a", keep_bytes=10, recompute_seconds=5e-6, can_recompute=False),
            Candidate(name="b", keep_bytes=40, recompute_seconds=1e-6, inputs=("a",)),
            Candidate(name="c", keep_bytes=40, recompute_seconds=1e-6, inputs=("b",), required=True),
        ),
        budget_bytes=20,
    )


def test_each_solve_records_its_branch_and_bound_nodes_and_gap():
    from adacc_compile.passes import plan_timing

    timing = plan_timing.PlanTiming()
    with plan_timing.recording(timing):
        for seed in range(3):
            solve_milp(random_problem(random.Random(seed), n=8, with_codecs=True), SolverOptions(mip_rel_gap=1e-4))
    assert timing.solves == 3 and len(timing.nodes) == 3 and len(timing.gaps) == 3
    assert all(n >= 0 for n in timing.nodes)
    assert all(g == -1.0 or 0.0 <= g <= 1e-4 for g in timing.gaps), timing.gaps
    assert timing.summary()["nodes"] == timing.nodes
