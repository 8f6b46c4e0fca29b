"""Will a job fit on a GPU (`adacc_compile.job_memory`, ``adacc plan``
without ``--budget``): the parts of one rank's step, per optimizer,
precision and sharding, and the CLI's answer and its ``--json``."""

from __future__ import annotations

import json

import pytest

from adacc_compile import cli
from adacc_compile.job_memory import (
    CONTEXT_BYTES, FRAGMENTATION, GPU_CAPACITY_BYTES, TrainingSetup, budget_for, job_memory, static_bytes,
)

PARAMETERS, BLOCK = 7_000_000, 200_000
CAPACITY = GPU_CAPACITY_BYTES["h100"]


@pytest.mark.parametrize("optimizer, precision, per_parameter", [
    ("adamw", "fp32-master", 8), ("adamw", "bf16", 4), ("adamw8bit", "fp32-master", 2),
    ("sgd", "fp32-master", 4), ("none", "bf16", 0),
])
def test_optimizer_state_per_parameter(optimizer, precision, per_parameter):
    parts = static_bytes(TrainingSetup(optimizer=optimizer, precision=precision), PARAMETERS, BLOCK)
    assert parts["optimizer_state_bytes"] == per_parameter * PARAMETERS
    dtype = 4 if precision == "fp32-master" else 2
    assert parts["weights_bytes"] == parts["gradients_bytes"] == dtype * PARAMETERS
    assert parts["unsharded_in_flight_bytes"] == 0


def test_fsdp_divides_weights_gradients_and_optimizer_state_by_the_ranks():
    alone = static_bytes(TrainingSetup(), PARAMETERS, BLOCK)
    sharded = static_bytes(TrainingSetup(gpus=8, fsdp=True), PARAMETERS, BLOCK)
    for key in ("weights_bytes", "gradients_bytes", "optimizer_state_bytes"):
        assert sharded[key] == -(-alone[key] // 8)
    # The current and the prefetched block all-gathered in bf16, one block's fp32 gradients.
    assert sharded["unsharded_in_flight_bytes"] == 2 * BLOCK * 2 + BLOCK * 4
    # Eight ranks without FSDP: data parallel, nothing sharded.
    assert static_bytes(TrainingSetup(gpus=8), PARAMETERS, BLOCK) == alone


@pytest.mark.parametrize("setup", [TrainingSetup(), TrainingSetup(gpus=4, fsdp=True)])
def test_the_parts_add_up_to_the_total_and_the_budget_fills_the_gpu(setup):
    traced_gradients = 2 * PARAMETERS
    budget, scope = budget_for(CAPACITY, setup, PARAMETERS, BLOCK, traced_gradients)
    assert scope == ("activations" if setup.fsdp else "step")
    job = job_memory(CAPACITY, setup, PARAMETERS, BLOCK, step_peak_bytes=budget, activation_peak_bytes=budget,
                     traced_gradient_bytes=traced_gradients)
    fields = job.to_json()
    parts = [fields[k] for k in ("weights_bytes", "gradients_bytes", "optimizer_state_bytes",
                                 "unsharded_in_flight_bytes", "activation_peak_bytes",
                                 "optimizer_step_excess_bytes", "reserve_bytes")]
    assert sum(parts) == fields["total_peak_bytes"] == sum(n for _, n in job.rows(fsdp=setup.fsdp))
    assert fields["reserve_bytes"] == CONTEXT_BYTES + int(FRAGMENTATION * CAPACITY)
    # A plan at exactly the budget fills the GPU; a byte more does not fit.
    assert job.total_peak_bytes == CAPACITY and job.fits_gpu
    over = job_memory(CAPACITY, setup, PARAMETERS, BLOCK, step_peak_bytes=budget + 1,
                      activation_peak_bytes=budget + 1, traced_gradient_bytes=traced_gradients)
    assert not over.fits_gpu


@pytest.mark.parametrize("optimizer, temporaries", [("adamw", 4), ("sgd", 0), ("adamw8bit", 0)])
def test_where_the_optimizers_step_peaks_its_excess_is_a_part(optimizer, temporaries):
    """With few activations the step peaks in the optimizer's step: the
    weights, fp32 gradients, states and (AdamW's multi-tensor path) one
    state-sized temporary, the activations gone."""
    setup = TrainingSetup(optimizer=optimizer)
    job = job_memory(CAPACITY, setup, PARAMETERS, BLOCK, step_peak_bytes=1000, activation_peak_bytes=1000,
                     traced_gradient_bytes=2 * PARAMETERS)
    static = static_bytes(setup, PARAMETERS, BLOCK)
    optimizer_step = (static["weights_bytes"] + static["gradients_bytes"] + static["optimizer_state_bytes"]
                      + temporaries * PARAMETERS)
    assert job.total_peak_bytes - job.reserve_bytes == max(optimizer_step, job.total_peak_bytes - job.reserve_bytes
                                                           - job.optimizer_step_excess_bytes)
    assert (job.optimizer_step_excess_bytes > 0) == (optimizer_step > static["weights_bytes"]
                                                     + static["optimizer_state_bytes"] + 2 * PARAMETERS + 1000)
    busy = job_memory(CAPACITY, setup, PARAMETERS, BLOCK, step_peak_bytes=10**9, activation_peak_bytes=10**9,
                      traced_gradient_bytes=2 * PARAMETERS)
    assert busy.optimizer_step_excess_bytes == 0  # the backward peaks higher


def test_bad_setups_are_refused():
    with pytest.raises(ValueError, match="optimizer"):
        TrainingSetup(optimizer="adam")
    with pytest.raises(ValueError, match="precision"):
        TrainingSetup(precision="fp8")
    with pytest.raises(ValueError, match="gpus"):
        TrainingSetup(gpus=0)


TINY_LLAMA = {
    "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 64, "max_position_embeddings": 64,
}


def _json(capsys, *args):
    assert cli.main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_cli_answers_with_the_gpus_budget_and_its_json_fields(tmp_path, capsys):
    pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    common = [str(path), "--gpu", "h100", "--batch", "2", "--seq", "16"]
    alone = _json(capsys, *common)
    for key in ("fits_gpu", "gpu_capacity_bytes", "total_peak_bytes", "weights_bytes", "gradients_bytes",
                "optimizer_state_bytes", "activation_peak_bytes", "largest_batch"):
        assert key in alone, key
    assert alone["fits_gpu"] and alone["gpu_capacity_bytes"] == CAPACITY and alone["budget_scope"] == "step"
    assert alone["largest_batch"] is None and not alone["largest_batch_searched"]  # the asked batch fits
    assert alone["total_peak_bytes"] == sum(alone[k] for k in (
        "weights_bytes", "gradients_bytes", "optimizer_state_bytes", "unsharded_in_flight_bytes",
        "activation_peak_bytes", "optimizer_step_excess_bytes", "reserve_bytes"))
    assert alone["optimizer_state_bytes"] == 2 * alone["weights_bytes"]  # AdamW, fp32 states
    sharded = _json(capsys, *common, "--gpus", "4", "--fsdp")
    assert sharded["weights_bytes"] == -(-alone["weights_bytes"] // 4)
    assert sharded["budget_scope"] == "activations"
    # Each strategy's largest batch, linear in the batch from the traced one;
    # adacc's at least full AC's (one of its plans), no checkpointing's the least.
    largest = sharded["largest_batch_estimates"]
    strategies = sharded["strategies"]
    assert set(largest) == set(strategies)
    full_ac = next(name for name in strategies if name.startswith("full AC"))
    none = next(name for name in strategies if name.startswith("no checkpointing"))
    adacc = next(name for name in strategies if name.startswith("adacc"))
    for name, peak in ((full_ac, strategies[full_ac]["activation_peak_bytes"]),
                       (none, strategies[none]["activation_peak_bytes"])):
        assert largest[name] == sharded["budget_bytes"] * 2 // peak
    assert largest[adacc] >= largest[full_ac] >= largest[none] >= 2  # the asked batch fits
    # On a GPU too small for the weights and optimizer state, no plan fits.
    assert cli.main(["plan", *common, "--gpu-memory", "1MiB"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Does not fit on 1 x h100") and "no plan can fit" in out
