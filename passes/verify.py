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
from .compress_rewrite import DECOMPRESSED
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


def _compress_pairs(fw_module: fx.GraphModule, bw_module: fx.GraphModule, saved: set[str]) -> list[str]:
    errors = []
    compressed_payloads = set()
    for node in fw_module.graph.nodes:
        if _is_adacc_op(node, "_compress") or _is_adacc_op(node, "_compress.default"):
            compressed_payloads |= {u.name for u in node.users} | {node.name}
    saved_payloads = saved & compressed_payloads
    read_by_decompress = set()
    for node in bw_module.graph.nodes:
        if _is_adacc_op(node, "_decompress") or _is_adacc_op(node, "_decompress.default"):
            names = {a.name for a in node.all_input_nodes}
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
