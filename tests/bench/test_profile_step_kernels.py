"""`bench/profile_step_kernels.py`: profiler events sorted into matmul,
generated kernels and the rest, and the tables built from them; plus one
real profile of a tiny compiled step, so the event names it sorts are the
ones this torch emits."""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "bench"))

from profile_step_kernels import group_of, grouped_seconds, groups_table, top_kernels_table  # noqa: E402

from adacc_examples.benchmarking import Variant, VariantResult, run_variants  # noqa: E402


def test_events_are_grouped_by_name():
    assert group_of("aten::mm") == "matmul"
    assert group_of("aten::addmm") == "matmul"
    assert group_of("graph_0_cpp_fused_abs_amax_div_0") == "generated"
    assert group_of("Optimizer.step#SGD.step") == "other"
    g = grouped_seconds({"aten::mm": 0.002, "cpp_fused_x_1": 0.001, "aten::copy_": 0.0005})
    assert g == pytest.approx({"matmul": 0.002, "generated": 0.001, "other": 0.0005, "total": 0.0035})


def test_tables_show_each_plan_against_the_first():
    a = VariantResult(name="a", kernel_seconds={"aten::mm": 0.010, "cpp_fused_k_0": 0.002}, estimated_added_seconds=0.004)
    b = VariantResult(name="b", kernel_seconds={"aten::mm": 0.008, "cpp_fused_k_0": 0.005})
    text = groups_table([a, b])
    assert "| a | 10.0 | 2.0 | 0.0 | 12.0 | +0.0 | 4.0 |" in text
    assert "| b | 8.0 | 5.0 | 0.0 | 13.0 | +1.0 |  |" in text
    top = top_kernels_table(b, top=1)
    assert "`aten::mm`" in top and "cpp_fused_k_0" not in top


def test_a_compiled_step_shows_its_generated_kernels_and_matmuls():
    import torch._inductor.config as inductor_config

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.gelu(self.lin(x)).pow(2).mean()

    torch.manual_seed(0)
    with inductor_config.patch({"cpp.enable_kernel_profile": True}):
        (result,) = run_variants(
            Tiny(), [(torch.randn(8, 16),)] * 2, [Variant(name="inductor", kind="inductor")],
            timing_repeats=1, kernel_profile_steps=2,
        )
    groups = grouped_seconds(result.kernel_seconds)
    assert groups["generated"] > 0 and groups["matmul"] > 0


def _tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU())


def test_keep_going_records_a_failing_variant_and_measures_the_rest():
    import contextlib

    from adacc_examples.benchmarking import results_table

    entered = []

    @contextlib.contextmanager
    def measuring():
        entered.append(True)
        yield

    # Fails when it compiles: a 1-byte budget that must be met.
    bad = Variant(name="bad", kind="adacc", options={"memory_budget": "1B", "on_infeasible": "error"})
    batches = [(torch.randn(8, 16),)] * 2
    loss = lambda model: lambda x: model(x).pow(2).mean()  # noqa: E731

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = _tiny_model()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return loss(self.net)(x)

    good, failed = run_variants(
        Model(), batches, [Variant(name="inductor", kind="inductor"), bad],
        timing_repeats=2, keep_going=True, measuring=measuring,
    )
    assert good.error is None and len(good.step_seconds) == 2 and good.peak_bytes >= 0
    assert "below the reachable minimum" in failed.error and not failed.step_seconds
    assert entered == [True]
    assert "| bad | failed: " in results_table([good, failed])
    with pytest.raises(Exception, match="below the reachable minimum"):
        run_variants(Model(), batches, [bad], timing_repeats=1)
