"""Rewrite: turn decisions into a forward and a backward graph.

Reads: the plan (`PlanSolution`) and the candidate map. Writes: new forward
and backward GraphModules (the joint graph is not modified).

Kept values become saved outputs of the forward; compressed values too,
until `compress_rewrite.apply_compression` swaps them for their payloads. Recomputed values are
simply *not* saved: PyTorch's extractor (behind `adacc_compile.compat`)
then copies their producers into the backward, and the autograd-order
reordering places each recomputation right before its first use. Graph
inputs and symbolic sizes are offered as saved values too (they cost no
activation memory); the extractor drops those the backward does not read.
"""

from __future__ import annotations

import torch.fx as fx

from adacc_compile import compat

from .candidates import CandidateSet
from .plan_problem import Decision, PlanSolution


def saved_values_for(
    gm: fx.GraphModule, info: compat.JointGraphInfo, candidates: CandidateSet, solution: PlanSolution
) -> list[fx.Node]:
    """The forward nodes to save, in graph order."""
    kept = {
        candidates.nodes[name]
        for name, choice in solution.choices.items()
        if choice.decision in (Decision.KEEP, Decision.COMPRESS)
    }
    saved = []
    for node in gm.graph.nodes:
        if node in kept:
            saved.append(node)
        elif node.op == "placeholder" and compat.is_primal(node) and node in info.forward_nodes:
            saved.append(node)
        elif compat.is_sym_node(node) and node in info.forward_nodes:
            saved.append(node)
    return saved


def split_joint_graph(
    gm: fx.GraphModule,
    info: compat.JointGraphInfo,
    saved_values: list[fx.Node],
    *,
    num_fwd_outputs: int,
) -> tuple[fx.GraphModule, fx.GraphModule]:
    return compat.extract_forward_backward(
        gm,
        list(saved_values),
        num_fwd_outputs=num_fwd_outputs,
        static_lifetime_input_nodes=info.static_lifetime_input_nodes,
    )
