"""Gradient sensitivity: what a lossy codec's error on a saved value does to
the gradients the backward computes from it.

Reads: the joint graph, its forward/backward split, real values for the
primal inputs, and the (value, codec) options to measure. Writes nothing;
returns one `GradientError` per option it could measure.

Why: a codec bounds the relative error of the value it restores, not of the
gradients computed from it. Where the backward's use of a value is linear
in it (a matmul's saved input) the two errors match; where the use cancels
nearly equal terms (attention's ``rowsum(dO * O)`` against ``dP`` once
attention is sharp) or goes through a nonlinearity's derivative, a small
error in the value becomes a large one in the gradient (measured on a
GPT-2 with sharpened attention: 0.35% on the value, 5-9% on the query and
key gradients). `lossy_uses` names the uses known to do this; this pass
measures every use instead of assuming.

How: every backward op that reads the value (directly or through views of
it) runs twice on the real batch, once on the value and once on its codec
round trip (as the compiled graph runs it: in storage order, with the
calibrated parameters), together with the elementwise backward ops that
follow it (up to `CHAIN_LIMIT` ops: an activation's backward multiplies by
further derivative factors, which can grow an error the reading op's own
output hides); the option's gradient error is the largest relative error
(Frobenius) among those ops' tensor outputs. The upstream gradients those
ops read depend on the loss and on later layers, which are not run here:
they are seeded Gaussian noise of their shape, the same in both runs. The
amplification this pass looks for is a property of the saved value and the
ops (near one-hot attention cancels for any upstream gradient), not of one
particular upstream gradient. Backward inputs that do not depend on the
tangents (a transposed weight, a recomputed mask) are computed from the
real forward values. What it does not see: the error carried on through
matmuls and reductions further down the backward, and several compressed
values' errors adding up.

A few-bit codec that gives back a derivative (`DecompressKind.DERIVATIVE`)
is measured on the backward op it replaces: the gradient times the
decompressed derivative against the op's exact output.

Memory: the ops run as soon as their inputs exist (each reading op right
after the forward produced what it reads), and every value is freed after
its last use here, so the run holds about what one layer's forward and
backward hold, not the whole forward.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx as fx

from adacc_compile import compat
from adacc_compile.kernels import DecompressKind, get_codec

from .annotate import META_KEY
from .graph_walk import ancestors, get_attr, seeded_real_run
from .op_class import OpClass, is_view_op
from .storage_order import inverse, storage_permutation

SEED = 0
"""Seed of the upstream-gradient noise and of random forward ops."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GradientError:
    """One option's worst gradient error over the backward ops reading it."""

    value: str
    codec: str
    error: float
    """Relative error (Frobenius) of the worst reading op's output."""
    reader: str
    """The backward node whose output it is."""
    op: str


@dataclass(frozen=True, slots=True)
class _Reads:
    """One backward op reading candidate values (directly or through views),
    with the elementwise backward ops after it (`_elementwise_chain`)."""

    reader: fx.Node
    values: tuple[fx.Node, ...]
    chain: tuple[fx.Node, ...]
    """``reader`` first, then its elementwise followers, in graph order."""

    def inputs(self) -> list[fx.Node]:
        """What the chain reads from outside it."""
        members, out = set(self.chain), []
        for node in self.chain:
            for a in node.all_input_nodes:
                if a not in members and a not in out:
                    out.append(a)
        return out


#: At most this many backward ops are run per check: the reading op and the
#: elementwise ops that follow it.
CHAIN_LIMIT = 8
_ELEMENTWISE = (OpClass.ELEMENTWISE, OpClass.ACTIVATION, OpClass.VIEW)


def _elementwise_chain(reader: fx.Node, backward: frozenset[fx.Node]) -> tuple[fx.Node, ...]:
    """``reader`` and the elementwise backward ops fed by it (and by each
    other), up to `CHAIN_LIMIT` ops, in graph order. Why: an activation's
    backward multiplies what the reading op gives by further derivative
    factors, elementwise, and those can grow an error the reading op's own
    output hides (a saturated tanh: ``1 - y^2`` near zero where the
    codec's rounding of ``y`` is not, then times a factor growing with the
    square of the input)."""
    chain, frontier = [reader], [reader]
    while frontier and len(chain) < CHAIN_LIMIT:
        for user in frontier.pop(0).users:
            kind = getattr(user.meta.get(META_KEY), "op_class", None)
            if user in backward and user.op == "call_function" and kind in _ELEMENTWISE and user not in chain:
                chain.append(user)
                frontier.append(user)
                if len(chain) == CHAIN_LIMIT:
                    break
    order = {n: i for i, n in enumerate(reader.graph.nodes)}
    return tuple(sorted(chain, key=order.__getitem__))


def gradient_errors(
    gm: fx.GraphModule,
    info: compat.JointGraphInfo,
    options: dict[fx.Node, Sequence[str]],
    real_inputs: Sequence[Any],
    parameters: dict[tuple[str, str], torch.Tensor] | None = None,
) -> dict[tuple[str, str], GradientError]:
    """(value name, codec) -> its measured `GradientError`, for every option
    in ``options`` (value node -> codecs) read by a backward op this pass
    can run; an option with no such reader is absent."""
    parameters = parameters or {}
    backward = info.backward_nodes
    aliases = {value: _aliases(value) for value in options}
    reads: dict[fx.Node, list[fx.Node]] = {}
    for value, group in aliases.items():
        for alias in group:
            for user in alias.users:
                if user in backward and user.op == "call_function" and value not in reads.get(user, ()):
                    reads.setdefault(user, []).append(value)
    checks = [_Reads(reader, tuple(values), _elementwise_chain(reader, backward)) for reader, values in reads.items()]
    needed = _needed(checks, aliases, backward)
    runnable = _runnable(gm, needed)
    checks = [c for c in checks if all(a in runnable or a in backward for a in c.inputs())]
    if not checks:
        return {}
    steps = _schedule(gm, needed & runnable, checks)
    primals = [n for n in gm.graph.nodes if n.op == "placeholder" and compat.is_primal(n)]
    return _run(gm, steps, primals, real_inputs, options, aliases, backward, parameters)


def _aliases(value: fx.Node) -> list[fx.Node]:
    """``value`` and every view of it (views of views too), in graph order."""
    seen, stack = {value}, [value]
    while stack:
        for user in stack.pop().users:
            if is_view_op(user) and user not in seen and user.args and user.args[0] in seen:
                seen.add(user)
                stack.append(user)
    order = {n: i for i, n in enumerate(value.graph.nodes)}
    return sorted(seen, key=order.__getitem__)


def _needed(checks: list[_Reads], aliases: dict[fx.Node, list[fx.Node]], backward: frozenset[fx.Node]) -> set[fx.Node]:
    """The tangent-free nodes the checks read, with their ancestors."""
    return ancestors([a for c in checks for a in c.inputs() if a not in backward]
                     + [a for c in checks for v in c.values for a in aliases[v]])


def _runnable(gm: fx.GraphModule, needed: set[fx.Node]) -> set[fx.Node]:
    """The needed nodes that can run here: from primals and constants, by
    ops that neither mutate nor communicate."""
    ok: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node not in needed:
            continue
        if node.op == "placeholder":
            good = compat.is_primal(node)
        elif node.op == "get_attr":
            good = True
        elif node.op == "call_function":
            good = (
                not compat.is_mutating(node)
                and getattr(node.meta.get(META_KEY), "op_class", None) is not OpClass.COLLECTIVE
                and all(a in ok for a in node.all_input_nodes)
            )
        else:
            good = False
        if good:
            ok.add(node)
    return ok


def _schedule(gm: fx.GraphModule, nodes: set[fx.Node], checks: list[_Reads]) -> list[fx.Node | _Reads]:
    """Nodes and checks in an order that runs each check, and each node the
    backward part of a check needs, as soon as its inputs exist (the
    forward otherwise in graph order), so that little is held at once."""
    index = {n: i for i, n in enumerate(gm.graph.nodes)}
    first_backward = min((index[c.reader] for c in checks), default=len(index))
    items: list[fx.Node | _Reads] = [*sorted(nodes, key=index.__getitem__), *checks]

    def inputs(item: fx.Node | _Reads) -> list[fx.Node]:
        own = [a for a in (item.inputs() if isinstance(item, _Reads) else item.all_input_nodes) if a in nodes]
        if isinstance(item, _Reads):
            own = [a for a in own if a not in item.values]
            own += list(item.values)
        return own

    def priority(item: fx.Node | _Reads) -> tuple[int, int]:
        if isinstance(item, _Reads):
            return (0, index[item.reader])
        return (0, index[item]) if index[item] > first_backward else (1, index[item])

    waiting = {id(item): len(set(inputs(item))) for item in items}
    dependents: dict[fx.Node, list[fx.Node | _Reads]] = {}
    for item in items:
        for a in set(inputs(item)):
            dependents.setdefault(a, []).append(item)
    ready = [(priority(i), n, i) for n, i in enumerate(items) if waiting[id(i)] == 0]
    heapq.heapify(ready)
    order: list[fx.Node | _Reads] = []
    position = {id(i): n for n, i in enumerate(items)}
    while ready:
        _, _, item = heapq.heappop(ready)
        order.append(item)
        if isinstance(item, _Reads):
            continue
        for dep in dependents.get(item, ()):
            waiting[id(dep)] -= 1
            if waiting[id(dep)] == 0:
                heapq.heappush(ready, (priority(dep), position[id(dep)], dep))
    return order


def _run(
    gm: fx.GraphModule,
    steps: list[fx.Node | _Reads],
    primals: list[fx.Node],
    real_inputs: Sequence[Any],
    options: dict[fx.Node, Sequence[str]],
    aliases: dict[fx.Node, list[fx.Node]],
    backward: frozenset[fx.Node],
    parameters: dict[tuple[str, str], torch.Tensor],
) -> dict[tuple[str, str], GradientError]:
    last_use: dict[fx.Node, int] = {}
    for i, step in enumerate(steps):
        if isinstance(step, _Reads):
            used = [a for a in step.inputs() if a not in backward]
            used += [a for v in step.values for a in aliases[v]]
        else:
            used = step.all_input_nodes
        for a in used:
            last_use[a] = i
    env: dict[fx.Node, Any] = {}
    out: dict[tuple[str, str], GradientError] = {}
    inputs = set(primals)
    with seeded_real_run(real_inputs, SEED):
        for node, real in zip(primals, real_inputs):
            env[node] = real.detach() if isinstance(real, torch.Tensor) else real
        for i, step in enumerate(steps):
            if isinstance(step, _Reads):
                for error in _check(step, env, options, aliases, backward, parameters):
                    key = (error.value, error.codec)
                    if key not in out or not error.error <= out[key].error:
                        out[key] = error
                used = step.inputs() + [a for v in step.values for a in aliases[v]]
            else:
                if step.op == "call_function":
                    args, kwargs = fx.node.map_arg((step.args, step.kwargs), env.__getitem__)
                    env[step] = step.target(*args, **kwargs)
                elif step.op == "get_attr":
                    env[step] = get_attr(gm, str(step.target))
                used = [*step.all_input_nodes, step]
            for a in used:
                if last_use.get(a, -1) <= i and a not in inputs:
                    env.pop(a, None)
    return out


def _check(
    step: _Reads,
    env: dict[fx.Node, Any],
    options: dict[fx.Node, Sequence[str]],
    aliases: dict[fx.Node, list[fx.Node]],
    backward: frozenset[fx.Node],
    parameters: dict[tuple[str, str], torch.Tensor],
) -> list[GradientError]:
    """Runs one reading op and its elementwise followers on the exact
    values and on each option's round trip of each value it reads; the
    option's error is the worst over the chain's outputs."""
    reader = step.reader
    generator = torch.Generator(device="cpu").manual_seed(SEED)
    device = next((t.device for t in env.values() if isinstance(t, torch.Tensor)), torch.device("cpu"))
    upstream: dict[fx.Node, torch.Tensor] = {}
    for a in step.inputs():
        if a in backward:
            val = a.meta.get("val")
            if not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point:
                return []
            if any(not isinstance(s, int) for s in val.shape):
                return []
            upstream[a] = torch.randn(tuple(val.shape), generator=generator, dtype=torch.float32).to(device, val.dtype)

    def run(values: dict[fx.Node, Any], first: Any = None) -> dict[fx.Node, Any]:
        """The chain's outputs; ``first`` replaces the reading op's."""
        local: dict[fx.Node, Any] = {}

        def get(a: fx.Node) -> Any:
            if a in local:
                return local[a]
            return upstream[a] if a in upstream else values.get(a, env.get(a))

        for node in step.chain:
            if node is reader and first is not None:
                local[node] = first
                continue
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), get)
            local[node] = node.target(*args, **kwargs)
        return local

    exact = run({})
    out = []
    for value in step.values:
        x = env.get(value)
        if not isinstance(x, torch.Tensor) or x.numel() == 0:
            continue
        for name in options[value]:
            codec = get_codec(name)
            if codec.decompress_kind is DecompressKind.DERIVATIVE:
                if reader.target is not codec.replaced_op or reader.args[1] is not value:
                    continue
                grad = upstream.get(reader.args[0], env.get(reader.args[0]))
                approx = run({}, first=grad * _round_trip(codec, x, parameters.get((value.name, name))))
            else:
                restored = {value: _round_trip(codec, x, parameters.get((value.name, name)))}
                for alias in aliases[value][1:]:
                    args, kwargs = fx.node.map_arg(
                        (alias.args, alias.kwargs), lambda a: restored.get(a, env.get(a))
                    )
                    restored[alias] = alias.target(*args, **kwargs)
                approx = run(restored)
            errors = {node: _relative_error(approx[node], exact[node]) for node in step.chain}
            worst = max(step.chain, key=lambda n: (not math.isfinite(errors[n]), errors[n]))
            if math.isfinite(errors[worst]) and not errors[worst] > 1.01 * errors[reader]:
                worst = reader  # a view or a product that only carries the error on: name where it arose
            op = _op_name(worst) if worst is reader else f"{_op_name(worst)} after {_op_name(reader)}"
            out.append(GradientError(value=value.name, codec=name, error=errors[worst], reader=worst.name, op=op))
    return out


def _op_name(node: fx.Node) -> str:
    return str(getattr(node.target, "__name__", node.target))


def _round_trip(codec: Any, x: torch.Tensor, parameters: torch.Tensor | None) -> torch.Tensor:
    """The value as the compiled backward sees it after the codec (in
    storage order, `storage_order`, and back)."""
    order = storage_permutation(x)
    stored = x if order is None else x.permute(order)
    if parameters is None:
        payload = codec.aten_compress(stored)
    else:
        payload = codec.aten_compress(stored, parameters.to(x.device))
    restored = codec.aten_decompress(payload, tuple(stored.shape), stored.dtype)
    return restored if order is None else restored.permute(inverse(order))


def _relative_error(approx: Any, exact: Any) -> float:
    """The largest relative error (Frobenius) over the tensor outputs."""
    pairs = list(zip(approx, exact)) if isinstance(exact, (tuple, list)) else [(approx, exact)]
    worst = 0.0
    for a, e in pairs:
        if not isinstance(e, torch.Tensor) or not isinstance(a, torch.Tensor) or not e.dtype.is_floating_point:
            continue
        diff = torch.linalg.vector_norm((a.double() - e.double()).flatten()).item()
        norm = torch.linalg.vector_norm(e.double().flatten()).item()
        error = (0.0 if diff == 0 else math.inf) if norm == 0 else diff / norm
        if not math.isfinite(error) or error > worst:
            worst = error
            if not math.isfinite(error):
                break
    return worst
