"""What ``adacc plan MODEL`` plans: a Hugging Face config, a preset, or a
user's factory, built so that nothing is allocated.

MODEL is, in the order tried:

* a path to a ``config.json`` (or a folder holding one): the config of a
  Hugging Face model, built with ``AutoModelForCausalLM.from_config``;
* ``module:factory``: ``factory()`` returns an ``nn.Module`` whose forward
  takes ``(ids, labels)`` and returns the loss (a tensor, or an object with
  ``.loss`` as Hugging Face models return), or a Hugging Face model;
* a preset of `PRESETS` (``llama-2-7b``, ...): config keyword arguments
  written here, since nothing is ever downloaded;
* the name of an architecture transformers ships (``llama``, ``gpt2``,
  ``mistral``, ...): that config class's defaults.

Models are built by `ModelSource.build`, which the caller runs under fake
tensors (`compat_tracing.fake_tensors`) and the chosen default dtype, so a 7B model
costs no memory. transformers is optional (the ``[hf]`` extra): only the
routes that need it import it, and say so when it is missing.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch

PRESETS: dict[str, dict[str, Any]] = {
    "llama-2-7b": dict(model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                       max_position_embeddings=4096, rms_norm_eps=1e-5),
    "llama-2-13b": dict(model_type="llama", hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                        num_attention_heads=40, num_key_value_heads=40, vocab_size=32000,
                        max_position_embeddings=4096, rms_norm_eps=1e-5),
    "llama-2-70b": dict(model_type="llama", hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                        num_attention_heads=64, num_key_value_heads=8, vocab_size=32000,
                        max_position_embeddings=4096, rms_norm_eps=1e-5),
    "llama-3-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                       max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0),
    "mistral-7b": dict(model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                       max_position_embeddings=32768, rms_norm_eps=1e-5, sliding_window=4096),
    "gpt2": dict(model_type="gpt2"),
    "gpt2-medium": dict(model_type="gpt2", n_layer=24, n_embd=1024, n_head=16),
    "gpt2-large": dict(model_type="gpt2", n_layer=36, n_embd=1280, n_head=20),
    "gpt2-xl": dict(model_type="gpt2", n_layer=48, n_embd=1600, n_head=25),
}
"""Well-known shapes as config keyword arguments (from the models' published
``config.json`` files)."""


class ModelNotFound(ValueError):
    """MODEL names nothing `resolve_model` can build."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSource:
    label: str
    """What the user named."""
    description: str
    """One line: the route and the main shape figures."""
    build: Callable[[], torch.nn.Module]
    """Returns a module ``forward(ids, labels) -> loss``; call it under fake
    tensors and the default dtype to build in."""
    max_positions: int | None = None
    """The config's ``max_position_embeddings`` (None when unknown)."""
    layers: int | None = None
    """Depth of the block stack (None when unknown: a user factory)."""
    with_layers: Callable[[int], "ModelSource"] | None = None
    """The same model with fewer identical blocks (depth folding,
    `passes.depth_fold`); None where the blocks may differ."""


def resolve_model(name: str, *, tp: int = 1) -> ModelSource:
    """The `ModelSource` for MODEL (see the module docstring); ``tp`` > 1
    plans one rank's shard of a tensor-parallel model (`shard_config`)."""
    path = os.path.join(name, "config.json") if os.path.isdir(name) else name
    if os.path.isfile(path):
        with open(path) as f:
            kwargs = json.load(f)
        if "model_type" not in kwargs:
            raise ModelNotFound(f"{path} has no 'model_type': not a Hugging Face config.json")
        return _hf_source(name, kwargs, f"config {path}", tp)
    if ":" in name:
        return _factory_source(name, tp)
    key = name.lower()
    if key in PRESETS:
        return _hf_source(name, dict(PRESETS[key]), f"preset {key}", tp)
    transformers = _transformers(f"MODEL {name!r}")
    model_type = key.replace("-", "_")
    if model_type in transformers.CONFIG_MAPPING:
        return _hf_source(name, {"model_type": model_type}, f"transformers {model_type} defaults", tp)
    raise ModelNotFound(
        f"unknown model {name!r}: not a config.json path, not module:factory, not a preset "
        f"({', '.join(sorted(PRESETS))}) and not an architecture transformers {transformers.__version__} ships"
    )


def _transformers(what: str) -> Any:
    try:
        import transformers
    except ImportError:
        raise ModelNotFound(
            f"{what} needs transformers (Hugging Face configs): pip install 'adacc-compile[hf]'"
        ) from None
    return transformers


def _hf_source(label: str, kwargs: dict[str, Any], route: str, tp: int) -> ModelSource:
    transformers = _transformers(f"MODEL {label!r}")
    kwargs = dict(kwargs)
    model_type = kwargs.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    config.use_cache = False
    if tp > 1:
        config = shard_config(config, tp)
    return _config_source(label, config, model_type, route, tp)


def _config_source(label: str, config: Any, model_type: str, route: str, tp: int) -> ModelSource:
    transformers = _transformers(f"MODEL {label!r}")
    # The model's module is imported here, outside the fake tensors `build`
    # runs under: some run tensor code at import time, which fake tensors
    # refuse (GPT-2's module did, through transformers' kernel checks).
    try:
        model_class = transformers.AutoModelForCausalLM._model_mapping[type(config)]
    except (KeyError, ValueError):
        model_class = None

    def build() -> torch.nn.Module:
        if model_class is None:
            raise ModelNotFound(f"{label}: {model_type} has no causal-LM model in transformers")
        return HFCausalLoss(transformers.AutoModelForCausalLM.from_config(config))

    shape = ", ".join(
        f"{key} {getattr(config, attr)}"
        for key, attr in (("layers", "num_hidden_layers"), ("hidden", "hidden_size"),
                          ("heads", "num_attention_heads"), ("vocab", "vocab_size"))
        if getattr(config, attr, None) is not None
    )
    ffn = getattr(config, "intermediate_size", None)
    shape += f", FFN {ffn}" if ffn else ""
    layers = getattr(config, "num_hidden_layers", None)
    return ModelSource(
        label=label,
        description=f"{label} ({route}; {model_type}: {shape}" + (f"; TP shard 1/{tp}" if tp > 1 else "") + ")",
        build=build,
        max_positions=getattr(config, "max_position_embeddings", None),
        layers=layers if isinstance(layers, int) else None,
        with_layers=(lambda k: _config_source(label, _shallower(config, k), model_type, route, tp))
        if _uniform_layers(config) else None,
    )


def _uniform_layers(config: Any) -> bool:
    """Every layer is built alike (no per-layer types such as sliding-window
    and full attention alternating)."""
    types = getattr(config, "layer_types", None)
    return not types or len(set(types)) == 1


def _shallower(config: Any, layers: int) -> Any:
    shallow = copy.deepcopy(config)
    shallow.num_hidden_layers = layers
    types = getattr(shallow, "layer_types", None)
    if types:
        shallow.layer_types = list(types)[:layers]
    return shallow


def shard_config(config: Any, tp: int) -> Any:
    """One rank's shapes under Megatron-style tensor parallelism of degree
    ``tp``: attention heads, key/value heads, FFN width and vocabulary
    divided by ``tp`` (column/row-parallel linears, vocab-parallel head), the
    hidden size and head size unchanged. The collectives themselves are not
    in the traced graph, so no communication windows are planned."""
    fields = ("num_attention_heads", "intermediate_size", "vocab_size")
    missing = [f for f in fields if getattr(config, f, None) is None]
    if missing:
        raise ModelNotFound(f"--tp needs a config with {', '.join(fields)}; {config.model_type} lacks {missing}")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    for field, value in (("num_attention_heads", config.num_attention_heads), ("num_key_value_heads", kv),
                         ("intermediate_size", config.intermediate_size)):
        if value % tp:
            raise ModelNotFound(f"--tp {tp} does not divide {field} {value}")
    sharded = config.to_dict()
    sharded.update(
        num_attention_heads=config.num_attention_heads // tp,
        num_key_value_heads=kv // tp,
        intermediate_size=config.intermediate_size // tp,
        vocab_size=-(-config.vocab_size // tp),
        head_dim=head_dim,
    )
    return type(config).from_dict(sharded)


def _factory_source(name: str, tp: int) -> ModelSource:
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ModelNotFound(f"module:factory {name!r}: cannot import {module_name!r} ({error})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelNotFound(f"module:factory {name!r}: {module_name} has no callable {attr!r}")
    if tp > 1:
        raise ModelNotFound("--tp applies to Hugging Face configs; a factory builds its own shard")

    def build() -> torch.nn.Module:
        model = factory()
        if not isinstance(model, torch.nn.Module):
            raise ModelNotFound(f"{name}() returned {type(model).__name__}, not an nn.Module")
        return HFCausalLoss(model) if _is_hf_model(model) else LossOf(model)

    return ModelSource(label=name, description=f"{name} (user factory)", build=build)


def _is_hf_model(model: torch.nn.Module) -> bool:
    return hasattr(model, "config") and hasattr(model, "can_generate") and hasattr(model, "get_input_embeddings")


class HFCausalLoss(torch.nn.Module):
    """A Hugging Face causal LM as ``forward(ids, labels) -> (loss,
    logits)``, so Dynamo traces body and loss as one graph.

    The loss is computed here, as transformers' ``ForCausalLMLoss`` computes
    it (float logits, labels shifted by padding with -100, mean cross
    entropy), rather than through ``labels=``: for some architectures (GPT-2)
    the model's ``loss_function`` calls ``logger.warning_once``, which breaks
    Dynamo's graph before the loss (and prints a warning into the user's
    output). The logits are returned beside the loss, as the model called
    with ``labels=`` returns them: the step then holds what that call's
    backward holds, the zeros autograd makes for the logits' gradient
    (`passes.tangents`; a logits buffer, 2 GiB for a 32k vocabulary at
    batch 8 x seq 4096 in bf16), which a loss-only graph leaves out."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(input_ids=ids, use_cache=False).logits
        wide = logits.float()
        shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
        loss = torch.nn.functional.cross_entropy(
            wide.reshape(-1, wide.shape[-1]), shifted.reshape(-1), ignore_index=-100
        )
        return loss, logits


class LossOf(torch.nn.Module):
    """A user module's ``forward(ids, labels)`` reduced to its loss tensor."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        out = self.model(ids, labels)
        if isinstance(out, torch.Tensor):
            return out
        if getattr(out, "loss", None) is not None:
            return out.loss
        if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
            return out[0]
        raise TypeError(f"the model returned {type(out).__name__}; adacc plan needs the loss tensor")

