"""``adacc plan``: model routes, the printed report against the dumped
summary, errors that name the problem, and the budget-cannot-be-met path."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from adacc_compile import batch_search, cli
from adacc_compile.model_source import ModelNotFound, resolve_model
from adacc_compile.plan_summary import gib

TINY_LLAMA = {
    "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 64, "max_position_embeddings": 64,
}


@pytest.fixture
def tiny_config(tmp_path):
    pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return str(path)


def _plan(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["plan", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_tiny_config_folded_table_matches_dumped_summary(tiny_config, tmp_path, capsys):
    dump = tmp_path / "dump"
    code, out, err = _plan(capsys, tiny_config, "--gpu", "h100", "--budget", "0.5", "--batch", "2",
                           "--seq", "16", "--dump", str(dump))
    assert code == 0, err
    summary = json.loads((dump / "graph_000" / "summary.json").read_text())
    plan = json.loads((dump / "graph_000" / "plan.json").read_text())
    strategies = json.loads((dump / "strategies.json").read_text())["strategies"]
    # Folded: the identical layers that share decisions share one row (the
    # last in the forward, the first differentiated, decides on its own), far
    # fewer rows than values.
    folded = (dump / "graph_000" / "plan_folded.txt").read_text()
    assert "layers 0-1 " in out and "layers 0-1 " in folded
    assert len(folded.splitlines()) < sum(1 for r in plan if r["decision"] != "none")
    assert (dump / "graph_000" / "plan_table.txt").exists()
    # The printed numbers are the dumped summary's.
    adacc = strategies[0]
    assert adacc["activation_peak_bytes"] == summary["predicted_activation_peak_bytes"]
    assert adacc["step_peak_bytes"] == summary["predicted_peak_bytes"]
    row = next(line for line in out.splitlines() if line.strip().startswith("adacc (lossless)"))
    assert gib(summary["predicted_activation_peak_bytes"]) in row
    assert gib(summary["requested_budget_bytes"]) in out
    names = [s["name"] for s in strategies]
    assert names[1].startswith("no checkpointing") and names[2].startswith("full AC")
    assert any(n.startswith("PyTorch memory budget") for n in names)
    full_ac = strategies[2]
    assert full_ac["activation_peak_bytes"] <= strategies[1]["activation_peak_bytes"]
    assert ("Fits:" in out) == summary["activation_peak_fits_budget"]
    pytest.importorskip("matplotlib")
    assert (dump / "strategies_memory.png").stat().st_size > 0


# Slow (38 s): the CLI's step-scope answer is also checked in the default run
# by tests/adacc_compile/test_job_memory.py (whose plans bound the step).
@pytest.mark.slow
def test_a_step_budget_scope_bounds_and_reports_the_step_peak(tiny_config, tmp_path, capsys):
    dump = tmp_path / "dump"
    code, out, err = _plan(capsys, tiny_config, "--gpu", "h100", "--budget", "0.7", "--batch", "2", "--seq", "16",
                           "--budget-scope", "step", "--dump", str(dump))
    assert code == 0, err
    summary = json.loads((dump / "graph_000" / "summary.json").read_text())
    adacc = json.loads((dump / "strategies.json").read_text())["strategies"][0]
    assert summary["budget_scope"] == "step"
    assert f"budget (step peak): {gib(summary['requested_budget_bytes'])}" in out
    fits = adacc["step_peak_bytes"] <= summary["requested_budget_bytes"]
    row = next(line for line in out.splitlines() if line.strip().startswith("adacc (lossless)"))
    assert re.search(r"x\s+(yes|no)\s", row).group(1) == ("yes" if fits else "no")  # then the largest batch
    assert ("Fits: adacc's step peak" in out) == (summary["fits_budget"] and not summary["budget_clamped_to_minimum"])
    assert cli._bounded_peak(summary) == summary["predicted_peak_bytes"]
    assert cli._bounded_peak({**summary, "budget_scope": "activations"}) == summary["predicted_activation_peak_bytes"]


def test_module_factory_route(capsys):
    code, out, err = _plan(capsys, "adacc_cli_factories:tiny_gpt", "--gpu", "h200", "--budget", "0.6",
                           "--batch", "2", "--seq", "16", "--dtype", "fp32")
    assert code == 0, err
    assert out.startswith("Fits on 1 x h200")  # the answer first, then the plan
    assert "\nadacc plan: adacc_cli_factories:tiny_gpt (user factory)" in out
    assert "blocks 0-1 " in out  # GPT's blocks, folded (the last decides on its own)


@pytest.mark.parametrize(
    "model, message",
    [
        ("no-such-model", "unknown model 'no-such-model'"),
        ("no_such_module_xyz:factory", "cannot import 'no_such_module_xyz'"),
        ("adacc_cli_factories:missing", "has no callable 'missing'"),
    ],
)
def test_unknown_model_is_a_clear_error(model, message, capsys):
    code, out, err = _plan(capsys, model, "--gpu", "h100", "--budget", "1GiB", "--batch", "1", "--seq", "8")
    assert code == 2 and out == ""
    assert message in err


def test_factory_returning_no_module_is_a_clear_error(capsys):
    code, _, err = _plan(capsys, "adacc_cli_factories:not_a_module", "--gpu", "h100", "--budget", "1GiB",
                         "--batch", "1", "--seq", "8")
    assert code == 2 and "returned int, not an nn.Module" in err


def test_missing_transformers_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails
    with pytest.raises(ModelNotFound, match=r"pip install 'adacc-compile\[hf\]'"):
        resolve_model("llama-2-7b")


def test_presets_and_tensor_parallel_shard():
    pytest.importorskip("transformers")
    assert "hidden 4096" in resolve_model("llama-2-7b").description
    shard = resolve_model("llama-2-7b", tp=4).description
    assert "heads 8" in shard and "FFN 2752" in shard and "TP shard 1/4" in shard
    with pytest.raises(ModelNotFound, match="does not divide"):
        resolve_model("llama-2-7b", tp=3)


def test_batch_search_on_a_linear_minimum():
    """m(b) = 10 + 3 b bytes, budget 40: batch 10 fits (40), 11 does not."""
    calls = []

    def minimum_at(batch):
        calls.append(batch)
        return 10 + 3 * batch

    search = batch_search.largest_batch(minimum_at, asked_batch=16, minimum_bytes=58, budget_bytes=40)
    assert search.largest == 10 and search.exact
    assert len(calls) <= batch_search.MAX_PLANS
    assert "verified by tracing and planning" in search.explain()
    nothing = batch_search.largest_batch(lambda b: 100 * b, asked_batch=4, minimum_bytes=400, budget_bytes=50)
    assert nothing.largest is None and nothing.exact


def test_budget_cannot_be_met_names_smallest_budget_and_largest_batch(tiny_config, capsys, monkeypatch):
    """The report's infeasible path, fast: the plan is made for real, then
    taken as not fitting, and every other batch's minimum comes from a known
    line (the real search, which re-traces, is the slow test below)."""
    from adacc_compile import plan_preview

    monkeypatch.setattr(plan_preview.Preview, "fits", property(lambda self: False))
    planned = []

    def minimum_at(source, batch, seq, dtype, config, fold):
        planned.append(batch)
        return (batch + 0.5) * 2**30  # bytes: batch 4 needs 4.5 GiB

    monkeypatch.setattr(cli, "_reachable_minimum", minimum_at)
    code, out, err = _plan(capsys, tiny_config, "--gpu", "h100", "--budget", "4.5GiB", "--batch", "8", "--seq", "16")
    assert code == 0, err
    assert "Does not fit: at batch 8" in out
    assert "the smallest budget that can be met is 8.50 GiB" in out
    assert "Largest batch that fits 4.50 GiB: 4." in out
    assert "linear in the batch" in out and "verified by tracing and planning" in out
    assert 4 in planned and 5 in planned


TINY_TWO_LAYERS = {**TINY_LLAMA, "num_hidden_layers": 2}


@pytest.mark.slow  # 27 s: keeps the default run under 15 minutes
def test_deep_config_is_traced_shallow_and_planned_at_full_depth(tmp_path, capsys):
    """Five identical layers: three traced, the middle one standing for
    three; the report says so and its plan rows count all five layers.
    ``--no-fold`` traces all five (tests/e2e/test_depth_fold.py compares
    the figures)."""
    pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY_LLAMA, "num_hidden_layers": 5}))
    args = [str(path), "--gpu", "h100", "--budget", "0.5", "--batch", "2", "--seq", "16"]
    code, out, err = _plan(capsys, *args, "--dump", str(tmp_path / "dump"))
    assert code == 0, err
    assert "depth folding: traced 3 of 5 identical blocks and planned all 5" in out
    assert re.search(r"^layers 0-4 +5 ", out, re.M), out
    summary = json.loads((tmp_path / "dump" / "graph_000" / "summary.json").read_text())
    assert summary["depth_fold"]["copies"] == 2 and summary["depth_fold"]["repeated_block"].endswith("layers.1")
    assert "layers 0-4 " in (tmp_path / "dump" / "graph_000" / "plan_folded.txt").read_text()
    code, out, err = _plan(capsys, *args, "--no-fold")
    assert code == 0, err
    assert "depth folding" not in out
    assert re.search(r"^layers 0-4 +5 ", out, re.M), out


@pytest.mark.slow
def test_budget_cannot_be_met_real_search(tmp_path, capsys):
    """Re-traces and plans each guessed batch (about a minute on two shared
    cores: the reachable minimum's solve dominates)."""
    pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_TWO_LAYERS))
    # Below the reachable minimum at batch 8 (53.0 KiB since the peak-model
    # and dropout-replay changes of 2026-12-01; 60 KiB fits now).
    code, out, err = _plan(capsys, str(path), "--gpu", "h100", "--budget", "30KiB", "--batch", "8", "--seq", "8")
    assert code == 0, err
    assert re.search(r"the smallest budget that can be met is \d+\.\d KiB", out)
    assert re.search(r"Largest batch that fits 30\.0 KiB: [1-7]\.", out), out[-1500:]


def test_python_dash_m_runs_the_cli():
    result = subprocess.run([sys.executable, "-m", "adacc_compile", "plan", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "--gpu" in result.stdout


class _Terminal:
    def __init__(self, tty: bool):
        self.tty, self.text = tty, ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def test_progress_only_on_a_terminal():
    for tty in (True, False):
        out = _Terminal(tty)
        progress = cli.Progress(out)
        progress.start("tracing")
        progress.switch("planning")
        progress.done()
        assert ("tracing ..." in out.text and "planning ..." in out.text and " s\n" in out.text) == tty
        assert out.text == "" or tty


TINY_GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 64}


def test_gpt2_config_plans_as_one_graph_without_warnings(tmp_path, capsys):
    """GPT-2's own loss path logs a warning that breaks Dynamo's graph before
    the loss; the CLI's loss wrapper computes the loss itself."""
    pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_GPT2))
    # Budget 1.0: the point is the one graph, not a hard plan (a tight budget
    # costs a minute of MILP on two cores).
    code, out, err = _plan(capsys, str(path), "--gpu", "h100", "--budget", "1.0", "--batch", "2", "--seq", "16")
    assert code == 0, err
    assert "h 0-1 " in out  # the two GPT-2 blocks, folded
    assert "loss_type" not in out + err


def test_loss_wrapper_equals_transformers_loss():
    transformers = pytest.importorskip("transformers")
    import torch

    from adacc_compile.model_source import HFCausalLoss

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{k: v for k, v in TINY_GPT2.items() if k != "model_type"}))
    model.eval()
    ids = torch.randint(0, 64, (2, 16))
    labels = ids.clone()
    labels[0, 5] = -100  # ignored positions count as in transformers' loss
    expected = model(input_ids=ids, labels=labels, use_cache=False)
    loss, logits = HFCausalLoss(model)(ids, labels)
    assert torch.equal(loss, expected.loss) and torch.equal(logits, expected.logits)


def test_graph_break_before_the_loss_is_a_clear_error(capsys):
    code, out, err = _plan(capsys, "adacc_cli_factories:breaks_before_loss", "--gpu", "h100", "--budget", "1GiB",
                           "--batch", "1", "--seq", "8", "--dtype", "fp32")
    assert code == 2 and out == ""
    assert "graph break before it" in err and "TORCH_LOGS=graph_breaks" in err


def test_solver_limits_reach_the_plans_options(monkeypatch, capsys):
    """``--solver-node-limit`` and ``--solver-time-limit`` become the
    config's options; a node limit of 0 is refused with the option's name."""
    seen = []

    def record(options):
        seen.append(dict(options))
        raise ValueError("stop after the options")

    monkeypatch.setattr(cli, "resolve_model", lambda name, tp: None)
    monkeypatch.setattr(cli.AdaccConfig, "from_options", staticmethod(record))
    required = ("any-model", "--gpu", "h100", "--budget", "0.5", "--batch", "1", "--seq", "8")
    code, _, err = _plan(capsys, *required, "--solver-node-limit", "7", "--solver-time-limit", "9")
    assert code == 2 and "stop after the options" in err
    assert (seen[0]["solver_node_limit"], seen[0]["solver_time_limit_s"]) == (7, 9.0)
    monkeypatch.undo()
    monkeypatch.setattr(cli, "resolve_model", lambda name, tp: None)
    code, _, err = _plan(capsys, *required, "--solver-node-limit", "0")
    assert code == 2 and "solver_node_limit=0 must be a positive int" in err


@pytest.mark.parametrize("accuracy, kept", [("lossless", False), ("aggressive", True)])
def test_the_trace_keeps_the_ops_the_options_few_bit_codecs_replace(monkeypatch, capsys, accuracy, kept):
    """The CLI traces the joint graph ``torch.compile`` would plan with the
    same options: with few-bit codecs allowed, the GELU/SiLU backwards whole."""
    import torch

    from adacc_compile import plan_preview

    seen = []

    def record(source, **kwargs):
        seen.append(kwargs["whole_ops"])
        raise ValueError("stop after the trace's arguments")

    monkeypatch.setattr(cli, "resolve_model", lambda name, tp: type("Source", (), {"label": name})())
    monkeypatch.setattr(plan_preview, "trace", record)
    required = ("any-model", "--gpu", "h100", "--budget", "0.5", "--batch", "1", "--seq", "8")
    code, _, err = _plan(capsys, *required, "--accuracy", accuracy)
    assert code == 2 and "stop after the trace's arguments" in err
    assert (torch.ops.aten.gelu_backward.default in seen[0]) is kept
