"""Recompute-aware stage partitioning: where to split the layers and how
each stage plans its activations.

Under 1F1B, stage ``s`` of ``S`` holds ``S - s`` micro-batches in flight
(`schedules.in_flight`), so with an even split and equal memory per device
the first stages must recompute the most and can set the pace of the whole
pipeline. The partitioner chooses contiguous split points *and*, per layer,
one `PlanLevel` (keep all, adacc at a budget, recompute all), subject to
each stage's memory:

    static bytes of its layers + in_flight(s) * saved bytes of its layers
    + the largest working set of one of its layers' backward  <=  budget(s)

and minimises either the slowest stage's ``forward + backward +
recompute`` per micro-batch (``objective="bottleneck"``, the steady
state's cycle) or a 1F1B step estimate that adds the pipeline's fill and
drain (``objective="step"``, see `partition`). Recomputation ahead of the
gradient leaves the dependency chain but still occupies the device, so it
counts in full in the cycle; only in the fill/drain term is it hidden.
`simulate` replays the schedule for the step time itself.

The search is exact for its objective. Per stage it is a multiple-choice
knapsack (least recomputation under the memory cap), solved by a Pareto
frontier of (saved bytes, recompute seconds) over the stage's layers, once
per threshold on the working set; over split points it is the min-max
dynamic program ``best[s][j] = min_i max(best[s-1][i], cost(s, i, j))``,
and for the step objective a min-sum program under each candidate cap.
Ranges whose forward + backward alone cannot beat the even split are
skipped, which keeps the search well under a second for 48 layers on 8
stages.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

from .layer_cost import LayerCost
from .schedules import in_flight


@dataclass(frozen=True, slots=True, kw_only=True)
class StagePlan:
    """One stage of a partition."""

    first_layer: int
    end_layer: int
    """Layers ``first_layer .. end_layer - 1``."""
    levels: tuple[str, ...]
    """The chosen `PlanLevel` name per layer."""
    in_flight: int
    forward_seconds: float
    backward_seconds: float
    recompute_seconds: float
    saved_bytes: int
    """Per micro-batch."""
    memory_bytes: int
    """The modelled peak: static + in_flight * saved + working set."""
    static_bytes: int
    budget_bytes: int
    boundary_bytes: int
    """Output (and gradient) bytes sent to the next stage per micro-batch."""

    @property
    def seconds(self) -> float:
        return self.forward_seconds + self.backward_seconds + self.recompute_seconds

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.budget_bytes

    @property
    def working_bytes(self) -> int:
        """Room for one layer's backward working set: also the cap on what
        recomputation ahead of the gradient may hold (`recompute_ahead`)."""
        return self.memory_bytes - self.static_bytes - self.in_flight * self.saved_bytes

    @property
    def microbatch_activation_bytes(self) -> int:
        """What one micro-batch's activations may peak at (its saved bytes
        plus the working set): the byte budget to give adacc when it plans
        the whole stage as one graph."""
        return self.memory_bytes - self.static_bytes - (self.in_flight - 1) * self.saved_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Partition:
    stages: tuple[StagePlan, ...]
    method: str
    """"adacc" (searched split points) or "even"."""
    search_seconds: float

    @property
    def bottleneck_seconds(self) -> float:
        return max(s.seconds for s in self.stages)

    @property
    def split_points(self) -> tuple[int, ...]:
        return tuple(s.first_layer for s in self.stages[1:])

    @property
    def feasible(self) -> bool:
        return all(s.fits for s in self.stages)

    def to_json(self) -> dict:
        return {
            "method": self.method,
            "split_points": list(self.split_points),
            "bottleneck_seconds": self.bottleneck_seconds,
            "search_seconds": self.search_seconds,
            "feasible": self.feasible,
            "stages": [
                {"layers": [s.first_layer, s.end_layer], "levels": list(s.levels), "in_flight": s.in_flight,
                 "forward_seconds": s.forward_seconds, "backward_seconds": s.backward_seconds,
                 "recompute_seconds": s.recompute_seconds, "saved_bytes": s.saved_bytes,
                 "memory_bytes": s.memory_bytes, "static_bytes": s.static_bytes, "budget_bytes": s.budget_bytes,
                 "microbatch_activation_bytes": s.microbatch_activation_bytes,
                 "working_bytes": s.working_bytes, "fits": s.fits}
                for s in self.stages
            ],
        }


class InfeasiblePartitionError(ValueError):
    """No split and plan fits the stages' memory budgets."""


# One frontier entry: (saved bytes, recompute seconds, level index per layer).
_Entry = tuple[int, float, tuple[int, ...]]


def _extend(frontier: list[_Entry], layer: LayerCost, cap: int, working_cap: int) -> list[_Entry]:
    """The Pareto frontier after adding ``layer`` (levels whose working set
    exceeds ``working_cap`` excluded; entries above ``cap`` bytes dropped)."""
    grown = [
        (b + lv.saved_bytes, r + lv.recompute_seconds, (*picks, k))
        for b, r, picks in frontier
        for k, lv in enumerate(layer.levels)
        if lv.working_bytes <= working_cap and b + lv.saved_bytes <= cap
    ]
    grown.sort(key=lambda e: (e[0], e[1]))
    out: list[_Entry] = []
    best = math.inf
    for entry in grown:
        if entry[1] < best - 1e-15:
            out.append(entry)
            best = entry[1]
    return out


class _StageCosts:
    """Cheapest plan of every layer range on every stage, computed lazily
    per first layer (one frontier sweep serves every end layer)."""

    def __init__(self, layers: Sequence[LayerCost], budgets: Sequence[int], counts: Sequence[int], limit: float):
        self.layers = layers
        self.budgets = budgets
        self.counts = counts
        self.limit = limit
        self.working_caps = sorted({lv.working_bytes for layer in layers for lv in layer.levels})
        self.cache: dict[int, dict[tuple[int, int], tuple[float, tuple[int, ...], int, int] | None]] = {}
        fb = [layer.forward_seconds + layer.backward_seconds for layer in layers]
        self.prefix = [0.0]
        for x in fb:
            self.prefix.append(self.prefix[-1] + x)
        static = [layer.static_bytes for layer in layers]
        self.static_prefix = [0]
        for x in static:
            self.static_prefix.append(self.static_prefix[-1] + x)

    def compute_seconds(self, i: int, j: int) -> float:
        return self.prefix[j] - self.prefix[i]

    def _sweep(self, i: int) -> dict:
        table: dict[tuple[int, int], tuple[float, tuple[int, ...], int, int] | None] = {}
        max_budget = max(self.budgets)
        for working in self.working_caps:
            frontier: list[_Entry] = [(0, 0.0, ())]
            for j in range(i + 1, len(self.layers) + 1):
                if self.compute_seconds(i, j) > self.limit:
                    break
                static = self.static_prefix[j] - self.static_prefix[i]
                cap = max_budget - static - working
                if cap < 0:
                    break
                frontier = _extend(frontier, self.layers[j - 1], cap // min(self.counts), working)
                if not frontier:
                    break
                for s, (budget, count) in enumerate(zip(self.budgets, self.counts)):
                    room = budget - static - working
                    fitting = [e for e in frontier if count * e[0] <= room]
                    if not fitting:
                        continue
                    saved, rec, picks = min(fitting, key=lambda e: e[1])
                    old = table.get((s, j))
                    if old is None or rec < old[0] - 1e-15:
                        table[(s, j)] = (rec, picks, saved, static + working + count * saved)
        return table

    def best(self, s: int, i: int, j: int) -> tuple[float, tuple[int, ...], int, int] | None:
        """(recompute seconds, level picks, saved bytes, memory bytes) of
        layers ``i..j-1`` on stage ``s``, or None if nothing fits."""
        if i not in self.cache:
            self.cache[i] = self._sweep(i)
        return self.cache[i].get((s, j))


def _stage_plan(costs: _StageCosts, s: int, i: int, j: int) -> StagePlan:
    found = costs.best(s, i, j)
    layers = costs.layers[i:j]
    if found is None:
        # Over budget: report the least-memory plan, marked as not fitting.
        picks = tuple(len(layer.levels) - 1 for layer in layers)
        levels = [layer.levels[k] for layer, k in zip(layers, picks)]
        saved = sum(lv.saved_bytes for lv in levels)
        memory = (sum(layer.static_bytes for layer in layers) + costs.counts[s] * saved
                  + max(lv.working_bytes for lv in levels))
        rec = sum(lv.recompute_seconds for lv in levels)
    else:
        rec, picks, saved, memory = found
        levels = [layer.levels[k] for layer, k in zip(layers, picks)]
    return StagePlan(
        first_layer=i, end_layer=j, levels=tuple(lv.name for lv in levels), in_flight=costs.counts[s],
        forward_seconds=sum(layer.forward_seconds for layer in layers),
        backward_seconds=sum(layer.backward_seconds for layer in layers),
        recompute_seconds=rec, saved_bytes=saved, memory_bytes=memory, budget_bytes=costs.budgets[s],
        static_bytes=sum(layer.static_bytes for layer in layers),
        boundary_bytes=layers[-1].boundary_bytes,
    )


def stage_counts(schedule: str, n_stages: int, n_microbatches: int) -> list[int]:
    """Micro-batches each stage holds in flight (1F1B)."""
    return [in_flight(schedule, s, n_stages, n_microbatches)[0] for s in range(n_stages)]


def _budgets(budget_per_stage: int | Sequence[int], n_stages: int) -> list[int]:
    if isinstance(budget_per_stage, int):
        return [budget_per_stage] * n_stages
    budgets = [int(b) for b in budget_per_stage]
    if len(budgets) != n_stages:
        raise ValueError(f"{len(budgets)} budgets for {n_stages} stages")
    return budgets


def even_split(layers: Sequence[LayerCost], n_stages: int) -> list[int]:
    """First layer of each stage after the first: equal layer counts, the
    remainder going to the last stages (which hold fewer micro-batches)."""
    base, extra = divmod(len(layers), n_stages)
    sizes = [base + (1 if s >= n_stages - extra else 0) for s in range(n_stages)]
    points, at = [], 0
    for size in sizes[:-1]:
        at += size
        points.append(at)
    return points


def balanced_split(layers: Sequence[LayerCost], n_stages: int) -> list[int]:
    """Split points that balance forward + backward alone (memory and
    recomputation ignored): the recompute-unaware baseline that separates
    what `partition` gains from knowing the memory from what it gains from
    balancing uneven layers (an embedding, a large head)."""
    import dataclasses

    unconstrained = [dataclasses.replace(layer, levels=layer.levels[:1]) for layer in layers]
    return list(partition(unconstrained, n_stages, 1 << 62, n_microbatches=1).split_points)


def plan_split(
    layers: Sequence[LayerCost], split_points: Sequence[int], budget_per_stage: int | Sequence[int], *,
    schedule: str = "1f1b", n_microbatches: int = 8, method: str = "given",
) -> Partition:
    """The cheapest per-stage plans for fixed split points."""
    start = time.perf_counter()
    n_stages = len(split_points) + 1
    costs = _StageCosts(layers, _budgets(budget_per_stage, n_stages),
                        stage_counts(schedule, n_stages, n_microbatches), math.inf)
    bounds = [0, *split_points, len(layers)]
    stages = tuple(_stage_plan(costs, s, bounds[s], bounds[s + 1]) for s in range(n_stages))
    return Partition(stages=stages, method=method, search_seconds=time.perf_counter() - start)


OBJECTIVES = ("step", "bottleneck")


def _bounds_from(choice: list[list[int]], n_stages: int, n: int) -> list[int]:
    bounds = [n]
    for s in range(n_stages - 1, 0, -1):
        bounds.append(choice[s][bounds[-1]])
    return [0, *reversed(bounds)]


def _min_max(costs: "_StageCosts", n_stages: int, stage_seconds) -> tuple[float, list[int] | None]:
    """``min over splits of max over stages``: the classic dynamic program."""
    n = len(costs.layers)
    best = [[math.inf] * (n + 1) for _ in range(n_stages)]
    choice = [[-1] * (n + 1) for _ in range(n_stages)]
    for j in range(1, n + 1):
        best[0][j], choice[0][j] = stage_seconds(0, 0, j), 0
    for s in range(1, n_stages):
        for j in range(s + 1, n + 1):
            for i in range(j - 1, s - 1, -1):
                if best[s - 1][i] >= best[s][j]:
                    continue
                if costs.compute_seconds(i, j) > costs.limit:
                    break
                value = max(best[s - 1][i], stage_seconds(s, i, j))
                if value < best[s][j]:
                    best[s][j], choice[s][j] = value, i
    value = best[n_stages - 1][n]
    return value, None if math.isinf(value) else _bounds_from(choice, n_stages, n)


def _min_sum_capped(costs: "_StageCosts", n_stages: int, stage_seconds, fill_seconds, cap: float):
    """``min over splits of the sum of fill_seconds`` with every stage's
    ``stage_seconds`` at most ``cap``."""
    n = len(costs.layers)
    best = [[math.inf] * (n + 1) for _ in range(n_stages)]
    choice = [[-1] * (n + 1) for _ in range(n_stages)]
    for j in range(1, n + 1):
        if stage_seconds(0, 0, j) <= cap:
            best[0][j], choice[0][j] = fill_seconds(0, 0, j), 0
    for s in range(1, n_stages):
        for j in range(s + 1, n + 1):
            for i in range(j - 1, s - 1, -1):
                if costs.compute_seconds(i, j) > cap:
                    break
                if math.isinf(best[s - 1][i]) or stage_seconds(s, i, j) > cap:
                    continue
                value = best[s - 1][i] + fill_seconds(s, i, j)
                if value < best[s][j]:
                    best[s][j], choice[s][j] = value, i
    value = best[n_stages - 1][n]
    return value, None if math.isinf(value) else _bounds_from(choice, n_stages, n)


def partition(
    layers: Sequence[LayerCost], n_stages: int, budget_per_stage: int | Sequence[int], *,
    schedule: str = "1f1b", n_microbatches: int = 8, objective: str = "step", recompute: str = "on_demand",
) -> Partition:
    """Exact split points and per-layer plans under the stages' budgets.

    ``objective="bottleneck"`` minimises the slowest stage's ``forward +
    backward + recompute`` per micro-batch (the steady state's cycle).
    ``objective="step"`` (default) minimises the 1F1B step estimate

        (n_microbatches - 1) * slowest stage  +  sum over stages of fill time

    where a stage's fill time (one pass through the pipeline, warm-up and
    cool-down) is ``forward + backward + recompute``, with the recompute
    left out on all but the last stage under ``recompute="ahead"``: there
    it runs while the stage waits in the cool-down. Exact: the step optimum
    caps the slowest stage at one of the stage costs between the bottleneck
    optimum ``T*`` and ``T* + (fill(T*) - lower bound) / (n_microbatches - 1)``;
    for each such cap a second dynamic program minimises the fill sum.

    Raises `InfeasiblePartitionError` where no split fits."""
    if schedule != "1f1b":
        raise NotImplementedError(
            "partition() searches 1F1B; an interleaved rank's chunks share one budget, "
            "which this dynamic program does not model"
        )
    if objective not in OBJECTIVES:
        raise ValueError(f"objective={objective!r} is not one of {OBJECTIVES}")
    if not 1 <= n_stages <= len(layers):
        raise ValueError(f"n_stages={n_stages} must lie in 1..{len(layers)}")
    start = time.perf_counter()
    budgets = _budgets(budget_per_stage, n_stages)
    counts = stage_counts(schedule, n_stages, n_microbatches)
    even = plan_split(layers, even_split(layers, n_stages), budgets, schedule=schedule,
                      n_microbatches=n_microbatches, method="even")
    n = len(layers)
    total_compute = sum(layer.forward_seconds + layer.backward_seconds for layer in layers)
    if objective == "step" and even.feasible and n_microbatches > 1:
        # No split whose slowest stage exceeds this beats the even split's estimate.
        even_step = (n_microbatches - 1) * even.bottleneck_seconds + sum(st.seconds for st in even.stages)
        limit = (even_step - total_compute) / (n_microbatches - 1)
    else:
        limit = even.bottleneck_seconds if even.feasible else math.inf
    costs = _StageCosts(layers, budgets, counts, limit * (1 + 1e-9))

    def stage_seconds(s: int, i: int, j: int) -> float:
        found = costs.best(s, i, j)
        return math.inf if found is None else costs.compute_seconds(i, j) + found[0]

    def fill_seconds(s: int, i: int, j: int) -> float:
        found = costs.best(s, i, j)
        if found is None:
            return math.inf
        hidden = recompute == "ahead" and s < n_stages - 1
        return costs.compute_seconds(i, j) + (0.0 if hidden else found[0])

    bottleneck, bounds = _min_max(costs, n_stages, stage_seconds)
    if bounds is None:
        raise InfeasiblePartitionError(
            f"no split of {n} layers into {n_stages} stages fits budgets {budgets} "
            f"(in flight per stage: {counts})"
        )
    if objective == "step" and n_microbatches > 1:
        fill_at_optimum, step_bounds = _min_sum_capped(costs, n_stages, stage_seconds, fill_seconds, bottleneck)
        assert step_bounds is not None
        best_value = (n_microbatches - 1) * bottleneck + fill_at_optimum
        bounds = step_bounds
        top = bottleneck + (fill_at_optimum - total_compute) / (n_microbatches - 1)
        caps = sorted({
            value for s in range(n_stages) for i in range(n) for j in range(i + 1, n + 1)
            if bottleneck < (value := stage_seconds(s, i, j)) <= top
        }) if costs.compute_seconds(0, n) > 0 else []
        for cap in caps:
            if (n_microbatches - 1) * cap + total_compute >= best_value:
                break
            fill, found = _min_sum_capped(costs, n_stages, stage_seconds, fill_seconds, cap)
            if found is not None and (n_microbatches - 1) * cap + fill < best_value:
                best_value, bounds = (n_microbatches - 1) * cap + fill, found
    stages = tuple(_stage_plan(costs, s, bounds[s], bounds[s + 1]) for s in range(n_stages))
    return Partition(stages=stages, method="adacc", search_seconds=time.perf_counter() - start)
