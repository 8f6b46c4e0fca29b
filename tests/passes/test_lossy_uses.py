"""Values the backward reads in a cancelling term (an attention's output, a
softmax's) are offered lossless codecs only (`passes.lossy_uses`)."""

from __future__ import annotations

import torch

from adacc_compile.kernels import get_codec
from adacc_compile.passes.lossy_uses import AMPLIFYING_USES, amplifying_use
from adacc_examples.models import GPT, GPTConfig, gpt_batch, init_weights
from adacc_test_utils import compile_capturing


def test_every_rule_names_an_aten_op_and_one_of_its_arguments():
    for use in AMPLIFYING_USES:
        op = getattr(torch.ops.aten, use.op).default
        assert use.argument in [a.name for a in op._schema.arguments], use
        assert use.reason


def test_an_attention_output_is_never_offered_a_lossy_codec():
    torch.manual_seed(0)
    model = init_weights(GPT(GPTConfig(n_layer=2, d_model=128, n_head=4, seq_len=128, vocab_size=256, dropout=0.0)))
    batch = gpt_batch(model.cfg, 4, torch.Generator().manual_seed(0))
    compiled, states = compile_capturing(
        model, {"memory_budget": 0.3, "accuracy": "aggressive", "allow_recompute": False, "device_profile": "h100"}
    )
    compiled(*batch).backward()
    (state,) = states
    nodes = {n.name: n for n in state.joint.graph.nodes}
    problem = state.candidates.problem
    lossy = {c.name for c in problem.candidates if any(not get_codec(o.codec).lossless for o in c.compress)}
    attention_outputs = [
        c.name for c in problem.candidates
        if any(str(u.target).startswith("aten._scaled_dot_product") and "backward" in str(u.target)
               and u.args[4] is nodes[c.name] for u in nodes[c.name].users)
    ]
    assert len(attention_outputs) == 2, attention_outputs  # one per layer
    assert not lossy & set(attention_outputs)
    assert lossy  # the rule is not a blanket one: other values still get lossy codecs
    assert all(amplifying_use(nodes[n], state.info.backward_nodes).argument == "out" for n in attention_outputs)
