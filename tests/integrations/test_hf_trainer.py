"""Hugging Face `Trainer` through adacc, by the route the README documents:
compile the model in place (``model.compile(backend="adacc", options=...)``)
before handing it to the Trainer, and leave ``torch_compile`` off.

The per-step losses and gradient norms the Trainer logs equal the uncompiled
Trainer's. The two routes that do not work fail as the README says:
``torch_compile_backend="adacc"`` (accelerate knows a fixed list of
backends) and a ``torch.compile`` wrapper (its ``forward(*args, **kwargs)``
hides the model's signature, so the Trainer drops every dataset column).
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from adacc_test_utils import EAGER_REL, INDUCTOR_REL, relative_error

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

SEQ_LEN = 16
VOCAB = 64


def tiny_gpt2(n_layer: int = 2, dropout: float = 0.1) -> torch.nn.Module:
    """A seeded GPT-2 from a config (random weights, nothing downloaded)."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=n_layer, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=SEQ_LEN,
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
        bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM",
    )
    return transformers.GPT2LMHeadModel(config)


def token_dataset(samples: int = 16) -> list[dict[str, torch.Tensor]]:
    """Random token sequences, labels = inputs (the model shifts them)."""
    generator = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(samples):
        ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=generator)
        rows.append({"input_ids": ids, "labels": ids.clone()})
    return rows


class LoggedSteps(transformers.TrainerCallback):
    """What the Trainer logs every step: the loss and the gradient norm."""

    def __init__(self):
        self.losses: list[float] = []
        self.grad_norms: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))
            self.grad_norms.append(float(logs["grad_norm"]))


def training_arguments(tmp_path: pathlib.Path, steps: int, **overrides) -> "transformers.TrainingArguments":
    return transformers.TrainingArguments(
        output_dir=str(tmp_path / "trainer"), max_steps=steps, per_device_train_batch_size=4,
        learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
        disable_tqdm=True, seed=0, **overrides,
    )


def train(model: torch.nn.Module, tmp_path: pathlib.Path, steps: int, samples: int) -> LoggedSteps:
    logged = LoggedSteps()
    trainer = transformers.Trainer(
        model=model, args=training_arguments(tmp_path, steps), train_dataset=token_dataset(samples), callbacks=[logged]
    )
    trainer.train()
    assert len(logged.losses) == steps
    return logged


def assert_same_steps(expected: LoggedSteps, actual: LoggedSteps, *, rel: float) -> None:
    for step, (e, a) in enumerate(zip(expected.losses, actual.losses)):
        assert abs(a - e) <= rel * abs(e), f"step {step}: loss {a} vs uncompiled {e}"
    for step, (e, a) in enumerate(zip(expected.grad_norms, actual.grad_norms)):
        assert abs(a - e) <= rel * abs(e), f"step {step}: grad norm {a} vs uncompiled {e}"


def planned_graphs(dump_dir: pathlib.Path) -> list[dict]:
    """summary.json of every graph adacc planned (proof that it ran)."""
    return [json.loads(p.read_text()) for p in sorted(dump_dir.glob("graph_*/summary.json"))]


def _check_in_place_compile(
    tmp_path: pathlib.Path, backend: str, *, n_layer: int, steps: int, samples: int, dropout: float, rel: float
) -> tuple[torch.nn.Module, torch.nn.Module, list[dict]]:
    expected_model = tiny_gpt2(n_layer, dropout)
    expected = train(expected_model, tmp_path, steps, samples)

    model = tiny_gpt2(n_layer, dropout)
    keys = list(model.state_dict())
    dump = tmp_path / "dump"
    model.compile(backend=backend, options={"dump_dir": str(dump)})  # lossless default
    actual = train(model, tmp_path, steps, samples)

    assert_same_steps(expected, actual, rel=rel)
    summaries = planned_graphs(dump)
    assert summaries, "adacc planned no graph"
    assert sum(s["decisions"]["recompute"] for s in summaries) > 0
    # Compiled in place: checkpoints keep the model's own parameter names.
    assert list(model.state_dict()) == keys
    return expected_model, model, summaries


def test_trainer_in_place_compile_eager_matches_uncompiled(tmp_path):
    """``adacc_eager``: 3 AdamW steps with dropout, the same losses, gradient
    norms and final weights as the uncompiled Trainer."""
    expected_model, model, summaries = _check_in_place_compile(
        tmp_path, "adacc_eager", n_layer=2, steps=3, samples=12, dropout=0.1, rel=EAGER_REL
    )
    assert len(summaries) == 2  # GPT-2 breaks into its body and its loss
    expected = dict(expected_model.named_parameters())
    for name, param in model.named_parameters():
        assert relative_error(param, expected[name]) <= EAGER_REL, name


@pytest.mark.slow
def test_trainer_short_last_batch_recompiles_and_matches(tmp_path):
    """10 samples in batches of 4: the last batch is shorter, Dynamo
    recompiles both graphs for it and adacc plans them; the losses still
    equal the uncompiled Trainer's."""
    _, _, summaries = _check_in_place_compile(
        tmp_path, "adacc_eager", n_layer=1, steps=3, samples=10, dropout=0.1, rel=EAGER_REL
    )
    assert len(summaries) == 4


@pytest.mark.slow
def test_trainer_in_place_compile_inductor_matches_uncompiled(tmp_path):
    """``adacc`` (Inductor's C++ on CPU): losses and gradient norms within
    Inductor's round-off. (Weights after AdamW steps are not compared: Adam
    normalises each update, so round-off in small gradients is amplified.)"""
    _check_in_place_compile(tmp_path, "adacc", n_layer=1, steps=2, samples=8, dropout=0.1, rel=INDUCTOR_REL)


def test_torch_compile_backend_adacc_is_refused_by_accelerate(tmp_path):
    """What a user gets from ``TrainingArguments(torch_compile_backend="adacc")``:
    accelerate's dynamo plugin accepts only the backends it lists."""
    with pytest.raises(ValueError, match="'ADACC' is not a valid DynamoBackend"):
        transformers.Trainer(
            model=tiny_gpt2(1),
            args=training_arguments(tmp_path, 1, torch_compile_backend="adacc"),
            train_dataset=token_dataset(),
        )


def test_compiled_wrapper_loses_the_dataset_columns(tmp_path):
    """``torch.compile(model)`` handed to the Trainer: the wrapper's signature
    is ``(*args, **kwargs)``, so every column is removed before compiling."""
    trainer = transformers.Trainer(
        model=torch.compile(tiny_gpt2(1), backend="adacc_eager"),
        args=training_arguments(tmp_path, 1),
        train_dataset=token_dataset(),
    )
    with pytest.raises(ValueError, match="The batch received was empty"):
        trainer.train()
