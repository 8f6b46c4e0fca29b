"""Adaptive re-planning: the plan follows the activations as training
changes them (``options={"adapt": True}``).

Why: a plan is made on the batch the graph is compiled for, at step 0.
Training moves the activations (outlier channels appear and grow, ranges
shift), and a codec that was within its declared bound then may drift past
it. `AdaptiveGraph` is what the backend returns for a planned training graph
when ``adapt`` is on. It calls the compiled graph as before and, at the step
boundary (the start of a call, when the previous step's backward and
optimizer step are done), every `AdaccConfig.adapt_every`-th call:

1. measures the plan's lossy compressed values on that call's real inputs
   (`monitor.ActivationMonitor`: the same statistics as calibration);
2. tests them against the plan's calibration (`passes.drift`: error above
   the codec's bound, more outlier channels than the payload holds exactly,
   each over `adapt_patience` consecutive checks);
3. on drift in values whose codecs hold calibrated parameters (fp8's
   scale, int8_smooth's channel factors), first tries new parameters
   measured on this call's inputs: if every compressed value is within its
   bounds with them, they are copied into the compiled graph's constants
   and nothing recompiles (`recalibration`; single-process runs);
4. otherwise, on drift, or when `replan` asked for one, re-plans: the same
   Dynamo graph goes through AOTAutograd and the whole pipeline again,
   calibrated on this call's inputs (the current weights and batch), so the
   MILP sees the new statistics; the new compiled graph runs from this call
   on.

Each re-plan other than a recalibration is exactly one recompile, of this
graph only: the controller swaps what it calls, so Dynamo's guards and
other graphs are untouched and Dynamo itself does not recompile. Steps already in flight keep their own
backward (AOTAutograd's autograd node holds it). At most
`AdaccConfig.adapt_max_replans` re-plans per graph; then drift is logged,
not acted on. Training state is untouched: the monitor runs under no_grad
with the RNG state restored.

History: `current_plan`, `plan_history` (one `PlanVersion` per plan: step,
trigger, what changed), the re-plans in ``TORCH_LOGS=adacc_compile``, and
with ``dump_dir`` one folder per version (``graph_NNN/`` is version 0,
``graph_NNN/plan_vK/`` version K, ``graph_NNN/adaptation.json`` the history
and every check).

Distributed runs: rank 0 calibrates for every rank (`rank_zero`), each rank
monitors its own batch, and rank 0's verdict at each check is every rank's,
so all ranks re-plan at the same step, each calibrated on rank 0's batch of
that step: the plans agree (the plan hash check, ``agree``, confirms it
where graphs hold collectives). A `replan` must be called on every rank.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
import torch.fx as fx

from adacc_compile import rank_zero
from adacc_compile.monitor import ActivationMonitor
from adacc_compile.passes.drift import DriftDetector, DriftRule, ValueObservation
from adacc_compile.recalibration import Recalibration, live_parameters, recalibrate, swap_in
from adacc_compile.step_ledger import LEDGER

if TYPE_CHECKING:
    from adacc_compile.partitioner import AdaccPartitioner
    from adacc_compile.state import PartitionState

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanVersion:
    """One plan a graph ran with."""

    version: int
    step: int
    """The call of the graph from which this plan ran (1 = the first)."""
    trigger: str
    """"compile", "drift" or "request: <reason>"."""
    reasons: tuple[str, ...] = ()
    """The drifts (or the request) that caused it."""
    changed: dict[str, str] = field(default_factory=dict)
    """Value -> "old -> new" decision, for values whose decision changed."""
    summary: dict[str, Any] = field(default_factory=dict)
    plan: list[dict[str, Any]] = field(default_factory=list)
    dump_folder: str | None = None
    recompiled: bool = True
    """False for a recalibration: the same plan with new codec parameters
    swapped into the compiled graph (`recalibration`)."""

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("plan")
        out["summary"] = {k: self.summary.get(k) for k in (
            "plan_hash", "planned_saved_bytes", "predicted_peak_bytes", "solver_status", "codecs", "decisions")}
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckRecord:
    """One monitoring check: what was measured, what drifted."""

    step: int
    plan_version: int
    seconds: float
    values: dict[str, dict[str, Any]]
    """Value -> codec, error, bound, abs_max, outliers, churn."""
    drifts: tuple[str, ...] = ()
    action: str = ""
    """"replan", "recalibrate" (new codec parameters, no recompile),
    "capped" (drift, but no re-plans left) or ""."""


class AdaptiveGraph:
    """A compiled training graph whose plan may be replaced between steps."""

    def __init__(
        self,
        *,
        partitioner: "AdaccPartitioner",
        graph: fx.GraphModule,
        eager: bool,
        graph_index: int,
        compiled: Callable[..., Any],
        state: "PartitionState",
        inputs: Sequence[Any] = (),
    ) -> None:
        self.partitioner = partitioner
        self.graph = graph
        """The graph Dynamo handed the backend: re-planning compiles it again."""
        self.eager = eager
        self.graph_index = graph_index
        self.config = partitioner.config
        self.compiled = compiled
        self.calls = 0
        self.compiles = 1
        """Times this graph was planned and compiled (1 + re-plans)."""
        self.requested: str | None = None
        self.capped_logged = False
        self.rule = DriftRule(patience=self.config.adapt_patience)
        self.versions: list[PlanVersion] = []
        self.checks: list[CheckRecord] = []
        self._params = [weakref.ref(a) for a in inputs if isinstance(a, torch.nn.Parameter)]
        self._adopt(state, step=1, trigger="compile", reasons=())
        _LIVE.add(self)

    # -- running -------------------------------------------------------------

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if self.requested is None and LEDGER.needs_room(self.graph_index):
            LEDGER.settle(self.graph_index)  # asked once
            self.requested = "a later graph of the step needs room under the step budget (step_ledger)"
        if self.requested is not None:
            reason, self.requested = self.requested, None
            self._replan(args, trigger=f"request: {reason}", reasons=(reason,))
        elif self.monitor is not None and self.calls % self.config.adapt_every == 0:
            self._check(args)
        return self.compiled(*args)

    def request(self, reason: str) -> None:
        """Re-plan at the next call (the next step boundary)."""
        self.requested = reason

    def owns(self, params: set[int]) -> bool:
        return any((p := ref()) is not None and id(p) in params for ref in self._params)

    @property
    def replans(self) -> int:
        return len(self.versions) - 1

    @property
    def current(self) -> PlanVersion:
        return self.versions[-1]

    # -- checking and re-planning --------------------------------------------

    def _check(self, args: tuple[Any, ...]) -> None:
        assert self.monitor is not None and self.detector is not None
        start, version = time.perf_counter(), self.current.version
        observations = self.monitor.observe(args)
        drifts = self.detector.check(observations)
        distributed = rank_zero.distributed()
        if distributed:  # rank 0's verdict: every rank re-plans at the same step
            drifts = rank_zero.from_rank_zero("drift", lambda: drifts, self.config.plan_check_timeout_s)
        reasons = tuple(d.describe() for d in drifts)
        action, refused = "", ""
        if drifts:
            action = "replan" if self.replans < self.config.adapt_max_replans else "capped"
        if action == "replan" and self.live and not distributed:  # ranks re-plan on rank 0's batch instead
            recalibration = recalibrate(self.monitor, self.live, drifts, args, self.rule)
            refused = recalibration.refused
            if not refused:
                action = "recalibrate"
                self._recalibrate(recalibration, reasons=reasons)
        self.checks.append(CheckRecord(
            step=self.calls, plan_version=version, seconds=time.perf_counter() - start,
            values=self._measured(observations), drifts=reasons, action=action,
        ))
        if action == "replan":
            if refused:
                log.info("adacc graph %d: drift at step %d needs a re-plan: %s", self.graph_index, self.calls, refused)
            self._replan(args, trigger="drift", reasons=reasons)
        elif action == "capped" and not self.capped_logged:
            self.capped_logged = True
            log.warning(
                "adacc graph %d: activations drifted at step %d (%s) but the %d re-plan(s) allowed "
                "(adapt_max_replans) are used", self.graph_index, self.calls, drifts[0].describe(),
                self.config.adapt_max_replans,
            )
        self._write_history()

    def _recalibrate(self, recalibration: Recalibration, *, reasons: tuple[str, ...]) -> None:
        """Swaps the new parameters in (`recalibration.swap_in`) and records
        a plan version that did not recompile; the drift tests compare with
        what was measured with the new parameters from now on, and a value
        that was failing without having drifted keeps its count."""
        assert self.monitor is not None
        swap_in(recalibration, self.live, self.monitor)
        for obs in recalibration.observations:
            ref = self.monitor.references[obs.value]
            self.monitor.references[obs.value] = dataclasses.replace(
                ref, error=obs.error, abs_max=obs.abs_max, outlier_channels=obs.outlier_channels
            )
        assert self.detector is not None  # reads the same references; recalibrated values start afresh
        self.detector.streak = {k: n for k, n in self.detector.streak.items() if k[0] not in recalibration.parameters}
        previous = self.current
        self.versions.append(PlanVersion(
            version=len(self.versions), step=self.calls, trigger="drift", reasons=reasons,
            changed={name: "parameters recalibrated" for name in recalibration.parameters},
            summary=previous.summary, plan=previous.plan, dump_folder=previous.dump_folder, recompiled=False,
        ))
        log.info("adacc graph %d: recalibrated %d codec parameter set(s) at step %d without recompiling (%s)",
                 self.graph_index, len(recalibration.parameters), self.calls, "; ".join(reasons[:3]))

    def _measured(self, observations: list[ValueObservation]) -> dict[str, dict[str, Any]]:
        out = {}
        for obs in observations:
            ref = self.monitor.references[obs.value] if self.monitor else None
            if ref is None:
                continue
            out[obs.value] = {
                "codec": obs.codec, "error": obs.error, "bound": ref.bound, "abs_max": obs.abs_max,
                "outliers": len(obs.outlier_channels), "outlier_limit": self.rule.outlier_limit(ref),
                "churn": obs.churn(ref),
            }
        return out

    def _replan(self, args: tuple[Any, ...], *, trigger: str, reasons: tuple[str, ...]) -> None:
        if self.replans >= self.config.adapt_max_replans:
            log.warning("adacc graph %d: re-plan (%s) refused: adapt_max_replans=%d reached",
                        self.graph_index, trigger, self.config.adapt_max_replans)
            return
        partitioner = self.partitioner
        version = len(self.versions)
        partitioner.revision = f"adapt:{self.graph_index}:v{version}:{uuid.uuid4().hex}"
        partitioner.start_plan = self._choices
        try:
            compiled, planned = partitioner.plan_and_compile(
                self.graph, list(args), eager=self.eager, graph_index=self.graph_index
            )
            state, partitioner.last_state = partitioner.last_state, None
        finally:
            partitioner.revision = ""
            partitioner.start_plan = None
        self.compiles += 1
        if not planned or state is None:
            log.warning("adacc graph %d: re-plan produced no training graph; keeping plan %d",
                        self.graph_index, self.current.version)
            return
        self.compiled = compiled
        self._adopt(state, step=self.calls, trigger=trigger, reasons=reasons)

    def _adopt(self, state: "PartitionState", *, step: int, trigger: str, reasons: tuple[str, ...]) -> None:
        """Makes ``state``'s plan the current one: version record, monitor,
        fresh hysteresis counters, dumps and log line."""
        self._choices = dict(state.solution.choices) if state.solution is not None else None
        self.monitor = ActivationMonitor.from_state(state)
        self.live = live_parameters(state.fw_module, self.monitor) if self.monitor is not None else {}
        self.detector = DriftDetector(self.monitor.references, self.rule) if self.monitor else None
        records = list(state.report.get("plan", []))
        summary = dict(state.report.get("summary", {}))
        previous = self.versions[-1] if self.versions else None
        version = len(self.versions)
        folder = self._dump_folder(state, version)
        changed = _changed(previous.plan, records) if previous else {}
        self.versions.append(PlanVersion(
            version=version, step=step, trigger=trigger, reasons=reasons, changed=changed,
            summary=summary, plan=records, dump_folder=folder,
        ))
        if folder is not None and version > 0:
            from adacc_compile.report import write_dumps

            os.makedirs(folder, exist_ok=True)
            write_dumps(state, folder, summary, records)
        if version > 0:
            log.info(
                "adacc graph %d: re-plan %d at step %d (%s): %d decision(s) changed%s; saved %s -> %s bytes",
                self.graph_index, version, step, trigger, len(changed),
                f" ({'; '.join(reasons[:3])})" if reasons else "",
                previous.summary.get("planned_saved_bytes") if previous else None,
                summary.get("planned_saved_bytes"),
            )
            self._write_history()
        if self.monitor is None and self.config.adapt:
            log.info("adacc graph %d: plan %d compresses nothing lossy that calibration measured; "
                     "only a requested re-plan can change it", self.graph_index, version)

    def _dump_folder(self, state: "PartitionState", version: int) -> str | None:
        dump_dir = self.config.dump_dir
        if not dump_dir:
            return None
        # Version 0's folder is the one its report was dumped to (`report.publish`).
        base = self.versions[0].dump_folder if self.versions else (state.report or {}).get("dump_folder")
        if base is None:
            return None
        return base if version == 0 else os.path.join(base, f"plan_v{version}")

    def _write_history(self) -> None:
        base = self.versions[0].dump_folder if self.versions else None
        if base is None or not os.path.isdir(base):
            return
        history = {
            "graph_index": self.graph_index,
            "compiles": self.compiles,
            "versions": [v.to_json() for v in self.versions],
            "checks": [dataclasses.asdict(c) for c in self.checks],
        }
        with open(os.path.join(base, "adaptation.json"), "w") as f:
            json.dump(history, f, indent=1, default=str)


def _changed(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> dict[str, str]:
    def label(record: dict[str, Any]) -> str:
        return f"{record['decision']}:{record['codec']}" if record.get("codec") else str(record["decision"])

    before = {r["name"]: label(r) for r in old}
    out = {}
    for record in new:
        was = before.get(record["name"], "absent")
        now = label(record)
        if was != now:
            out[record["name"]] = f"{was} -> {now}"
    return out


_LIVE: "weakref.WeakSet[AdaptiveGraph]" = weakref.WeakSet()
"""Adaptive graphs alive in this process, so that `current_plan(model)` can
find a model's graphs (by its parameters, which are their inputs)."""


def graphs_of(model: torch.nn.Module) -> list[AdaptiveGraph]:
    """The adaptive graphs whose inputs include ``model``'s parameters, in
    compile order. ``model`` may be the module or its ``torch.compile``
    wrapper (both have the same parameters)."""
    params = {id(p) for p in model.parameters()}
    found = sorted((g for g in _LIVE if g.owns(params)), key=lambda g: g.graph_index)
    if not found:
        raise ValueError(
            "no adaptive adacc graph runs this model's parameters: compile it with "
            "options={'adapt': True} and run a step first"
        )
    return found


def current_plan(model: torch.nn.Module, graph: int = 0) -> PlanVersion:
    """The plan the ``graph``-th adaptive graph of ``model`` runs now."""
    return graphs_of(model)[graph].current


def plan_history(model: torch.nn.Module, graph: int = 0) -> list[PlanVersion]:
    """Every plan that graph ran, oldest first (step, trigger, what changed)."""
    return list(graphs_of(model)[graph].versions)


def replan(model: torch.nn.Module, reason: str = "user request") -> int:
    """Asks every adaptive graph of ``model`` to re-plan at its next call
    (the next step boundary), on that call's inputs; returns how many were
    asked. In a distributed run, call it on every rank at the same step."""
    graphs = graphs_of(model)
    for g in graphs:
        g.request(reason)
    return len(graphs)
