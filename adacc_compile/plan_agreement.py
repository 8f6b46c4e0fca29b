"""Every rank must run the same plan, or collectives deadlock.

The planner is deterministic (same graph + options + cost inputs -> the same
plan, byte for byte: HiGHS with one thread and a fixed seed, everything
ordered by graph order). Two things can still make ranks differ: costs
*measured* on each rank (calibrated device profiles, timed codecs), and
graphs that differ between ranks. So:

* `share_problem`: every rank plans the lowest rank's plan problem (plain
  data: candidates, costs, windows), so measured numbers agree;
* `plan_fingerprint`: a canonical description of the plan (decisions,
  window placement, the fw/bw node order) and its SHA-256, the plan hash;
* `check_agreement`: at compile time each rank publishes its hash in the
  c10d store and reads its group peers' hashes; a mismatch raises at once
  with every rank's hash, a peer that never publishes raises after
  ``timeout_s``. It never hangs, and it runs no collective, so it cannot
  deadlock the process group either.

Only graphs containing collectives are checked, against the ranks of the
groups those collectives use: differing plans elsewhere (e.g. different
pipeline stages) cannot deadlock anything.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any, Iterable, Sequence

import torch.fx as fx

import dataclasses

from adacc_compile import compat_distributed, compat_inductor
from adacc_compile.passes.plan_problem import (
    AuxBound,
    Candidate,
    CommWindow,
    CompressOption,
    Lifetime,
    MemoryModel,
    MemoryRow,
    PlanProblem,
    PlanSolution,
    StepLayout,
)
from adacc_compile.passes.windows import issue_kind

_PREFIX = "adacc"


class PlanMismatchError(RuntimeError):
    """Ranks that share collectives planned differently (or not at all)."""


def collective_groups(gm: fx.GraphModule) -> list[str]:
    """Sorted names of the process groups the graph's collectives use."""
    names = set()
    for node in gm.graph.nodes:
        if issue_kind(node) is not None and node.args:
            names.add(str(node.kwargs.get("group_name", node.args[-1])))
    return sorted(names)


def plan_fingerprint(
    problem: PlanProblem,
    solution: PlanSolution,
    placed: dict[str, str],
    modules: Sequence[fx.GraphModule],
) -> tuple[str, str]:
    """(canonical JSON, its SHA-256 hex digest) of a plan and its graphs."""
    data = {
        "decisions": [
            [c.name, solution.decision(c.name).value, (solution.choices.get(c.name) or _NoCodec).codec]
            for c in problem.candidates
        ],
        "windows": sorted(placed.items()),
        "graphs": [[[n.op, n.name, _target(n)] for n in gm.graph.nodes] for gm in modules],
    }
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return text, hashlib.sha256(text.encode()).hexdigest()


def share_problem(problem: PlanProblem, groups: Iterable[str], timeout_s: float) -> PlanProblem:
    """The lowest rank's copy of ``problem`` when its candidates are the same
    as this rank's (they differ only in measured numbers); else ``problem``
    unchanged (the graphs differ, which the plan-hash check then reports)."""
    ranks = _peer_ranks(groups)
    if len(ranks) < 2:
        return problem
    store, me, lowest = compat_distributed.default_store(), _rank(), ranks[0]
    base = f"{_PREFIX}/problem/{'-'.join(map(str, ranks))}"
    sequence = int(store.add(f"{base}/count/{me}", 1))
    key = f"{base}/{sequence}"
    if me == lowest:
        store.set(key, json.dumps(problem_to_json(problem), sort_keys=True))
        return problem
    wait_for_keys(store, [key], timeout_s, f"rank {lowest}'s plan problem for graph #{sequence}")
    shared = problem_from_json(json.loads(store.get(key).decode()))
    if [(c.name, c.inputs) for c in shared.candidates] != [(c.name, c.inputs) for c in problem.candidates]:
        return problem
    return shared


def problem_to_json(problem: PlanProblem) -> dict[str, Any]:
    return dataclasses.asdict(problem)


def problem_from_json(data: dict[str, Any]) -> PlanProblem:
    """Inverse of `problem_to_json` (JSON lists back to tuples)."""
    candidates = []
    for raw in data["candidates"]:
        fields = {k: _tuples(v) for k, v in raw.items()}
        fields["compress"] = tuple(_thaw(CompressOption, o) for o in raw.get("compress", ()))
        if raw.get("lifetime") is not None:
            fields["lifetime"] = _thaw(Lifetime, raw["lifetime"])
        candidates.append(Candidate(**fields))
    rest = {k: v for k, v in data.items() if k not in ("candidates", "windows", "layout", "memory")}
    layout = _thaw(StepLayout, data["layout"]) if data.get("layout") is not None else None
    memory = None
    if data.get("memory") is not None:
        memory = MemoryModel(
            aux=tuple(tuple(_thaw(AuxBound, b) for b in bounds) for bounds in data["memory"]["aux"]),
            rows=tuple(_thaw(MemoryRow, r) for r in data["memory"]["rows"]),
        )
    return PlanProblem(
        candidates=tuple(candidates),
        windows=tuple(_thaw(CommWindow, w) for w in data.get("windows", ())),
        layout=layout,
        memory=memory,
        **rest,
    )


def _tuples(value: Any) -> Any:
    """JSON lists (nested) back to tuples."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def _thaw(cls: type, raw: dict[str, Any]) -> Any:
    return cls(**{k: _tuples(v) for k, v in raw.items()})


def check_agreement(plan_hash: str, groups: Iterable[str], timeout_s: float) -> tuple[int, ...]:
    """Raises `PlanMismatchError` unless every peer rank reports ``plan_hash``
    for this (n-th checked) graph; returns the ranks compared."""
    groups = sorted(set(groups))
    ranks = _peer_ranks(groups)
    if len(ranks) < 2:
        return tuple(ranks)
    store, me = compat_distributed.default_store(), _rank()
    for group in groups:
        peers = compat_distributed.group_ranks(group)
        if me not in peers or len(peers) < 2:
            continue
        base = f"{_PREFIX}/plan_hash/{group}"
        sequence = int(store.add(f"{base}/count/{me}", 1))
        store.set(f"{base}/{sequence}/{me}", plan_hash)
        keys = {r: f"{base}/{sequence}/{r}" for r in peers if r != me}
        wait_for_keys(store, list(keys.values()), timeout_s, f"the plan hash of graph #{sequence} from ranks {sorted(keys)}")
        hashes = {me: plan_hash, **{r: store.get(k).decode() for r, k in keys.items()}}
        if len(set(hashes.values())) > 1:
            listing = ", ".join(f"rank {r}: {h[:16]}" for r, h in sorted(hashes.items()))
            raise PlanMismatchError(
                f"adacc: ranks of process group {group!r} planned graph #{sequence} differently "
                f"({listing}); their collectives would deadlock. Give every rank the same model, "
                f"inputs and options; device_profile='calibrate'/'auto' is shared from the lowest "
                f"rank, but a solver time limit that expires can still make plans differ "
                f"(raise solver_time_limit_s, or lower solver_node_limit, which stops every rank's "
                f"solve at the same point)"
            )
    return tuple(ranks)


class _NoCodec:
    codec = None


def _target(node: fx.Node) -> str:
    pinned = compat_inductor.pinned_target(node)
    if pinned is not None:
        return f"pinned:{pinned}"
    return str(node.target) if node.op in ("call_function", "get_attr") else ""


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def _peer_ranks(groups: Iterable[str]) -> list[int]:
    if not compat_distributed.dist_ready():
        return []
    ranks: set[int] = set()
    for group in groups:
        ranks.update(compat_distributed.group_ranks(group))
    return sorted(ranks)


def wait_for_keys(store: Any, keys: list[str], timeout_s: float, what: str) -> None:
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except Exception as error:  # DistStoreError / RuntimeError on timeout
        raise PlanMismatchError(
            f"adacc: waited {timeout_s:g} s for {what} without an answer ({error}); the ranks "
            f"are not compiling the same graphs (one failed, compiled a different graph, or was "
            f"served from a compile cache the others missed). Raise plan_check_timeout_s if "
            f"compilation is merely slow on some ranks"
        ) from error
