"""Which values calibration measures: a few blocks of each class of
identical blocks, the others inheriting their verdicts.

Why: calibration round-trips every lossy option on its real value and runs
the backward ops that read it (`calibrate`, `gradient_sensitivity`), so its
cost grows with depth: a 4-layer HF Llama (d_model 256) spent 13 s there,
more than the rest of the plan stage, and a 32-layer one would spend
minutes. The plan shares one set of decisions across a class of identical
blocks anyway (`structure`), so it needs one verdict per option per
position of the block, not one per layer.

Of each class (`structure.block_classes`, found on the candidates before
calibration, when identical blocks still offer the same options) the
first, middle and last block in the forward are measured (`SAMPLED_BLOCKS`;
every block of a class of three or fewer). A value of another block of the
class is a *stand-in*: its options take the verdict of the same position in
the measured blocks, accepted only where every measured one is, with the
statistics and gradient error of the worst of them; a codec that takes
parameters (int8_smooth's channel factors, fp8 scales) still has them
measured on the stand-in's own value, which the forward computes anyway.
The verdicts of a position are made the same in every block of the class,
so a rejection in one block no longer splits the class (a 4-layer Llama
once planned three blocks as a class and one apart for that reason).

What it gives up: a stand-in's own error is not measured. The drift
monitor watches the measured values only (a stand-in has no reference of
its own to drift from); drift that affects every layer alike, as attention
sharpening does, shows in the measured ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

import torch.fx as fx

from .plan_problem import PlanProblem
from .structure import block_classes, candidates_by_block

if TYPE_CHECKING:
    from .calibrate import OptionCalibration

SAMPLED_BLOCKS = 3
"""Blocks measured per class of identical blocks: the first, the middle and
the last in the forward."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationSample:
    stand_ins: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Value of an unmeasured block -> the values at its position in the
    measured blocks of its class."""
    positions: tuple[tuple[str, ...], ...] = ()
    """Each position of each class: its values in every block of the class
    (measured blocks first), whose verdicts are made the same."""

    @property
    def used(self) -> bool:
        return bool(self.stand_ins)


def calibration_sample(problem: PlanProblem, nodes: Mapping[str, fx.Node]) -> CalibrationSample:
    """The stand-ins and positions of ``problem``'s classes of identical
    blocks (none where no class has more than `SAMPLED_BLOCKS` blocks)."""
    blocks = candidates_by_block(problem)
    stand_ins: dict[str, tuple[str, ...]] = {}
    positions: list[tuple[str, ...]] = []
    for block_class in block_classes(problem, dict(nodes)):
        measured = _measured_blocks(block_class)
        others = [b for b in block_class if b not in measured]
        for row in zip(*(blocks[b] for b in (*measured, *others))):
            names = tuple(c.name for c in row)
            positions.append(names)
            for name in names[len(measured):]:
                stand_ins[name] = names[:len(measured)]
    return CalibrationSample(stand_ins=stand_ins, positions=tuple(positions))


def _measured_blocks(block_class: tuple[str, ...]) -> tuple[str, ...]:
    """The class's first, middle and last block in the forward (the class
    lists them last in the forward first)."""
    if len(block_class) <= SAMPLED_BLOCKS:
        return block_class
    picks = (block_class[-1], block_class[len(block_class) // 2], block_class[0])
    return tuple(dict.fromkeys(picks))


def worst(options: list["OptionCalibration"]) -> "OptionCalibration":
    """The measurement to stand for a position: a rejected one first, then
    the largest value error, then the largest gradient error."""

    def key(o: "OptionCalibration") -> tuple:
        error = o.stats.relative_error if o.stats is not None else float("inf")
        gradient = o.gradient.error if o.gradient is not None else 0.0
        return (not o.accepted, _finite(error), _finite(gradient))

    return max(options, key=key)


def _finite(x: float) -> float:
    return x if x == x else float("inf")  # NaN sorts as the worst


OptionsByValue = dict[str, dict[str, "OptionCalibration"]]
"""Value -> codec -> its measurement, as `calibrate.Calibration.options`."""


def uniform_verdicts(options: OptionsByValue, sample: CalibrationSample) -> OptionsByValue:
    """``options`` (value -> codec -> `calibrate.OptionCalibration`, the
    measured values complete, each stand-in holding its own parameters
    only) with every stand-in's verdict, statistics and gradient error
    taken from the worst measured value at its position, and each
    position's verdict the same in every block of the class."""
    out = {value: dict(per) for value, per in options.items()}
    for names in sample.positions:
        measured = [n for n in names if n not in sample.stand_ins and n in options]
        if not measured:
            continue
        for codec in options[measured[0]]:
            found = [options[n][codec] for n in measured if codec in options[n]]
            stand = worst(found)
            accepted = all(o.accepted for o in found)
            for name in names:
                own = out.get(name, {}).get(codec)
                if name in sample.stand_ins:
                    parameters = own.parameters if own is not None else None
                    failed = own is None or not own.accepted  # its parameters could not be measured
                    reason = stand.reason
                    if failed:
                        reason = own.reason if own is not None else "not reached by the forward"
                    out.setdefault(name, {})[codec] = dataclasses.replace(
                        stand, value=name, parameters=parameters, accepted=accepted and not failed,
                        reason=reason, inherited_from=stand.value,
                    )
                elif own is not None and own.accepted and not accepted:
                    out[name][codec] = dataclasses.replace(
                        own, accepted=False,
                        reason=f"rejected at the same position of an identical block ({stand.value}: {stand.reason})",
                    )
    return out
