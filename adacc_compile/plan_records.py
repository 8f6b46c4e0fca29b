"""`adacc_compile.plans(model)`: what adacc decided for each graph of a
model, with no option to set (``dump_dir`` and ``adapt`` not needed).

The partitioner records each training graph it plans against the real
tensors Dynamo handed it (the model's parameters among them), weakly, so a
record neither keeps a model alive nor matches another model that reuses a
freed parameter's address. A graph planned again (a step budget's re-plan
for room, an adaptive re-plan) replaces its record. Every compile plans,
torch's compile caches on or off (`compat_inductor.inductor_compile`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphPlan:
    """One graph's plan, from its summary (`report.summarize`)."""

    graph_index: int
    budget_bytes: int
    budget_scope: str
    predicted_peak_bytes: int
    """The whole simulated step (activations, gradients, temporaries)."""
    predicted_activation_peak_bytes: int
    measured_peak_bytes: int | None
    """The first step's measured peak (`adacc_compile.step_measure`, under a
    step budget), once that step's backward ran; else None."""
    fits_budget: bool
    decisions: dict[str, int]
    """Decision -> how many values got it."""
    codecs: dict[str, int]
    plan_hash: str
    planning_seconds: float
    notes: tuple[str, ...]
    summary: dict[str, Any]
    """The whole summary, as ``summary.json`` has it."""

    @classmethod
    def from_summary(cls, summary: dict[str, Any]) -> "GraphPlan":
        return cls(
            graph_index=summary["graph_index"],
            budget_bytes=summary["budget_bytes"],
            budget_scope=summary["budget_scope"],
            predicted_peak_bytes=summary["predicted_peak_bytes"],
            predicted_activation_peak_bytes=summary["predicted_activation_peak_bytes"],
            measured_peak_bytes=summary.get("measured_step_peak_bytes"),
            fits_budget=summary["fits_budget"],
            decisions=dict(summary["decisions"]),
            codecs=dict(summary["codecs"]),
            plan_hash=summary.get("plan_hash", ""),
            planning_seconds=(summary.get("planning") or {}).get("seconds", 0.0),
            notes=tuple(summary.get("notes", ())),
            summary=summary,
        )


_RECORDS: dict[tuple[int, int], tuple[tuple[weakref.ref, ...], GraphPlan]] = {}
"""(partitioner id, graph index) -> (the graph's parameters, weakly; its plan)."""


def record(owner: object, inputs: Sequence[Any], summary: dict[str, Any]) -> None:
    """Records ``summary`` for the graph whose real inputs were ``inputs``."""
    params = tuple(weakref.ref(t) for t in inputs if isinstance(t, torch.nn.Parameter))
    _RECORDS[(id(owner), summary["graph_index"])] = (params, GraphPlan.from_summary(summary))


def refresh(owner: object, graph_index: int, summary: dict[str, Any]) -> None:
    """Graph ``graph_index``'s record made again from ``summary`` (updated
    in place since: a measured step peak)."""
    key = (id(owner), graph_index)
    if key in _RECORDS:
        _RECORDS[key] = (_RECORDS[key][0], GraphPlan.from_summary(summary))


def plans(model: torch.nn.Module) -> list[GraphPlan]:
    """One record per graph adacc planned in this process that runs
    ``model``'s parameters (the module or its ``torch.compile`` wrapper),
    in graph order; empty before the first step."""
    mine = {id(p) for p in model.parameters()}
    found = []
    for refs, plan in _RECORDS.values():
        alive = [r() for r in refs]
        if any(t is not None and id(t) in mine for t in alive):
            found.append(plan)
    return sorted(found, key=lambda p: p.graph_index)
