"""Structure: find identical repeated blocks and plan one for all (Lynx HEU).

Reads: the `PlanProblem` (candidates carry their block id, e.g. "blocks.3")
and the candidate nodes (for op names). Writes nothing on the graph.

Blocks are grouped by a Weisfeiler–Lehman hash (networkx) of their candidate
subgraph, labelled by op, shape, dtype and legal options, then confirmed by
exact comparison of the labelled, position-indexed subgraphs. For each class
of identical blocks the *reduced* problem has one candidate per position,
whose bytes and seconds are the sums over the class's blocks, so the budget
constraint and the objective stay exact for every plan that treats identical
blocks identically. Dependencies of all members are mapped onto the
representatives (conservative where members differ, e.g. the first block
reads the embedding while the others read the previous block). A value that
depends on the same position of the previous block (the residual stream)
would depend on itself in the reduced problem; it is not offered recompute
there (conservative, and such values are cheap to keep relative to the chain
of recomputations they would otherwise need).

The reduced problem is solved by the unchanged MILP; `expand` copies each
representative's decision to its members.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import defaultdict
from dataclasses import dataclass

import networkx as nx
import torch.fx as fx

from .annotate import annotation
from .plan_problem import Candidate, PlanProblem, PlanSolution


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockReduction:
    problem: PlanProblem
    """The problem to solve (reduced, or the original when nothing repeats)."""
    members: dict[str, tuple[str, ...]]
    """Representative candidate -> every candidate it stands for (itself too)."""
    classes: tuple[tuple[str, ...], ...]
    """Block ids grouped by identical structure (classes of two or more)."""
    full_candidates: int
    apart: tuple[str, ...] = ()
    """Blocks of a class that decide on their own (`first_differentiated_apart`)."""
    differing: dict[str, str] = dataclasses.field(default_factory=dict)
    """Block of a class's family that is in no class -> how it differs from
    the class's representative (`differing_blocks`), for the summary."""

    @property
    def used(self) -> bool:
        return bool(self.classes)

    @property
    def rep_of(self) -> dict[str, str]:
        """Folded candidate -> the representative whose decision it shares."""
        return {m: rep for rep, ms in self.members.items() for m in ms if m != rep}

    def expand(self, solution: PlanSolution) -> PlanSolution:
        if not self.used:
            return solution
        choices = {}
        for rep, choice in solution.choices.items():
            for member in self.members.get(rep, (rep,)):
                choices[member] = choice
        return dataclasses.replace(solution, choices=choices)

    def summary(self) -> dict[str, object]:
        return {
            "used": self.used,
            "classes": len(self.classes),
            "blocks": sum(len(c) for c in self.classes),
            "candidates_full": self.full_candidates,
            "candidates_solved": len(self.problem.candidates),
            "deciding_apart": list(self.apart),
            "differing_blocks": dict(self.differing),
        }


def no_reduction(problem: PlanProblem) -> BlockReduction:
    return BlockReduction(
        problem=problem,
        members={c.name: (c.name,) for c in problem.candidates},
        classes=(),
        full_candidates=len(problem.candidates),
    )


def candidates_by_block(problem: PlanProblem) -> dict[str, list[Candidate]]:
    """Block id -> its candidates, in the problem's order (values outside
    blocks left out)."""
    blocks: dict[str, list[Candidate]] = defaultdict(list)
    for cand in problem.candidates:
        if cand.block:
            blocks[cand.block].append(cand)
    return blocks


def block_classes(problem: PlanProblem, nodes: dict[str, fx.Node]) -> tuple[tuple[str, ...], ...]:
    """Classes (two or more) of identical blocks. Each class starts with the
    block that comes last in the forward: the first the backward
    differentiates, while every other block still holds its saved values,
    so its positions are where the step's peak lies (`peak_model` models
    them one by one and each other block as a whole)."""
    blocks = candidates_by_block(problem)
    position = {c.name: i for i, c in enumerate(problem.candidates)}
    by_hash: dict[tuple[str, str], list[str]] = defaultdict(list)
    signatures = {}
    for block, cands in blocks.items():
        signature = _signature(cands, nodes)
        signatures[block] = signature
        by_hash[(_family(block), _wl_hash(signature))].append(block)
    classes = []
    for group in by_hash.values():
        # Confirm the hash with an exact comparison; split on mismatch.
        while group:
            first, rest = group[0], group[1:]
            same = [first] + [b for b in rest if signatures[b] == signatures[first]]
            group = [b for b in rest if b not in same]
            if len(same) > 1:
                same.sort(key=lambda b: -position[blocks[b][0].name])
                classes.append(tuple(same))
    return tuple(classes)


def first_differentiated_apart(classes: tuple[tuple[str, ...], ...]) -> tuple[tuple[str, ...], ...]:
    """The classes whose members share one set of decisions: each class of
    three or more blocks without its first member, the block last in the
    forward and first differentiated, which decides on its own.

    That block's saved values are read and freed first, while every other
    block still holds its own, so keeping more of them costs the step's
    peak least; the plan over every block keeps more there (HF Llama, 3
    layers, at a quarter of the way from the reachable minimum to the
    default: 855 KB kept in the last block, 593 KB in each other; one
    shared set of decisions cost 8-12% more recomputation time at two of
    five budgets). Its own decisions add one block's variables, whatever
    the depth. A class of two stays whole."""
    return tuple(cls[1:] if len(cls) >= 3 else cls for cls in classes)


def differing_blocks(
    problem: PlanProblem, nodes: dict[str, fx.Node], classes: tuple[tuple[str, ...], ...]
) -> dict[str, str]:
    """Blocks of a class's family (``model.layers``) left out of every class,
    each with the first difference from the class's representative: a
    model whose first or last block really differs (T5's first block holds
    the relative attention bias) says which of its values do."""
    blocks = candidates_by_block(problem)
    members = {b for cls in classes for b in cls}
    reps = {_family(cls[0]): cls[0] for cls in classes}
    out = {}
    for block, cands in blocks.items():
        rep = reps.get(_family(block))
        if rep is None or block in members:
            continue
        mine, theirs = _signature(cands, nodes), _signature(blocks[rep], nodes)
        if len(mine[0]) != len(theirs[0]):
            out[block] = f"{len(mine[0])} candidate values against {len(theirs[0])} in {rep}"
            continue
        index = next((i for i, (a, b) in enumerate(zip(mine[0], theirs[0])) if a != b), None)
        if index is None:
            out[block] = f"the same values as {rep}, computed from each other differently"
        else:
            out[block] = (
                f"{cands[index].name} ({mine[0][index][0]}, {mine[0][index][1]}) where {rep} has "
                f"{blocks[rep][index].name} ({theirs[0][index][0]}, {theirs[0][index][1]})"
            )
    return out


def protect_block_boundaries(problem: PlanProblem, classes: tuple[tuple[str, ...], ...]) -> PlanProblem:
    """Values that flow from one repeated block to another (the residual
    stream, a block's input) or between a block and the rest of the graph
    are kept or compressed, never recomputed (views aside, which are free).

    This is where full activation checkpointing cuts too, and what keeps a
    recomputation chain inside one block: the peak model then needs no
    more than one block's positions to bound a block's working memory."""
    region = {b: b for cls in classes for b in cls}
    regions = {c.name: region.get(c.block, "") for c in problem.candidates}
    crossing = set()
    for cand in problem.candidates:
        for inp in cand.inputs:
            if inp in regions and regions[inp] != regions[cand.name]:
                crossing.add(inp)
    if not crossing:
        return problem
    return dataclasses.replace(problem, candidates=tuple(
        dataclasses.replace(c, can_recompute=False) if c.name in crossing and not _free(c) else c
        for c in problem.candidates
    ))


def _free(cand: Candidate) -> bool:
    """Recomputing it costs neither time nor memory (a view)."""
    no_bytes = cand.lifetime is None or cand.lifetime.backward_bytes == 0
    return cand.recompute_seconds == 0 and no_bytes


def reduce_identical_blocks(
    problem: PlanProblem, nodes: dict[str, fx.Node], classes: tuple[tuple[str, ...], ...] | None = None
) -> BlockReduction:
    """Builds the reduced problem over ``classes`` (found if not given)."""
    blocks = candidates_by_block(problem)
    if classes is None:
        classes = block_classes(problem, nodes)
    classes = list(classes)
    if not classes:
        return no_reduction(problem)
    rep_of: dict[str, str] = {}
    members: dict[str, list[str]] = defaultdict(list)
    for block_class in classes:
        reps = blocks[block_class[0]]
        for block in block_class:
            for rep, member in zip(reps, blocks[block]):
                rep_of[member.name] = rep.name
                members[rep.name].append(member.name)
    by_name = problem.by_name()
    repeat = problem.repeat
    if repeat is not None and not any(repeat.block in c for c in classes):
        raise ValueError(f"repeated block {repeat.block!r} is in no class of identical blocks")
    # Representative -> the repeated block's member it stands for, once per copy.
    copies: dict[str, list[Candidate]] = {
        rep_of.get(c.name, c.name): [c] * repeat.copies
        for c in problem.candidates if repeat is not None and c.block == repeat.block
    }
    reduced = []
    for cand in problem.candidates:
        if cand.name in rep_of and rep_of[cand.name] != cand.name:
            continue
        if cand.name not in members:
            reduced.append(_remap(cand, [cand], rep_of))
        else:
            group = [by_name[m] for m in members[cand.name]]
            reduced.append(_remap(cand, group + copies.get(cand.name, []), rep_of))
    # The representatives carry the copies' bytes and seconds: the reduced
    # problem is the deep step's, with no repeat of its own.
    return BlockReduction(
        problem=dataclasses.replace(problem, candidates=tuple(reduced), repeat=None),
        members={rep: tuple(ms) for rep, ms in members.items()},
        classes=tuple(classes),
        full_candidates=len(problem.candidates),
    )


def _remap(rep: Candidate, group: list[Candidate], rep_of: dict[str, str]) -> Candidate:
    inputs = []
    for member in group:
        for inp in member.inputs:
            mapped = rep_of.get(inp, inp)
            if mapped not in inputs:
                inputs.append(mapped)
    self_dependent = rep.name in inputs
    inputs = [i for i in inputs if i != rep.name]
    compress = tuple(
        dataclasses.replace(
            option,
            nbytes=sum(next(o.nbytes for o in m.compress if o.codec == option.codec) for m in group),
            seconds=sum(next(o.seconds for o in m.compress if o.codec == option.codec) for m in group),
        )
        for option in rep.compress
    )
    return dataclasses.replace(
        rep,
        keep_bytes=sum(m.keep_bytes for m in group),
        keep_seconds=sum(m.keep_seconds for m in group),
        recompute_seconds=sum(m.recompute_seconds for m in group),
        inputs=tuple(inputs),
        required=any(m.required for m in group),
        can_recompute=rep.can_recompute and not (self_dependent and len(group) > 1),
        compress=compress,
    )


def _family(block: str) -> str:
    """"blocks.3" -> "blocks": only blocks of one container are compared."""
    return block.rsplit(".", 1)[0]


def _signature(cands: list[Candidate], nodes: dict[str, fx.Node]) -> tuple:
    index = {c.name: i for i, c in enumerate(cands)}
    labels = []
    edges = []
    for i, cand in enumerate(cands):
        node = nodes[cand.name]
        val = node.meta.get("val")
        shape = tuple(getattr(val, "shape", ()) or ())
        labels.append(
            (
                annotation(node).op,
                str(shape),
                str(getattr(val, "dtype", "")),
                cand.keep_bytes,
                cand.required,
                cand.can_keep,
                cand.can_recompute,
                tuple((o.codec, o.nbytes) for o in cand.compress),
            )
        )
        for inp in cand.inputs:
            edges.append((index[inp], i) if inp in index else (-1, i))
    return (tuple(labels), tuple(sorted(edges)))


def _wl_hash(signature: tuple) -> str:
    labels, edges = signature
    graph = nx.DiGraph()
    graph.add_node(-1, label="external")
    for i, label in enumerate(labels):
        graph.add_node(i, label=repr(label))
    graph.add_edges_from(edges)
    with warnings.catch_warnings():
        # networkx 3.5 changed its directed-graph hashes and warns on every
        # call; adacc compares hashes within one process only.
        warnings.filterwarnings("ignore", message="The hashes produced for directed graphs changed")
        return nx.weisfeiler_lehman_graph_hash(graph, node_attr="label", iterations=3)
