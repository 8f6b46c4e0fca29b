"""Predicted step time of a partitioned pipeline on a link.

Joins the pieces: a `Partition` gives each stage's forward, backward and
recompute seconds per micro-batch; a `LinkProfile` (`passes.comm_model`)
gives the point-to-point time of a stage's output and of its gradient;
`simulate` replays the schedule with recomputation on demand or ahead of
the gradient.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from adacc_compile.passes.comm_model import LinkProfile

from .partition import Partition
from .simulate import StageTimes, Timeline, simulate


def p2p_seconds(nbytes: int, link: LinkProfile) -> float:
    """One send/receive between neighbouring stages: one hop of the
    alpha-beta model (launch + latency + bytes over the link)."""
    return link.launch_overhead_s + link.latency_s + nbytes / link.bandwidth_bytes_per_s


def stage_times(partition: Partition, link: LinkProfile) -> list[StageTimes]:
    return [
        StageTimes(forward=s.forward_seconds, backward=s.backward_seconds, recompute=s.recompute_seconds,
                   send=p2p_seconds(s.boundary_bytes, link))
        for s in partition.stages
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    method: str
    recompute: str
    step_seconds: float
    bubble_fraction: float
    bottleneck_seconds: float


def predict_step(
    partition: Partition, link: LinkProfile, *, n_microbatches: int, recompute: str, schedule: str = "1f1b"
) -> tuple[Prediction, Timeline]:
    """The simulated step (1F1B over the partition's stages, one per rank)."""
    timeline = simulate(stage_times(partition, link), schedule=schedule, n_ranks=len(partition.stages),
                        n_microbatches=n_microbatches, recompute=recompute)
    return Prediction(method=partition.method, recompute=recompute, step_seconds=timeline.step_seconds,
                      bubble_fraction=timeline.bubble_fraction,
                      bottleneck_seconds=partition.bottleneck_seconds), timeline


@dataclass(frozen=True, slots=True, kw_only=True)
class ComparisonRow:
    link: str
    method: str
    recompute: str
    step_seconds: float
    bubble_fraction: float
    bottleneck_seconds: float
    split_points: tuple[int, ...]
    feasible: bool


def compare_partitions(
    layers, n_stages: int, budget_per_stage, links: dict[str, LinkProfile], *, n_microbatches: int
) -> tuple[list[ComparisonRow], dict]:
    """Even split, compute-balanced split (`balanced_split`) and adacc's
    partition (searched for each recompute mode), each with recomputation
    on demand and ahead, on every link:
    the predicted 1F1B step times, plus the partitions (their JSON) and the
    search time."""
    from .partition import balanced_split, even_split, partition, plan_split

    even = plan_split(layers, even_split(layers, n_stages), budget_per_stage, n_microbatches=n_microbatches,
                      method="even")
    balanced = plan_split(layers, balanced_split(layers, n_stages), budget_per_stage,
                          n_microbatches=n_microbatches, method="balanced")
    searched = {mode: partition(layers, n_stages, budget_per_stage, n_microbatches=n_microbatches, recompute=mode)
                for mode in ("on_demand", "ahead")}
    best = {
        (name, mode): best_by_simulation(layers, n_stages, budget_per_stage, link, n_microbatches=n_microbatches,
                                         recompute=mode)
        for name, link in links.items() for mode in ("on_demand", "ahead")
    }
    rows = []
    for link_name, link in links.items():
        for method in ("even", "balanced", "adacc", "adacc simulated"):
            for mode in ("on_demand", "ahead"):
                part = {"even": even, "balanced": balanced, "adacc": searched[mode]}.get(method) or best[(link_name, mode)]
                prediction, _ = predict_step(part, link, n_microbatches=n_microbatches, recompute=mode)
                rows.append(ComparisonRow(
                    link=link_name, method=part.method, recompute=mode, step_seconds=prediction.step_seconds,
                    bubble_fraction=prediction.bubble_fraction, bottleneck_seconds=part.bottleneck_seconds,
                    split_points=part.split_points, feasible=part.feasible,
                ))
    searched_seconds = max(part.search_seconds for part in searched.values())
    simulated_seconds = max(part.search_seconds for part in best.values())
    return rows, {"even": even.to_json(), "balanced": balanced.to_json(),
                  "adacc": {mode: part.to_json() for mode, part in searched.items()},
                  "search_seconds": searched_seconds, "simulated_search_seconds": simulated_seconds}


def best_by_simulation(
    layers, n_stages: int, budget_per_stage, link: LinkProfile, *, n_microbatches: int, recompute: str
) -> Partition:
    """The fastest, by simulated step (`predict_step`), of `partition`'s two
    optima (slowest stage; step estimate) and the even and compute-balanced
    splits with adacc's per-stage plans. The step estimate is exact for its
    formula, not for the schedule: with a slow stage in the middle, the
    stages after it overlap their fill and drain, which the formula does
    not credit; the simulator does. Candidates that do not fit are skipped."""
    import dataclasses

    from .partition import balanced_split, even_split, partition, plan_split

    start = time.perf_counter()
    candidates = [
        partition(layers, n_stages, budget_per_stage, n_microbatches=n_microbatches, objective="bottleneck"),
        partition(layers, n_stages, budget_per_stage, n_microbatches=n_microbatches, recompute=recompute),
        plan_split(layers, even_split(layers, n_stages), budget_per_stage, n_microbatches=n_microbatches),
        plan_split(layers, balanced_split(layers, n_stages), budget_per_stage, n_microbatches=n_microbatches),
    ]
    fitting = [c for c in candidates if c.feasible]
    best = min(fitting, key=lambda c: predict_step(c, link, n_microbatches=n_microbatches, recompute=recompute)[0]
               .step_seconds)
    return dataclasses.replace(best, method="adacc simulated", search_seconds=time.perf_counter() - start)
