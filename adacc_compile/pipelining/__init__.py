"""Pipeline parallelism with adacc: recompute-aware stage partitioning, a
schedule simulator for step-time prediction, and recomputation ahead of
the gradient receive on real `torch.distributed` stages.

* `layer_cost`: per-layer forward/backward/recompute seconds and saved
  bytes at a few plan levels, from adacc's own passes on a fake-traced layer;
* `schedules`: 1F1B and interleaved 1F1B as action lists; in-flight counts;
* `partition`: exact split points and per-layer plans under per-stage budgets;
* `simulate` / `predict`: step time of a schedule, recompute on demand or ahead;
* `backward_split` / `recompute_ahead`: a stage's backward split into a
  gradient-independent prologue (capped in bytes) and the rest, and the
  ``torch.compile`` backend that runs the prologue while the gradient is
  still on its way;
* `one_f_one_b`: a 1F1B loop over point-to-point sends with that hook
  between posting the gradient receive and waiting on it;

``torch.distributed.pipelining`` (PipelineStage with Schedule1F1B or
ScheduleInterleaved1F1B) runs stages compiled by adacc as they are; the
tests use it as the reference.
"""

from .layer_cost import CostOptions, LayerCost, PlanLevel, fuse, layer_cost
from .partition import (
    InfeasiblePartitionError, Partition, StagePlan, balanced_split, even_split, partition, plan_split,
)
from .predict import Prediction, best_by_simulation, compare_partitions, p2p_seconds, predict_step
from .schedules import in_flight, in_flight_1f1b, rank_actions
from .simulate import StageTimes, simulate

__all__ = [
    "CostOptions", "InfeasiblePartitionError", "LayerCost", "Partition", "PlanLevel", "Prediction", "StagePlan",
    "StageTimes", "balanced_split", "best_by_simulation", "compare_partitions", "even_split", "fuse", "in_flight", "in_flight_1f1b", "layer_cost", "p2p_seconds", "partition",
    "plan_split", "predict_step", "rank_actions", "simulate",
]
