"""Verify: invariants of a rewritten forward/backward pair.

Runs after the rewrite and raises `PlanVerificationError` listing every
violation, so a planner or rewrite bug is caught at compile time with a
readable message instead of as wrong gradients:

* nothing random or collective is recomputed in the backward (no RNG
  replay here; collectives must run exactly once);
* every value the plan keeps is saved, and nothing it recomputes is saved;
* every ``adacc`` compress output saved by the forward is read by a
  decompress in the backward, and every decompress reads saved payloads;
* no recomputation reads a graph input the forward writes in place (it
  would see the new contents: `mutation`), and none starts from a value
  decompressed by a codec that may not feed one (`Codec.feeds_recompute`).
"""

from __future__ import annotations

import torch.fx as fx

from adacc_compile.kernels import get_codec

from .candidates import CandidateSet
from .compress_rewrite import CODEC_NODE, DECOMPRESSED, CodecNode
from .mutation import mutated_inputs, stale_recomputations
from .op_class import OpClass, classify
from .plan_problem import Decision, PlanSolution


class PlanVerificationError(RuntimeError):
    pass


def verify_split(
    fw_module: fx.GraphModule,
    bw_module: fx.GraphModule,
    *,
    candidates: CandidateSet,
    solution: PlanSolution,
    forward_names: set[str],
    num_fwd_outputs: int,
) -> None:
    errors = []
    fw_out = next(n for n in fw_module.graph.nodes if n.op == "output")
    outputs = list(fw_out.args[0])
    saved_names = {n.name for n in outputs[num_fwd_outputs:] if isinstance(n, fx.Node)}
    bw_inputs = {n.name for n in bw_module.graph.nodes if n.op == "placeholder"}
    for node in bw_module.graph.nodes:
        if node.op != "call_function" or node.name not in forward_names:
            continue
        op_class = classify(node)
        if op_class in (OpClass.RANDOM, OpClass.DROPOUT):
            errors.append(f"random op {node.name} is recomputed in the backward without RNG replay")
        if op_class is OpClass.COLLECTIVE:
            errors.append(f"collective {node.name} is recomputed in the backward")
    for name, choice in solution.choices.items():
        if choice.decision is Decision.RECOMPUTE and name in saved_names:
            errors.append(f"{name} is planned as recompute but saved")
        if choice.decision is Decision.KEEP and name not in saved_names and name in bw_inputs:
            errors.append(f"{name} is planned as keep but not saved")
    errors += _compress_pairs(fw_module, bw_module, saved_names)
    recomputed = lambda node: node.name in forward_names  # noqa: E731
    errors += stale_recomputations(bw_module, mutated_inputs(fw_module), recomputed)
    errors += _lossy_recompute_inputs(bw_module, recomputed)
    if errors:
        raise PlanVerificationError(
            "adacc plan verification failed:\n  " + "\n  ".join(errors)
        )


def _is_adacc_op(node: fx.Node, suffix: str) -> bool:
    name = str(getattr(node.target, "name", lambda: "")())
    return node.op == "call_function" and name.startswith("adacc::") and name.endswith(suffix)


def _codec_role(node: fx.Node) -> str | None:
    """"compress" / "decompress" for a codec's node in either form (a custom
    op, or a node spliced in from its aten graph), else None."""
    tag = node.meta.get(CODEC_NODE)
    if isinstance(tag, CodecNode):
        return tag.role
    if _is_adacc_op(node, "_compress") or _is_adacc_op(node, "_compress.default"):
        return "compress"
    if _is_adacc_op(node, "_decompress") or _is_adacc_op(node, "_decompress.default"):
        return "decompress"
    return None


def _compress_pairs(fw_module: fx.GraphModule, bw_module: fx.GraphModule, saved: set[str]) -> list[str]:
    """Every saved compress output is read by a decompress in the backward,
    and a decompress reads nothing from the forward but saved values.

    Works on both forms: a custom compress op's outputs are its getitem
    users; a spliced aten compress's are its own nodes (the ones saved)."""
    errors = []
    compressed_payloads = set()
    for node in fw_module.graph.nodes:
        if _codec_role(node) == "compress":
            compressed_payloads |= {node.name}
            if not isinstance(node.meta.get(CODEC_NODE), CodecNode):
                compressed_payloads |= {u.name for u in node.users}
    saved_payloads = saved & compressed_payloads
    read_by_decompress = set()
    for node in bw_module.graph.nodes:
        if _codec_role(node) != "decompress":
            continue
        names = {a.name for a in node.all_input_nodes if a.op == "placeholder"}
        read_by_decompress |= names
        if not names <= saved:
            errors.append(f"decompress {node.name} reads values that are not saved payloads: {sorted(names - saved)}")
    for payload in sorted(saved_payloads - read_by_decompress):
        errors.append(f"compressed payload {payload} is saved but never decompressed")
    return errors


def _lossy_recompute_inputs(bw_module: fx.GraphModule, recomputed) -> list[str]:
    errors = []
    for node in bw_module.graph.nodes:
        if node.op != "call_function" or not recomputed(node):
            continue
        for arg in node.all_input_nodes:
            codec = arg.meta.get(DECOMPRESSED)
            if codec is not None and not get_codec(codec).feeds_recompute:
                errors.append(
                    f"{node.name} is recomputed from {arg.name}, decompressed by {codec}, "
                    f"which may not feed a recomputation"
                )
    return errors
