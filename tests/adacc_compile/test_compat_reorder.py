"""`compat.reorder_like_autograd` orders a split backward as PyTorch's
``reordering_to_mimic_autograd_engine`` does (it exists only to build a
lazy module), on a recompute-everything plan of the Llama, where every
recomputation is placed by it."""

from __future__ import annotations

from torch._functorch import partitioners
from torch.fx._lazy_graph_module import _LazyGraphModule

from adacc_compile import compat
from adacc_test_utils import build, compile_capturing


def _order(gm):
    return [(n.op, str(n.target), n.name) for n in gm.graph.nodes]


def test_the_backward_is_ordered_as_pytorchs_reordering_orders_it():
    model, batch = build("llama")
    compiled, states = compile_capturing(model, {"planner": "recompute_all"})
    compiled(*batch).backward()
    (state,) = states
    saved = [n for n in state.saved_values if not compat.is_sym_node(n)]
    _, raw_bw = partitioners._extract_fwd_bwd_modules(
        state.joint, saved, saved_sym_nodes=[], num_fwd_outputs=state.num_fwd_outputs,
        static_lifetime_input_nodes=state.info.static_lifetime_input_nodes,
    )
    ours = compat.reorder_like_autograd(raw_bw)
    theirs = partitioners.reordering_to_mimic_autograd_engine(raw_bw)
    assert isinstance(ours, _LazyGraphModule)
    assert _order(ours) == _order(theirs)
    recomputed = {n.name for n in theirs.graph.nodes} & {n.name for n in state.joint.graph.nodes if n in state.info.forward_nodes}
    assert len(recomputed) > 10  # the order of recomputations was really tested
