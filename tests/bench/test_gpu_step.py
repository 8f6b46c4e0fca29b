"""`bench/gpu_step.py` runs on CPU (tiny sizes) and writes its table and
JSON; the auto_perf_maxing-style baseline (`bench/apm_policy.py`) holds its
LP's rows, lands near its own budget when measured and recomputes less
than full checkpointing; torchtitan's policy saves every other matmul."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy

BENCH = pathlib.Path(__file__).parents[2] / "bench"
SCRIPT = BENCH / "gpu_step.py"
sys.path.insert(0, str(BENCH))

import apm_policy  # noqa: E402
from apm_policy import BlockProfile, InfeasibleBudget, OpCall  # noqa: E402

MiB = 2**20


def _run(out: pathlib.Path, *args: str) -> tuple[str, dict]:
    # One thread: on two shared cores, OpenMP's spinning barriers under
    # another process's load made a 12 ms step take 3 s.
    env = {**os.environ, "OUT": str(out), "TORCHINDUCTOR_CACHE_DIR": str(out / "torch_cache"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, timeout=1200, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return (out / "gpu_step.md").read_text(), json.loads((out / "gpu_step.json").read_text())


def _finite_rows(data: dict) -> dict[str, dict]:
    rows = {}
    for row in data["strategies"]:
        assert row["error"] is None, (row["name"], row["error"])
        for key in ("tokens_per_s", "median_step_seconds", "peak_bytes", "step_peak_bytes", "compile_seconds"):
            assert row[key] is not None and math.isfinite(row[key]) and row[key] > 0, (row["name"], key, row[key])
        assert all(math.isfinite(loss) for loss in row["losses"])
        rows[f"{row['round']}:{row['name']}"] = row
    return rows


# --------------------------------------------------------------------------
# end to end (compiles take 10 to 60 s each on two shared cores: slow)
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def four_layer_run(tmp_path_factory) -> tuple[str, dict]:
    """Full AC and the APM baseline at 1.25x full AC's measured peak, on a
    4-layer Llama (d_model 64, seq 32): three compiles."""
    out = tmp_path_factory.mktemp("gpu_step_4")
    return _run(out, "--smoke", "--layers", "4", "--strategies", "full_ac", "apm", "--budget-factors", "1.25")


@pytest.mark.slow
def test_a_four_layer_run_writes_the_table_and_the_json(four_layer_run):
    markdown, data = four_layer_run
    meta = data["meta"]
    assert {"date", "command", "device", "torch", "triton", "sizes", "parameters"} <= set(meta)
    assert meta["sizes"]["layers"] == 4 and meta["command"].startswith("python bench/gpu_step.py --smoke")
    rows = _finite_rows(data)
    assert set(rows) == {"1:full AC", "2:full AC", next(k for k in rows if k.startswith("2:APM LP @1.25x"))}
    assert "| strategy | round | tokens/s |" in markdown and "APM LP @1.25x" in markdown


@pytest.mark.slow
def test_the_apm_baseline_lands_at_its_budget_and_recomputes_less_than_full_ac(four_layer_run):
    """Measured peak (forward and backward, Inductor on CPU) at most 1.10x
    the APM plan's budget; recomputed FLOPs (an eager step under
    FlopCounterMode less the step without checkpointing) below full AC's."""
    _, data = four_layer_run
    rows = _finite_rows(data)
    apm = next(row for key, row in rows.items() if key.startswith("2:APM LP"))
    full = rows["2:full AC"]
    budget = apm["budget_bytes"]
    print(f"APM: budget {budget / MiB:.3f} MiB, measured {apm['peak_bytes'] / MiB:.3f} MiB "
          f"({apm['peak_bytes'] / budget:.3f}x, {100 * (1 - apm['peak_bytes'] / budget):.1f}% below); recomputed "
          f"{apm['recomputed_flops'] / 1e6:.2f} MFLOP against full AC's {full['recomputed_flops'] / 1e6:.2f}")
    assert apm["peak_bytes"] <= 1.10 * budget
    assert 0 <= apm["recomputed_flops"] < full["recomputed_flops"]
    (plan,) = data["apm"]["plans"]
    assert plan["error"] is None and plan["predicted_peak_bytes"] <= budget
    assert plan["recompute_seconds"] < plan["full_recompute_seconds"]


@pytest.mark.slow  # 2.5 minutes: eight compiles on two cores
def test_the_smoke_run_measures_every_strategy(tmp_path):
    markdown, data = _run(tmp_path, "--smoke")
    names = [row["name"] for row in data["strategies"]]
    for prefix in ("no checkpointing", "full AC", "torchtitan selective AC", "torch budget @0.5", "APM LP @1.25x",
                   "adacc lossless @1.25x", "adacc balanced @1.25x"):
        assert any(name.startswith(prefix) for name in names), prefix
        assert prefix in markdown
    rows = _finite_rows(data)
    for key, row in rows.items():
        if row["kind"] in ("full_ac", "checkpoint_policy"):  # the APM plan may keep every matmul: 0
            assert row["recomputed_flops"] is not None and row["recomputed_flops"] >= 0, key
    assert rows["1:full AC"]["recomputed_flops"] > rows["1:torchtitan selective AC"]["recomputed_flops"] > 0


def test_a_spent_time_budget_starts_nothing_and_says_so(tmp_path):
    """The default run's end-to-end check (no compile: every strategy is
    refused by the clock): the command builds the model, writes the table
    and the JSON with its meta block, and names what it did not start."""
    import gpu_step

    assert gpu_step.main(["--smoke", "--time-budget-s", "0", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "gpu_step.json").read_text())
    assert {"date", "command", "device", "torch", "triton", "sizes", "parameters"} <= set(data["meta"])
    names = [row["name"] for row in data["strategies"]]
    assert names == ["no checkpointing", "full AC", "torchtitan selective AC"]
    assert all(row["error"] == "not run: time budget spent" for row in data["strategies"])
    markdown = (tmp_path / "gpu_step.md").read_text()
    assert "| torchtitan selective AC | 1 | not run: time budget spent |" in markdown
    assert "Not started (time budget): no checkpointing, full AC, torchtitan selective AC, round 2, recompute count." in markdown


def test_the_table_reads_each_round_against_its_own_full_ac(tmp_path):
    import gpu_step
    from adacc_examples.benchmarking import Variant, VariantResult
    from gpu_check import Report

    run = gpu_step.Run(Report(tmp_path, stem="gpu_step"), {"title": "# t"}, tokens_per_step=1000)
    full = VariantResult(name="full AC", peak_bytes=8 * MiB, step_peak_bytes=9 * MiB, step_seconds=[2.0, 2.0],
                         compile_seconds=3.0, losses=[1.0])
    apm = VariantResult(name="APM LP @1x", peak_bytes=6 * MiB, step_peak_bytes=7 * MiB, step_seconds=[1.0, 1.5, 1.0],
                        compile_seconds=2.0, losses=[1.0])
    run.progress(1, [Variant(name="full AC", kind="full_ac"),
                     Variant(name="APM LP @1x", kind="checkpoint_policy", options={"memory_budget": 6 * MiB})])([full, apm])
    run.recomputed = {"APM LP @1x": 2 * 10**9}
    (_, row) = [e for e in run.entries() if e["round"] == 2]
    assert row["tokens_per_s"] == 1000 and row["step_vs_full_ac"] == 0.5 and row["peak_vs_full_ac"] == 0.75
    run.write()
    assert "| APM LP @1x | 2 | 1000 | 1000.0 | 0.50 | 6.0 | 0.75 | 7.0 | 6.0 | 2 | 2.0 |  | 1.0000 |" in (
        tmp_path / "gpu_step.md").read_text()


# --------------------------------------------------------------------------
# apm_policy: the LP and its rounding
# --------------------------------------------------------------------------


def _profile() -> BlockProfile:
    calls = (
        OpCall(op="aten.mm.default", index=0, bytes=4 * MiB, flops=0, cost_s=4.0),
        OpCall(op="aten.view.default", index=0, bytes=0, flops=0, cost_s=0.0),
        OpCall(op="aten.silu.default", index=0, bytes=4 * MiB, flops=0, cost_s=0.5),
        OpCall(op="aten.mm.default", index=1, bytes=2 * MiB, flops=0, cost_s=3.0),
        OpCall(op="aten.mul.Tensor", index=0, bytes=1 * MiB, flops=0, cost_s=0.2),
        OpCall(op="aten.mm.default", index=2, bytes=3 * MiB, flops=0, cost_s=2.0),
    )
    return BlockProfile(calls=calls, input_bytes=1 * MiB, saved_bytes=12 * MiB, forward_peak_bytes=6 * MiB,
                        backward_peak_bytes=5 * MiB)


LAYERS, FIXED = 4, 3 * MiB


def test_a_budget_that_fits_everything_keeps_everything():
    profile = _profile()
    plan = apm_policy.plan(profile, LAYERS, 10**9, FIXED)
    everything = frozenset(c.key for c in profile.candidates)
    assert plan.keep == (everything,) * LAYERS and plan.recompute_seconds == 0
    assert ("aten.view.default", 0) not in everything


def test_a_budget_below_the_floor_is_a_clear_error():
    profile = _profile()
    floor = apm_policy.floor_bytes(profile, LAYERS)
    assert floor == LAYERS * MiB + 12 * MiB + 5 * MiB  # every input kept, the last block rematerialised
    apm_policy.plan(profile, LAYERS, floor + FIXED, FIXED)  # exactly the floor: recompute everything
    with pytest.raises(InfeasibleBudget, match="below what recomputing every op still needs") as info:
        apm_policy.plan(profile, LAYERS, floor + FIXED - 1, FIXED)
    assert info.value.floor_bytes == floor + FIXED


def test_the_plan_holds_every_row_and_recompute_falls_as_the_budget_grows():
    profile = _profile()
    floor = apm_policy.floor_bytes(profile, LAYERS) + FIXED
    costs = []
    for extra in range(0, 60 * MiB, MiB // 2):
        plan = apm_policy.plan(profile, LAYERS, floor + extra, FIXED)
        rows = apm_policy.activation_rows(profile, plan.kept_bytes)
        assert max(v for _, v in rows) + FIXED == plan.predicted_peak_bytes <= plan.budget_bytes
        assert plan.lp_recompute_seconds <= plan.recompute_seconds + 1e-9  # the LP bounds the rounded plan
        costs.append(plan.recompute_seconds)
    assert all(later <= earlier + 1e-9 for earlier, later in zip(costs, costs[1:])), costs
    assert 0 < costs[0] < LAYERS * 9.7 and costs[-1] == 0


def test_at_the_floor_only_the_last_block_keeps_anything():
    """Recomputing everything is bound by the last block's backward; the
    last block's own activations weigh only on its forward row, so that
    much of them can stay."""
    profile = _profile()
    plan = apm_policy.plan(profile, LAYERS, apm_policy.floor_bytes(profile, LAYERS) + FIXED, FIXED)
    assert plan.kept_bytes[:-1] == (0,) * (LAYERS - 1) and plan.kept_bytes[-1] > 0


def test_the_policy_saves_the_kept_calls_counting_forward_and_recompute_apart():
    policy = apm_policy.keep_policy(frozenset({("aten.mm.default", 1)}))
    mm, forward, recompute = torch.ops.aten.mm.default, SimpleNamespace(is_recompute=False), SimpleNamespace(is_recompute=True)
    assert [policy(forward, mm) for _ in range(3)] == [CheckpointPolicy.PREFER_RECOMPUTE, CheckpointPolicy.MUST_SAVE,
                                                      CheckpointPolicy.PREFER_RECOMPUTE]
    assert [policy(recompute, mm) for _ in range(2)] == [CheckpointPolicy.PREFER_RECOMPUTE, CheckpointPolicy.MUST_SAVE]


def test_torchtitans_policy_saves_every_other_matmul_and_attention():
    import gpu_step

    policy, ctx = gpu_step.torchtitan_policy(), SimpleNamespace(is_recompute=False)
    mm = torch.ops.aten.mm.default
    decisions = [policy(ctx, mm) for _ in range(4)]
    assert decisions == [CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE] * 2
    sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    assert policy(ctx, sdpa) == CheckpointPolicy.MUST_SAVE
    assert policy(ctx, torch.ops.aten.silu.default) == CheckpointPolicy.PREFER_RECOMPUTE


def test_profiling_a_real_block_sees_its_matmuls_and_leaves_no_gradients():
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, use_cache=False)
    model = transformers.LlamaForCausalLM(config).train()
    ids = torch.randint(0, 64, (2, 16))
    block = model.model.layers[0]
    args, kwargs = apm_policy.capture_block_call(model, block, lambda: model(input_ids=ids, labels=ids))
    profile = apm_policy.profile_block(block, args, kwargs, apm_policy.Roofline.for_device("cpu"))
    matmuls = [c for c in profile.candidates if c.op == "aten.mm.default"]
    assert len(matmuls) == 7 and all(c.flops > 0 and c.cost_s > 0 for c in matmuls)  # q k v o gate up down
    assert [c.key for c in profile.candidates if "scaled_dot_product" in c.op] == [(apm_policy.SDPA, 0)]
    assert profile.input_bytes == 2 * 16 * 32 * 4
    assert 0 < profile.saved_bytes <= sum(c.bytes for c in profile.candidates)
    assert profile.forward_peak_bytes > 0 and profile.backward_peak_bytes > 0
    assert all(p.grad is None for p in model.parameters())
