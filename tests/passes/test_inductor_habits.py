"""The table of Inductor habits the memory model mirrors
(`passes.inductor_habits`): every entry names code that exists, so a
rename cannot leave the table pointing at nothing."""

from __future__ import annotations

import importlib
import re

import pytest

from adacc_compile.passes.inductor_habits import BACKENDS, HABITS, Habit, habits_for, unchecked_on


def _resolve(path: str) -> object:
    """``path`` under ``adacc_compile``: the longest prefix that imports as
    a module, then attributes from there."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target = importlib.import_module("adacc_compile." + ".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for name in parts[split:]:
            target = getattr(target, name)
        return target
    raise ModuleNotFoundError(path)


@pytest.mark.parametrize("path", sorted({p for h in HABITS for p in h.mirrored_in}))
def test_every_mirror_resolves(path):
    _resolve(path)


def test_names_are_unique_snake_case_and_backends_known():
    names = [h.name for h in HABITS]
    assert len(names) == len(set(names))
    for habit in HABITS:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", habit.name), habit.name
        assert habit.backends and set(habit.backends) <= set(BACKENDS), habit.name


def test_every_habit_says_what_and_where():
    for habit in HABITS:
        assert habit.rule.strip(), habit.name
        assert habit.mirrored_in, habit.name
        assert all(re.fullmatch(r"\d+\.\d+", v) for v in habit.checked_on), habit.name


def test_unchecked_on_reads_major_minor():
    assert unchecked_on("2.13.0+cpu") == ()
    assert unchecked_on("2.99.0") == HABITS


def test_habits_for_a_backend():
    assert set(habits_for("cpp")) | set(habits_for("triton")) == set(HABITS)
    assert all("cpp" in h.backends for h in habits_for("cpp"))
    with pytest.raises(ValueError):
        habits_for("cuda")


def test_habit_is_frozen():
    habit = HABITS[0]
    assert isinstance(habit, Habit)
    with pytest.raises(AttributeError):
        habit.name = "other"  # type: ignore[misc]


def test_a_torch_the_habits_were_not_checked_on_gets_one_warning(monkeypatch):
    import warnings

    from adacc_compile import partitioner

    partitioner._warn_unchecked_habits.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        partitioner._warn_unchecked_habits("2.99.0")
        partitioner._warn_unchecked_habits("2.99.0")
        partitioner._warn_unchecked_habits("2.13.0+cpu")
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "not checked on torch 2.99.0" in messages[0], messages
    partitioner._warn_unchecked_habits.cache_clear()
