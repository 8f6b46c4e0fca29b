"""End to end through ``adacc`` (Inductor code generation on CPU).

Budget 0.5 runs by default for every model; the full budget matrix is
marked slow (Inductor's C++ compile takes tens of seconds per graph here).
The gradient tests run with torch's defaults (``torch_defaults``: compile
caches on, Inductor's own random numbers), so the GPT with dropout is
checked against plain Inductor under the same seed, not against eager.
"""

from __future__ import annotations

import pytest
import torch

from adacc_test_utils import INDUCTOR_REL, assert_same, build, compile_with_reports, loss_and_grads


@pytest.mark.torch_defaults
@pytest.mark.parametrize(
    "budget",
    [pytest.param(1.0, marks=pytest.mark.slow), 0.5, pytest.param(0.2, marks=pytest.mark.slow)],
)
@pytest.mark.parametrize(
    "name", ["mlp", "gpt", pytest.param("llama", marks=pytest.mark.slow)]
)
def test_inductor_matches_eager_or_plain_inductor(name, budget):
    """Lossless plans give the reference's loss and gradients: eager's, or,
    for the GPT's dropout (whose masks Inductor draws its own way), plain
    Inductor's under the same seed."""
    model, batch = build(name)
    reference = torch.compile(model) if name == "gpt" else model
    expected = loss_and_grads(model, reference, *batch)
    torch._dynamo.reset()
    compiled, partitioner = compile_with_reports(
        model, "adacc", {"memory_budget": budget, "accuracy": "lossless"}
    )
    actual = loss_and_grads(model, compiled, *batch)
    assert_same(expected, actual, rel=INDUCTOR_REL)
    summary = partitioner.reports[-1]["summary"]
    if summary["activation_peak_fits_budget"]:  # else: lowest-peak plan, see test_backend_eager
        assert summary["planned_saved_bytes"] <= summary["budget_bytes"]


def test_fx_graph_cache_hits_for_same_options_and_misses_for_another_budget():
    """Inductor's FX graph cache on: the same options hit (the partitioner's
    uuid is stable), another budget misses (the uuid hashes the config)."""
    import torch
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache

    model, batch = build("mlp")
    seen = {}
    with fresh_cache(), inductor_config.patch(fx_graph_cache=True):
        for label, budget in (("first", 0.5), ("same", 0.5), ("other", 0.3)):
            torch._dynamo.reset()
            counters.clear()
            compiled, _ = compile_with_reports(model, "adacc", {"memory_budget": budget})
            loss_and_grads(model, compiled, *batch)
            seen[label] = (counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"])
    assert seen["first"] == (0, 2), seen  # forward and backward compiled
    assert seen["same"] == (2, 0), seen
    assert seen["other"][1] == 2, seen


def _torch_min_cut_saved_bytes(gm, kwargs) -> int:
    """Bytes PyTorch's min-cut partitioner (Inductor's default) saves for a
    copy of the joint graph, parameters and buffers excluded."""
    import copy

    import torch
    from torch._functorch.partitioners import _size_of, min_cut_rematerialization_partition

    joint = copy.deepcopy(gm)
    static = set(kwargs.get("static_lifetime_input_indices") or [])
    primals = [n.name for n in joint.graph.nodes if n.op == "placeholder" and "tangents" not in n.name]
    static_names = {name for i, name in enumerate(primals) if i in static}
    fw, _ = min_cut_rematerialization_partition(joint, None, **kwargs)
    outputs = next(n for n in fw.graph.nodes if n.op == "output").args[0]
    saved = [n for n in outputs[kwargs["num_fwd_outputs"]:] if n is not None]
    return sum(
        _size_of(n) for n in saved
        if n.name not in static_names and isinstance(n.meta.get("val"), torch.Tensor)
    )


@pytest.mark.parametrize(
    "name", [pytest.param("gpt", marks=pytest.mark.slow), pytest.param("llama", marks=pytest.mark.slow),
             pytest.param("bert", marks=pytest.mark.slow)]  # 20-37 s each
)
def test_budget_one_saves_no_more_than_inductors_default(name, monkeypatch):
    """memory_budget=1.0 under Inductor: the bytes adacc saves are at most
    what PyTorch's min-cut partitioner saves for the joint graph adacc
    plans (after its clean-ups and dropout replay, which change the min
    cut's choice a little), within 2% of what it saves for the graph as
    AOTAutograd hands it over (run on a copy), and its simulated activation
    peak at most the default plan's."""
    import torch
    from torch._functorch.partitioners import _size_of

    from adacc_compile import compat
    from adacc_compile.config import AdaccConfig
    from adacc_compile.partitioner import AdaccPartitioner
    from adacc_test_utils import build_bert

    model, batch = build_bert() if name == "bert" else build(name)
    torch_saved, planned_graph_saved = [], []

    class Recording(AdaccPartitioner):
        def __call__(self, gm, joint_inputs, **kwargs):
            torch_saved.append(_torch_min_cut_saved_bytes(gm, kwargs))
            return super().__call__(gm, joint_inputs, **kwargs)

    min_cut = compat.default_saved_values

    def recording_min_cut(joint, info, memory_budget=1.0):
        saved = min_cut(joint, info, memory_budget)
        static = set(info.static_lifetime_input_nodes)
        planned_graph_saved.append(sum(
            _size_of(n) for n in saved if n not in static and isinstance(n.meta.get("val"), torch.Tensor)
        ))
        return saved

    monkeypatch.setattr(compat, "default_saved_values", recording_min_cut)
    partitioner = Recording(AdaccConfig.from_options({"memory_budget": 1.0}))
    compiled = torch.compile(model, backend=partitioner.backend())
    expected = loss_and_grads(model, model, *batch)
    assert_same(expected, loss_and_grads(model, compiled, *batch), rel=INDUCTOR_REL)
    summary = partitioner.reports[-1]["summary"]
    planned = summary["planned_saved_bytes"]
    assert planned <= planned_graph_saved[-1], (planned, planned_graph_saved[-1])
    assert planned <= 1.02 * torch_saved[-1], (planned, torch_saved[-1])
    assert summary["predicted_activation_peak_bytes"] <= summary["default_activation_peak_bytes"]
