"""Helpers for end-to-end tests: compile with a partitioner we can inspect."""

from __future__ import annotations

import random
from typing import Any, Callable

import torch
import torch.fx as fx

from adacc_compile.config import AdaccConfig
from adacc_examples.models import GPT, MLP, GPTConfig, Llama, LlamaConfig, gpt_batch, init_weights
from adacc_compile.partitioner import AdaccPartitioner


def compile_with_reports(
    model: torch.nn.Module, backend: str, options: dict[str, Any], **compile_kwargs: Any
) -> tuple[Callable[..., Any], AdaccPartitioner]:
    """``torch.compile`` through the same code path as ``backend=...``, keeping
    a handle on the partitioner so tests can read its reports."""
    partitioner = AdaccPartitioner(AdaccConfig.from_options(options))
    eager = {"adacc": False, "adacc_eager": True}[backend]
    return torch.compile(model, backend=partitioner.backend(eager=eager), **compile_kwargs), partitioner


def compile_capturing(model: torch.nn.Module, options: dict[str, Any], *, eager: bool = True, mode=None):
    """``torch.compile`` with adacc's pipeline as the partitioner, keeping
    every graph's `PartitionState` (candidates, solution, fw/bw modules).
    ``mode`` overrides the realization the planner assumes (by default the
    backend's: eager without fusion, Inductor with)."""
    from adacc_compile import compat_inductor
    from adacc_compile.passes.fusion import Realization
    from adacc_compile.stage_runner import run_pipeline
    from adacc_compile.state import PartitionState

    config = AdaccConfig.from_options(options)
    states = []

    def partition(gm, joint_inputs, **kwargs):
        state = PartitionState(
            joint=gm, config=config, num_fwd_outputs=kwargs["num_fwd_outputs"],
            static_lifetime_input_indices=list(kwargs.get("static_lifetime_input_indices") or []),
            mode=mode or (Realization.EAGER if eager else Realization.INDUCTOR),
        )
        run_pipeline(state)
        states.append(state)
        return state.fw_module, state.bw_module

    if eager:
        backend = lambda gm, ex: compat_inductor.eager_aot_compile(gm, ex, partition)  # noqa: E731
    else:
        backend = lambda gm, ex: compat_inductor.inductor_compile(gm, ex, {"custom_partitioner_fn": partition})  # noqa: E731
    return torch.compile(model, backend=backend), states


def loss_and_grads(model: torch.nn.Module, fn: Callable[..., torch.Tensor], *args, seed: int = 1):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = fn(*args)
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


EAGER_REL = 1e-5
"""Lossless plans on ``adacc_eager``: relative norm error per parameter."""
INDUCTOR_REL = 1e-4
"""Lossless plans on ``adacc`` (Inductor's fused C++ reorders float sums)."""


ROUND_OFF = 1e-6
"""A gradient whose norm is below this fraction of the whole gradient's is
round-off: a convolution bias followed by BatchNorm, whose mean subtraction
cancels the gradient (~1e-8 of the whole here). Relative to itself any
perturbation is huge, so its error is measured against the whole gradient."""


def relative_error(actual: torch.Tensor, expected: torch.Tensor, scale: float | None = None) -> float:
    """||actual - expected|| / ||expected|| (or / ``scale``)."""
    actual, expected = actual.detach().double(), expected.detach().double()
    scale = expected.norm().item() if scale is None else scale
    diff = (actual - expected).norm().item()
    return diff / scale if scale > 0 else diff


def worst_relative_error(expected, actual) -> tuple[float, str]:
    """The largest relative error over the loss and every parameter gradient."""
    (loss_e, grads_e), (loss_a, grads_a) = expected, actual
    assert grads_e.keys() == grads_a.keys()
    total = sum(g.double().norm().item() ** 2 for g in grads_e.values()) ** 0.5
    errors = {"loss": relative_error(loss_a, loss_e)}
    for name, grad in grads_e.items():
        round_off = grad.double().norm().item() < ROUND_OFF * total
        errors[name] = relative_error(grads_a[name], grad, total if round_off else None)
    name = max(errors, key=errors.get)
    return errors[name], name


def assert_same(expected, actual, *, rel: float) -> None:
    """Loss and every parameter gradient within relative norm ``rel`` of
    the reference: the measure of "same gradients" the whole suite uses."""
    worst, name = worst_relative_error(expected, actual)
    assert worst <= rel, f"{name}: relative error {worst:.3g} > {rel:.3g}"


def assert_same_buffers(expected: torch.nn.Module, actual: torch.nn.Module, *, rel: float) -> None:
    """Every buffer (BatchNorm running statistics, ...) within ``rel``."""
    bufs_e, bufs_a = dict(expected.named_buffers()), dict(actual.named_buffers())
    assert bufs_e.keys() == bufs_a.keys()
    for name in bufs_e:
        if bufs_e[name].is_floating_point():
            error = relative_error(bufs_a[name], bufs_e[name])
            assert error <= rel, f"buffer {name}: relative error {error:.3g} > {rel:.3g}"
        else:
            assert torch.equal(bufs_a[name], bufs_e[name]), f"buffer {name} differs"


def build(name: str):
    """A tiny model of kind "mlp", "gpt" (with dropout) or "llama" and a batch."""
    if name == "mlp":
        model = init_weights(MLP(d_in=16, d_hidden=64, depth=3))
        gen = torch.Generator().manual_seed(0)
        return model, (torch.randn(8, 16, generator=gen), torch.randn(8, generator=gen))
    if name == "gpt":
        cfg = GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, vocab_size=64, dropout=0.1)
        return init_weights(GPT(cfg)), gpt_batch(cfg, 2, torch.Generator().manual_seed(0))
    cfg = LlamaConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, vocab_size=64, ffn_dim=64)
    return init_weights(Llama(cfg)), gpt_batch(cfg, 2, torch.Generator().manual_seed(0))


def record_compress_inputs(monkeypatch) -> list[tuple[str, torch.Tensor]]:
    """adacc_eager runs graphs through fx.Interpreter: record what every
    codec's compress receives (the real activation), whether the codec is a
    custom op or spliced in as aten ops (`compress_rewrite.CODEC_NODE`)."""
    from adacc_compile.passes.compress_rewrite import CODEC_NODE

    seen: list[tuple[str, torch.Tensor]] = []
    original = fx.Interpreter.run_node

    def run_node(self, node):
        name = str(node.target)
        tag = node.meta.get(CODEC_NODE)
        if node.op == "call_function" and name.startswith("adacc.") and name.split(".")[1].endswith("_compress"):
            value = self.env[node.args[0]]
            seen.append((name.split(".")[1].removesuffix("_compress"), value.detach().clone()))
        elif tag is not None and tag.role == "compress":
            recorded = getattr(self, "_adacc_recorded", set())
            self._adacc_recorded = recorded
            for arg in node.all_input_nodes:
                if arg.name == tag.value and arg.name not in recorded:
                    recorded.add(arg.name)
                    seen.append((tag.codec, self.env[arg].detach().clone()))
        return original(self, node)

    monkeypatch.setattr(fx.Interpreter, "run_node", run_node)
    return seen


def conv_bn_net(dropout: float = 0.0, blocks: int = 2) -> torch.nn.Module:
    """Conv-BN-ReLU blocks (Dropout after the first when ``dropout``), then a
    linear head; input (4, 3, 8, 8)."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    channels = 3
    for i in range(blocks):
        layers += [torch.nn.Conv2d(channels, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU()]
        if dropout and i == 0:
            layers.append(torch.nn.Dropout(dropout))
        channels = 8
    return torch.nn.Sequential(*layers, torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10))


WIDTH = 16

BLOCKS = (
    "linear", "tanh", "gelu", "buffer_add", "buffer_update", "batch_norm", "chunk", "var_mean",
    "inplace", "dropout", "counter",
)


class RandomNet(torch.nn.Module):
    """A seeded random sequence of `BLOCKS` on a (batch, WIDTH) input: buffers
    updated in place, multi-output ops, in-place ops on intermediates,
    BatchNorm, dropout."""

    def __init__(self, seed: int):
        super().__init__()
        rng = random.Random(seed)
        torch.manual_seed(seed)
        self.blocks = ["linear"] + rng.choices(BLOCKS, k=rng.randint(5, 9)) + ["buffer_update"]
        self.linears = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for b in self.blocks if b == "linear")
        self.norms = torch.nn.ModuleList(torch.nn.BatchNorm1d(WIDTH) for b in self.blocks if b == "batch_norm")
        self.register_buffer("shift", torch.randn(WIDTH) * 0.1)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.head = torch.nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        linears, norms = iter(self.linears), iter(self.norms)
        h = x
        for block in self.blocks:
            if block == "linear":
                h = next(linears)(h)
            elif block == "tanh":
                h = torch.tanh(h)
            elif block == "gelu":
                h = torch.nn.functional.gelu(h)
            elif block == "buffer_add":
                h = h + self.shift
            elif block == "buffer_update":  # after reads of `shift` above
                with torch.no_grad():
                    self.shift.mul_(0.9).add_(0.1 * h.mean(0))
            elif block == "batch_norm":
                h = next(norms)(h)
            elif block == "chunk":
                a, b = h.chunk(2, dim=-1)
                h = torch.cat([a * torch.sigmoid(b), a + b], dim=-1)
            elif block == "var_mean":
                var, mean = torch.var_mean(h, dim=-1, keepdim=True)
                h = (h - mean) * torch.rsqrt(var + 1e-5)
            elif block == "inplace":
                h = h * 1.5
                h.add_(0.25)
            elif block == "dropout":
                h = torch.nn.functional.dropout(h, 0.2, self.training)
            elif block == "counter":
                self.steps.add_(1)
        return (self.head(h).squeeze(-1) - x.sum(-1)).pow(2).mean() + h.square().mean()


class TinyBert(torch.nn.Module):
    """A BERT-style encoder: bidirectional attention (PyTorch's
    TransformerEncoderLayer, post-norm, GELU, dropout) and a token head;
    ``forward(idx, targets)`` returns the mean cross-entropy."""

    def __init__(self, vocab: int = 64, d_model: int = 32, heads: int = 4, layers: int = 2, seq_len: int = 16):
        super().__init__()
        torch.manual_seed(0)
        self.tokens = torch.nn.Embedding(vocab, d_model)
        self.positions = torch.nn.Embedding(seq_len, d_model)
        self.norm = torch.nn.LayerNorm(d_model)
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.1, activation="gelu", batch_first=True)
            for _ in range(layers)
        )
        self.head = torch.nn.Linear(d_model, vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.norm(self.tokens(idx) + self.positions(pos))
        for layer in self.layers:
            x = layer(x)
        return torch.nn.functional.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


def build_bert():
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 64, (2, 16), generator=gen)
    return TinyBert(), (idx, torch.randint(0, 64, (2, 16), generator=gen))


class TwoGraphs(torch.nn.Module):
    """A body and a head separated by a graph break, like a Hugging Face
    model whose loss Dynamo cannot trace."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.GELU())
        self.head = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 1))

    def forward(self, x):
        h = self.body(x)
        torch._dynamo.graph_break()
        return self.head(h).square().mean()
