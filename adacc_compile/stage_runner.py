"""The partitioner's stages in order over one joint graph, and their runner
(not pipeline parallelism: that is `adacc_compile.pipelining`).

    prepare     PyTorch's own joint-graph clean-ups (dead code, must-save tags)
    classify    which nodes are forward and which backward
    annotate    bytes, FLOPs, runtime, op class, layer per node
    candidates  the plan problem: forward values the backward may need,
                their options, costs and lifetimes in the step
    calibrate   codecs measured on the real activations of the compiled batch
    windows     backward communication windows and what may hide in them
    structure   identical blocks folded into one (Lynx HEU); the memory model
    budget      the budget in bytes, anchored at PyTorch's default partitioner
    plan        the policy (MILP) decides one block class under the budget;
                the plan over every block split and simulated; re-solved
                until the simulated peak meets the budget
    schedule    recomputation moved into its windows, order pinned
    placed      the backward's recomputations and decompressions tagged, so
                Inductor fuses them only with their neighbours
    verify      invariants of the fw/bw split, on the graphs Inductor receives
    agree       plan hash, checked across ranks when distributed
    report      summary, plan table, dumps, structured logs

Each stage (`adacc_compile.stages`, `adacc_compile.overlap`) is a plain
function ``stage(state) -> None`` over `PartitionState`; the runner times
every stage, lints the graphs the plan produced, and lets callers skip
optional stages by name.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from typing import Callable, Iterator

from adacc_compile import compat, stages
from adacc_compile.overlap import agree_stage, schedule_stage, windows_stage
from adacc_compile.passes.plan_timing import recording
from adacc_compile.state import PartitionState

log = logging.getLogger(__name__)

OPTIONAL_STAGES = frozenset({"calibrate", "verify", "report"})

STAGES: tuple[tuple[str, Callable[[PartitionState], None]], ...] = (
    ("prepare", stages.prepare),
    ("classify", stages.classify),
    ("annotate", stages.annotate_stage),
    ("candidates", stages.candidates_stage),
    ("calibrate", stages.calibrate_stage),
    ("windows", windows_stage),
    ("structure", stages.structure_stage),
    ("budget", stages.budget_stage),
    ("plan", stages.plan_stage),
    ("schedule", schedule_stage),
    ("placed", stages.placed_stage),
    ("verify", stages.verify_stage),
    ("agree", agree_stage),
    ("report", stages.report_stage),
)


def run_pipeline(
    state: PartitionState,
    skip: frozenset[str] = frozenset(),
    *,
    after: str | None = None,
    until: str | None = None,
) -> PartitionState:
    """Runs `STAGES` in order; only `OPTIONAL_STAGES` may be skipped.
    ``after``/``until`` run a contiguous part (the stages after ``after``, up
    to and including ``until``), so a caller can do other work on the state
    between two parts (`plan_preview` simulates the baselines while the plan
    is solved)."""
    bad = skip - OPTIONAL_STAGES
    if bad:
        raise ValueError(f"cannot skip stage(s) {sorted(bad)}; optional: {sorted(OPTIONAL_STAGES)}")
    names = [name for name, _ in STAGES]
    for bound in (after, until):
        if bound is not None and bound not in names:
            raise ValueError(f"no stage {bound!r}; stages: {names}")
    first = names.index(after) + 1 if after is not None else 0
    last = names.index(until) if until is not None else len(names) - 1
    with compat.lazy_graph_modules(), cyclic_gc_paused(), recording(state.plan_timing):
        for name, stage in STAGES[first:last + 1]:
            if name in skip:
                continue
            start = time.perf_counter()
            stage(state)
            state.stage_seconds[name] = time.perf_counter() - start
            for gm in (state.fw_module, state.bw_module) if name == "plan" else ():
                assert gm is not None
                gm.graph.lint()
            log.debug("adacc stage %s took %.3f s", name, state.stage_seconds[name])
    return state


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while the stages run (restored
    after, as it was). FX graphs are reference cycles by the thousand, so
    the collector's full passes kept stopping a 32-layer plan: 7.4 s with
    it, 5.7 s without (median of 3, bench_llm_scale's small Llama). What
    the stages leave behind is collected at the collector's next pass."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
