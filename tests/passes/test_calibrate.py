"""Codec calibration on real activations: the backend's real inputs
reach the partitioner, every lossy option is measured, options over their
codec's declared bound are dropped, statistics land in the plan, and the run
changes nothing about training (RNG, inputs)."""

from __future__ import annotations

import pytest
import torch

from adacc_compile.kernels import get_codec
from adacc_compile.partitioner import AdaccPartitioner
from adacc_compile.config import AdaccConfig
from adacc_compile.passes import calibrate as calibrate_module
from adacc_compile.passes.calibrate import _input_mismatch, calibrate_candidates
from adacc_test_utils import build, compile_with_reports, loss_and_grads

AGGRESSIVE = {"memory_budget": 0.25, "accuracy": "aggressive", "device_profile": "h100"}


def _compile_and_run(options, backend="adacc_eager", model_name="gpt"):
    model, batch = build(model_name)
    compiled, partitioner = compile_with_reports(model, backend, options)
    result = loss_and_grads(model, compiled, *batch)
    return partitioner.reports[-1], result


@pytest.mark.parametrize("backend", ["adacc_eager", pytest.param("adacc", marks=pytest.mark.slow)])  # Inductor: -m slow
def test_plan_records_measured_statistics_within_bounds(backend):
    report, _ = _compile_and_run(AGGRESSIVE, backend)
    calibration = report["summary"]["calibration"]
    assert calibration["used"], calibration["reason"]
    assert calibration["options_measured"] >= calibration["values"] > 0
    compressed = [r for r in report["plan"] if r["decision"] == "compress"]
    lossy = [r for r in compressed if not get_codec(r["codec"]).lossless]
    assert lossy, "the plan compresses something lossy at this budget"
    for record in lossy:
        measured = record["calibration"]
        assert measured is not None and measured["accepted"], record["name"]
        assert measured["codec"] == record["codec"]
        assert 0 < measured["relative_error"] <= record["codec_error_bound"]
        assert measured["abs_max"] > 0


def test_option_over_its_declared_bound_is_not_offered(monkeypatch):
    int8 = get_codec("int8_outlier")
    balanced = {**AGGRESSIVE, "accuracy": "balanced", "allow_recompute": False}
    baseline, _ = _compile_and_run(balanced)
    assert baseline["summary"]["codecs"].get("int8_outlier"), "int8 is chosen when trusted"
    monkeypatch.setattr(int8, "error_bound", 1e-6)  # no real activation round-trips this well
    report, _ = _compile_and_run(balanced)
    rejected = report["summary"]["calibration"]["rejected"]
    assert rejected and all(item.endswith(":int8_outlier") for item in rejected)
    assert "int8_outlier" not in report["summary"]["codecs"]


@pytest.mark.slow  # 45 s: keeps the default run under 15 minutes
def test_calibration_off_or_without_real_inputs_trusts_declared_bounds():
    off, _ = _compile_and_run({**AGGRESSIVE, "calibrate_codecs": False})
    assert off["summary"]["calibration"] == {
        "used": False, "reason": "off (calibrate_codecs=False)", "values": 0,
        "options_measured": 0, "rejected": [], "seconds": 0.0,
    }
    assert off["summary"]["codecs"], "the declared bounds still allow compression"
    model, batch = build("gpt")
    partitioner = AdaccPartitioner(AdaccConfig.from_options(AGGRESSIVE))
    # AOTAutograd straight to the partitioner: it never sees real inputs.
    from adacc_compile import compat_inductor

    compiled = torch.compile(model, backend=lambda gm, ex: compat_inductor.eager_aot_compile(gm, ex, partitioner))
    loss_and_grads(model, compiled, *batch)
    summary = partitioner.reports[-1]["summary"]
    assert summary["calibration"]["reason"] == "no real inputs (planned under fake tensors)"
    assert partitioner.real_inputs is None


def test_lossless_plans_skip_calibration():
    report, _ = _compile_and_run({"memory_budget": 0.25, "accuracy": "lossless", "device_profile": "h100"})
    assert report["summary"]["calibration"]["reason"] == "no lossy codec options"


def test_calibration_leaves_training_unchanged():
    """Same RNG stream (the GPT has dropout) and same parameters: a plan made
    with calibration trains exactly like the same plan made without it."""
    options = {**AGGRESSIVE, "accuracy": "balanced"}
    on, (loss_on, grads_on) = _compile_and_run(options)
    torch._dynamo.reset()
    off, (loss_off, grads_off) = _compile_and_run({**options, "calibrate_codecs": False})
    assert on["summary"]["calibration"]["used"] and not on["summary"]["calibration"]["rejected"]
    assert [r["decision"] for r in on["plan"]] == [r["decision"] for r in off["plan"]]
    torch.testing.assert_close(loss_on, loss_off, rtol=0, atol=0)
    for name in grads_on:
        torch.testing.assert_close(grads_on[name], grads_off[name], rtol=0, atol=0)


def test_calibration_run_restores_the_rng_state():
    captured = {}

    class Spy(AdaccPartitioner):
        def __call__(self, gm, joint_inputs, **kwargs):
            captured["before"] = torch.get_rng_state()
            out = super().__call__(gm, joint_inputs, **kwargs)
            captured["after"] = torch.get_rng_state()
            return out

    model, batch = build("gpt")
    partitioner = Spy(AdaccConfig.from_options(AGGRESSIVE))
    compiled = torch.compile(model, backend=partitioner.backend(eager=True))
    loss_and_grads(model, compiled, *batch)
    assert partitioner.reports[-1]["summary"]["calibration"]["used"]
    assert torch.equal(captured["before"], captured["after"])


def test_inputs_that_do_not_match_the_graph_are_refused():
    import torch.fx as fx

    graph = fx.Graph()
    x = graph.placeholder("primals_1")
    x.meta["val"] = torch.empty(4, 8)
    graph.output((x,))
    assert _input_mismatch([x], [torch.zeros(4, 8)]) == ""
    assert "graph expects (4, 8)" in _input_mismatch([x], [torch.zeros(4, 9)])
    assert "1 real inputs for 2" in _input_mismatch([x, x], [torch.zeros(4, 8)])
    assert _input_mismatch([x], [3]) == "input primals_1 has no real value"
    from torch._subclasses import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.zeros(4, 8))
    assert _input_mismatch([x], [fake]) == "input primals_1 has no real value"


def test_calibrate_candidates_without_lossy_options_does_nothing():
    from adacc_compile.passes.candidates import CandidateSet
    from adacc_compile.passes.plan_problem import PlanProblem

    empty = CandidateSet(problem=PlanProblem(candidates=()), nodes={})
    result = calibrate_candidates(None, None, empty, [torch.zeros(1)])  # type: ignore[arg-type]
    assert not result.used and result.reason == "no lossy codec options"


def test_summary_line_says_whether_codecs_were_calibrated():
    from adacc_compile.report import summary_line

    base = {"graph_index": 0, "baseline_saved_bytes": 2_000_000, "planned_saved_bytes": 1_000_000,
            "estimated_added_seconds": 0.01, "estimated_step_seconds": 1.0, "solve_seconds": 0.1,
            "solver_status": "optimal"}
    used = {"used": True, "reason": "", "values": 12, "rejected": ["a:fp8_e5m2"]}
    assert "calibrated on 12 real values (1 option(s) over their bound dropped)" in summary_line(
        {**base, "calibration": used}
    )
    fake = {"used": False, "reason": "no real inputs (planned under fake tensors)"}
    assert "not calibrated: no real inputs" in summary_line({**base, "calibration": fake})
    assert "calibrat" not in summary_line({**base, "calibration": {"used": False, "reason": "no lossy codec options"}})


def test_row_sample_keeps_whole_rows_spread_over_the_value_and_small_values():
    from adacc_compile.passes.calibrate import row_sample

    small = torch.randn(4, 8)
    assert row_sample(small) is small
    big = torch.randn(64, 32, 128)
    sample = row_sample(big, max_elements=1000)
    rows = big.reshape(-1, 128)
    assert sample.shape == (7, 128)
    assert torch.equal(sample[0], rows[0]) and torch.equal(sample[-1], rows[-1])  # first and last rows
    assert all(any(torch.equal(r, s) for r in rows) for s in sample)  # whole rows of the value
    assert row_sample(torch.randn(1, 5000), max_elements=1000).shape == (1, 5000)  # one row at least
    flat = torch.randn(5000)
    assert row_sample(flat, max_elements=1000) is flat  # 1-D: rows are the whole value


@pytest.mark.slow  # 24 s: keeps the default run under 15 minutes
def test_calibration_does_not_depend_on_the_rng_state_at_compile_time():
    """The GPT has dropout: the measured statistics (and so the options
    offered and the plan) are the same whatever the RNG state when the
    first call compiles, as in a process that trained other models first."""
    measured = []
    for seed in (1, 2):
        model, batch = build("gpt")
        compiled, partitioner = compile_with_reports(model, "adacc_eager", AGGRESSIVE)
        loss_and_grads(model, compiled, *batch, seed=seed)  # compiles under this RNG state
        plan = partitioner.reports[-1]["plan"]
        measured.append([(r["name"], r["calibration"]) for r in plan if r.get("calibration")])
    assert measured[0] and measured[0] == measured[1]


def test_parameterised_codec_is_measured_with_its_parameters():
    """A codec that takes parameters has them measured on the whole value
    (kept on the CPU: they travel between ranks pickled) and its error
    measured through its aten form with them, as the compiled graph runs it."""
    from adacc_compile.passes.calibrate import _measure, row_sample

    codec = get_codec("int8_smooth")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 64, generator=gen)
    x[:, 5] *= 50.0  # an outlier channel
    measured = _measure("v", "int8_smooth", x)
    assert measured.accepted and measured.parameters is not None
    assert measured.parameters.device.type == "cpu"
    assert torch.equal(measured.parameters, codec.calibration_parameters(x))
    assert measured.parameters[5] > 1 and (measured.parameters == 1).sum() == 63
    sample = row_sample(x)
    restored = codec.aten_decompress(codec.aten_compress(sample, measured.parameters), list(sample.shape), x.dtype)
    error = float((restored.double() - sample.double()).norm() / sample.double().norm())
    assert measured.stats.relative_error == pytest.approx(error, rel=1e-6)
    assert measured.to_json()["parameters_shape"] == [64]


def test_codec_parameters_lists_accepted_parameterised_options_only():
    from adacc_compile.passes.calibrate import Calibration, OptionCalibration

    def option(codec, accepted, parameters):
        return OptionCalibration(
            value="v", codec=codec, stats=None, declared_bound=0.1, accepted=accepted, parameters=parameters
        )

    factors = torch.ones(4)
    calibration = Calibration(used=True, reason="", options={
        "a": {"int8_smooth": option("int8_smooth", True, factors), "int8_channel": option("int8_channel", True, None)},
        "b": {"int8_smooth": option("int8_smooth", False, factors)},
    })  # fmt: skip
    assert calibration.codec_parameters() == {("a", "int8_smooth"): factors}


def test_an_option_whose_gradient_error_exceeds_the_bound_is_dropped():
    """A ReLU's output is also its backward's mask: int8 rounds small
    positive values to zero and switches their gradients off, so the
    gradient error in ``threshold_backward`` exceeds int8's bound although
    the value's own error does not. Those options are dropped, and say why."""
    balanced = {"memory_budget": 0.3, "accuracy": "balanced", "allow_recompute": False, "device_profile": "h100"}

    class ReluMlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                torch.nn.Linear(64, 1),
            )

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)

    torch.manual_seed(0)
    model = ReluMlp()
    generator = torch.Generator().manual_seed(0)
    batch = (torch.randn(32, 16, generator=generator), torch.randn(32, generator=generator))
    captured = []
    original = calibrate_module.with_gradient_errors

    def spy(*args, **kwargs):
        captured.append(original(*args, **kwargs))
        return captured[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(calibrate_module, "with_gradient_errors", spy)
        compiled, partitioner = compile_with_reports(model, "adacc_eager", balanced)
        loss_and_grads(model, compiled, *batch)
    (calibration,) = captured
    dropped = [o for o in calibration.rejected if o.reason.startswith("gradient error")]
    assert dropped, [(o.value, o.codec, o.reason) for o in calibration.rejected]
    for option in dropped:
        assert option.stats.relative_error <= option.declared_bound < option.gradient.error
        assert "threshold_backward" in option.reason
    rejected = partitioner.reports[-1]["summary"]["calibration"]["rejected"]
    assert {f"{o.value}:{o.codec}" for o in dropped} <= set(rejected)
    chosen = {(r["name"], r["codec"]) for r in partitioner.reports[-1]["plan"] if r["decision"] == "compress"}
    assert not chosen & {(o.value, o.codec) for o in dropped}
