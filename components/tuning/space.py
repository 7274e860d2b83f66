"""A sweep's search space: what each hyperparameter may be, checked on the control plane (standard library only).

A space is a JSON object ``{name: definition}``::

    lr:        {"type": "loguniform", "low": 1e-4, "high": 1e-1}
    dropout:   {"type": "uniform", "low": 0.0, "high": 0.5}
    width:     {"type": "int", "low": 32, "high": 256, "step": 32}
    optimizer: {"type": "choice", "values": ["sgd", "adam"]}
    momentum:  {"type": "uniform", "low": 0.5, "high": 0.99, "when": {"param": "optimizer", "in": ["sgd"]}}

- ``uniform`` / ``loguniform``: ``low < high`` (``loguniform``: ``0 < low``); ``grid``: points for the grid searcher
  (default 3).
- ``int``: ``low <= high``; ``step`` (default 1); ``log`` (default false, then step must be 1); ``grid``: points
  for the grid searcher (default: every value when there are at most 32, otherwise ``grid`` is required).
- ``choice``: ``values``, a non-empty list of distinct JSON scalars. Values Python holds equal (``1`` and ``1.0``,
  ``true`` and ``1``) count as repeats: Optuna finds a choice by equality and could not tell them apart.
- ``when`` (any parameter): the parameter exists only when parameter ``param`` (a ``choice`` or ``int`` of the
  space) exists and took one of the values ``in`` (each a value ``param`` can take; ``true`` never matches ``1``).
  Conditions may chain; a cycle is an error.

Numbers are finite (no NaN or infinity) and booleans are not numbers. Nothing here imports Optuna: the control plane
validates specs with this module; :mod:`components.tuning.searchers` maps a space onto Optuna where the sweep runs.
The trainable's spec refers to parameters as ``"{{name}}"`` (:func:`substitute`).
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any

from components.runtime.shared.units import finite_number

TYPES = ("uniform", "loguniform", "int", "choice")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
MAX_PARAMETERS = 64
MAX_CHOICES = 256
MAX_INT_GRID = 32
MAX_GRID_POINTS = 1000
MAX_GRID = 100_000
DEFAULT_GRID = 3
KEYS = {
    "uniform": {"type", "low", "high", "grid", "when"},
    "loguniform": {"type", "low", "high", "grid", "when"},
    "int": {"type", "low", "high", "step", "log", "grid", "when"},
    "choice": {"type", "values", "when"},
}
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_.-]{0,63})\s*\}\}")


def _number(value: Any) -> bool:
    return finite_number(value)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | bool) or _number(value)


def same(a: Any, b: Any) -> bool:
    """JSON equality of two scalars: ``true`` is not ``1`` (Python says it is), ``1`` is ``1.0``."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _among(value: Any, values: list) -> bool:
    return any(same(value, other) for other in values)


def space_problems(space: Any, field: str = "spec.space") -> list[tuple[str, str]]:
    """Every problem of ``space`` at once, as ``(field path, message)``; empty when it is valid.

    All of them at once so a user fixes a spec in one round: each parameter is checked on its own (type, keys,
    bounds), then every condition against the parameter it names, then the conditions for cycles."""
    if not isinstance(space, dict):
        return [(field, "must be an object of parameter name: definition")]
    if not space:
        return [(field, "needs at least one parameter")]
    problems: list[tuple[str, str]] = []
    if len(space) > MAX_PARAMETERS:
        problems.append((field, f"at most {MAX_PARAMETERS} parameters (got {len(space)})"))
    valid: dict[str, bool] = {}  # name -> whether its own definition (without its condition) is sound
    for name, definition in space.items():
        where = f"{field}.{name}"
        if not isinstance(name, str) or not NAME.match(name):
            problems.append((where, "a parameter name is a letter or _ then up to 63 letters, digits, _ . or -"))
            continue
        if not isinstance(definition, dict):
            problems.append((where, "must be an object with a type"))
            continue
        kind = definition.get("type")
        if kind not in TYPES:
            problems.append((f"{where}.type", f"must be one of {', '.join(TYPES)}"))
            continue
        for key in sorted(set(definition) - KEYS[kind], key=str):
            problems.append((f"{where}.{key}", f"unknown for a {kind} parameter; allowed: "
                             f"{', '.join(sorted(KEYS[kind] - {'type'}))}"))
        own = _definition_problems(where, kind, definition)
        valid[name] = not own
        problems.extend(own)
    for name, definition in space.items():
        if isinstance(definition, dict) and "when" in definition and isinstance(name, str) and NAME.match(name):
            problems.extend(_when_problems(f"{field}.{name}", definition["when"], space, name, valid))
    problems.extend(_cycle_problems(space, field))
    return problems


def _definition_problems(where: str, kind: str, definition: dict) -> list[tuple[str, str]]:
    problems = []
    if kind == "choice":
        values = definition.get("values")
        if not isinstance(values, list) or not values:
            return [(f"{where}.values", "must be a non-empty list")]
        if len(values) > MAX_CHOICES:
            # Stop here: checking a hostile list value by value would name (and compare) every one of them.
            return [(f"{where}.values", f"at most {MAX_CHOICES} values (got {len(values)})")]
        seen: set = set()  # scalars hash as they compare: 1, 1.0 and true are one entry
        for index, value in enumerate(values):
            if not _scalar(value):
                problems.append((f"{where}.values.{index}", "must be a string, a finite number, true, false or null"))
            elif value in seen:
                problems.append((f"{where}.values.{index}", f"repeats {value!r} (1 and 1.0, or true and 1, "
                                 "are the same choice to the searchers)"))
            else:
                seen.add(value)
        return problems
    low, high = definition.get("low"), definition.get("high")
    check = _integer if kind == "int" else _number
    noun = "an integer" if kind == "int" else "a finite number"
    for key, value in (("low", low), ("high", high)):
        if key not in definition:
            problems.append((f"{where}.{key}", "required"))
        elif not check(value):
            problems.append((f"{where}.{key}", f"must be {noun}"))
    if not problems:
        if kind == "int" and low > high:
            problems.append((f"{where}.high", f"must be at least low ({low})"))
        elif kind != "int" and low >= high:
            problems.append((f"{where}.high", f"must be more than low ({low})"))
        if kind == "loguniform" and low <= 0:
            problems.append((f"{where}.low", "must be more than 0 for a loguniform parameter"))
    if kind == "int":
        step, log = definition.get("step", 1), definition.get("log", False)
        if not _integer(step) or step < 1:
            problems.append((f"{where}.step", "must be an integer of at least 1"))
        if not isinstance(log, bool):
            problems.append((f"{where}.log", "must be true or false"))
        elif log and _integer(step) and step != 1:
            problems.append((f"{where}.step", "must be 1 for a log-scaled int parameter"))
        elif log and _integer(low) and low < 1:
            problems.append((f"{where}.low", "must be at least 1 for a log-scaled int parameter"))
    if "grid" in definition:
        grid = definition["grid"]
        if not _integer(grid) or not 2 <= grid <= MAX_GRID_POINTS:
            problems.append((f"{where}.grid", f"must be an integer between 2 and {MAX_GRID_POINTS}"))
    return problems


def _when_problems(where: str, when: Any, space: dict, name: str, valid: dict[str, bool]) -> list[tuple[str, str]]:
    if not isinstance(when, dict) or set(when) != {"param", "in"}:
        return [(f"{where}.when", 'must be {"param": <a choice or int parameter>, "in": [values]}')]
    problems = []
    parent = when["param"]
    parent_ok = False
    if parent == name:
        problems.append((f"{where}.when.param", "a parameter cannot depend on itself"))
    elif not isinstance(parent, str) or parent not in space:
        problems.append((f"{where}.when.param", f"no parameter {parent!r} in the space"))
    elif not isinstance(space[parent], dict) or space[parent].get("type") not in {"choice", "int"}:
        problems.append((f"{where}.when.param", f"{parent!r} must be a choice or int parameter"))
    else:
        parent_ok = valid.get(parent, False)
    values = when["in"]
    if not isinstance(values, list) or not values:
        problems.append((f"{where}.when.in", "must be a non-empty list of values"))
        return problems
    for index, value in enumerate(values):
        if not _scalar(value):
            problems.append((f"{where}.when.in.{index}", "must be a string, a finite number, true, false or null"))
        elif parent_ok and not _takes(space[parent], value):
            problems.append((f"{where}.when.in.{index}", f"{parent!r} never takes {value!r}"))
    return problems


def _takes(definition: dict, value: Any) -> bool:
    """Whether a (sound) choice or int parameter can take ``value``."""
    if definition["type"] == "choice":
        return _among(value, definition["values"])
    low, step = definition["low"], definition.get("step", 1)
    return _integer(value) and low <= value <= definition["high"] and (value - low) % step == 0


def _parent(space: dict, name: Any) -> str | None:
    """The parameter ``name``'s condition names, if it names one of the space (whatever else is wrong with it)."""
    definition = space.get(name)
    when = definition.get("when") if isinstance(definition, dict) else None
    parent = when.get("param") if isinstance(when, dict) else None
    return parent if isinstance(parent, str) and parent in space and parent != name else None


def _cycle_problems(space: dict, field: str) -> list[tuple[str, str]]:
    """Each parameter whose chain of conditions comes back to itself (self-references are named elsewhere)."""
    problems = []
    for name in space:
        seen, current = [name], _parent(space, name)
        while current is not None and current not in seen:
            seen.append(current)
            current = _parent(space, current)
        if current == name:
            loop = " -> ".join([*seen, name])
            problems.append((f"{field}.{name}.when.param", f"conditions form a cycle ({loop})"))
    return problems


def normalize_space(space: Any) -> dict[str, dict[str, Any]]:
    """The space with defaults filled in (int ``step``/``log``, float ``grid``; float bounds as floats); raises
    ValueError naming every problem."""
    problems = space_problems(space)
    if problems:
        raise ValueError("; ".join(f"{field}: {message}" for field, message in problems))
    normalized = {}
    for name, definition in space.items():
        entry = copy.deepcopy(definition)
        if entry["type"] == "int":
            entry.setdefault("step", 1)
            entry.setdefault("log", False)
        if entry["type"] in {"uniform", "loguniform"}:
            entry.setdefault("grid", DEFAULT_GRID)
            entry["low"], entry["high"] = float(entry["low"]), float(entry["high"])
        normalized[name] = entry
    return normalized


def order(space: dict) -> list[str]:
    """Parameter names with every condition's parameter before the parameters that depend on it (otherwise in
    the space's order), so a sampler decides a condition before what depends on it."""
    done: list[str] = []

    def visit(name: str) -> None:
        if name in done:
            return
        definition = space[name]
        if "when" in definition:
            visit(definition["when"]["param"])
        done.append(name)

    for name in space:
        visit(name)
    return done


def is_active(space: dict, name: str, params: dict) -> bool:
    """Whether ``name`` exists given the (partial) ``params``: its condition holds and its parent exists too."""
    definition = space[name]
    if "when" not in definition:
        return True
    parent = definition["when"]["param"]
    return (parent in params and _among(params[parent], definition["when"]["in"])
            and is_active(space, parent, params))


def active(space: dict, params: dict) -> list[str]:
    """The parameters that exist given the (partial) ``params``, parents before children."""
    return [name for name in order(space) if is_active(space, name, params)]


def substitute(template: Any, params: dict) -> Any:
    """A deep copy of ``template`` (a trainable's spec) with ``"{{name}}"`` replaced by the parameter's value (its
    type kept) and ``{{name}}`` inside longer strings by its text. An unknown name raises KeyError naming it.

    Only strings are looked at (dictionary keys are left as they are)."""
    if isinstance(template, dict):
        return {key: substitute(value, params) for key, value in template.items()}
    if isinstance(template, list):
        return [substitute(value, params) for value in template]
    if isinstance(template, str):
        whole = PLACEHOLDER.fullmatch(template.strip())
        if whole:
            name = whole.group(1)
            if name not in params:
                raise KeyError(f"{{{{{name}}}}} names no parameter of this trial")
            return copy.deepcopy(params[name])

        def text(match: re.Match) -> str:
            if match.group(1) not in params:
                raise KeyError(f"{{{{{match.group(1)}}}}} names no parameter of this trial")
            return str(params[match.group(1)])

        return PLACEHOLDER.sub(text, template)
    return copy.deepcopy(template)


def placeholders(template: Any) -> set[str]:
    """The parameter names a template refers to."""
    if isinstance(template, dict):
        return set().union(*(placeholders(value) for value in template.values())) if template else set()
    if isinstance(template, list):
        return set().union(*(placeholders(value) for value in template)) if template else set()
    if isinstance(template, str):
        return set(PLACEHOLDER.findall(template))
    return set()


# -- grids ---------------------------------------------------------------------------------------------------


def _spread(count: int, size: int) -> list[int]:
    """``count`` indexes spread evenly over ``range(size)``, both ends included, without repeats."""
    if size <= count:
        return list(range(size))
    return sorted({round(index * (size - 1) / (count - 1)) for index in range(count)})


def grid_points(space: dict) -> dict[str, list]:
    """The values the grid searcher tries per parameter, each list sorted and reaching both ends.

    - uniform: ``grid`` evenly spaced points (default 3); loguniform: ``grid`` points in geometric progression;
    - int: every value on the step when there are at most 32 and no ``grid``; otherwise ``grid`` values picked
      evenly (geometrically for ``log``) among the values on the step, low and the highest value on the step
      included, repeats dropped (so a grid may have fewer points than asked);
    - choice: its values, in order."""
    points: dict[str, list] = {}
    for name, definition in space.items():
        kind = definition["type"]
        if kind == "choice":
            points[name] = list(definition["values"])
        elif kind == "int":
            low, high, step = definition["low"], definition["high"], definition.get("step", 1)
            every = range(low, high + 1, step)
            if "grid" not in definition and len(every) <= MAX_INT_GRID:
                points[name] = list(every)
            elif definition.get("log", False) and len(every) > definition.get("grid", DEFAULT_GRID):
                count, top = definition.get("grid", DEFAULT_GRID), every[-1]
                ratio = math.log(top / low)
                chosen = {round(low * math.exp(ratio * index / (count - 1))) for index in range(count)}
                points[name] = sorted(min(max(value, low), top) for value in chosen)
            else:
                points[name] = [every[index] for index in _spread(definition.get("grid", DEFAULT_GRID), len(every))]
        else:
            count = definition.get("grid", DEFAULT_GRID)
            low, high = float(definition["low"]), float(definition["high"])
            if kind == "loguniform":
                ratio = math.log(high / low)
                values = [low * math.exp(ratio * index / (count - 1)) for index in range(count)]
            else:
                values = [low + (high - low) * index / (count - 1) for index in range(count)]
            values[0], values[-1] = low, high
            points[name] = [min(max(value, low), high) for value in values]
    return points


def size_of_grid(space: dict) -> int:
    """How many trials the grid searcher has: the number of distinct combinations of grid points in which every
    parameter that exists is set and no other is.

    Without conditions that is the product of the grid sizes. With them, parameters form a forest (each has at
    most one parent): a parameter counts, summed over its grid values, the product of what its children count
    where that value activates them (1 where it does not: the child is absent); the roots multiply. A child whose
    ``in`` values are not on its parent's grid is never tried."""
    points = grid_points(space)
    children: dict[str, list[str]] = {name: [] for name in space}
    for name, definition in space.items():
        if "when" in definition:
            children[definition["when"]["param"]].append(name)

    def count(name: str) -> int:
        return sum(math.prod(count(child) if _among(value, space[child]["when"]["in"]) else 1
                             for child in children[name]) for value in points[name])

    return math.prod(count(name) for name, definition in space.items() if "when" not in definition)


grid_size = size_of_grid  # the earlier name


def grid_combinations(space: dict) -> list[dict[str, Any]]:
    """Every combination :func:`size_of_grid` counts, in a fixed order (parameters in :func:`order`, each one's
    grid values in order); each holds exactly the parameters active in it. For a conditional space, where a plain
    product would repeat a configuration once per value of each absent parameter."""
    points = grid_points(space)
    combinations: list[dict[str, Any]] = [{}]
    for name in order(space):
        grown = []
        for combination in combinations:
            if is_active(space, name, combination):
                grown.extend({**combination, name: value} for value in points[name])
            else:
                grown.append(combination)
        combinations = grown
    return combinations


def is_conditional(space: dict) -> bool:
    """Whether any parameter of ``space`` has a condition."""
    return any("when" in definition for definition in space.values())


def grid_problem(space: dict) -> str | None:
    """Why the grid searcher cannot sweep ``space`` (a normalized space); None if it can: an int parameter with
    more than 32 values needs ``grid``, and the whole grid may have at most 100,000 combinations."""
    for name, definition in space.items():
        if definition["type"] == "int" and "grid" not in definition:
            count = len(range(definition["low"], definition["high"] + 1, definition.get("step", 1)))
            if count > MAX_INT_GRID:
                return f"{name!r} has {count} values: give it a grid (points to try)"
    size = size_of_grid(space)
    if size > MAX_GRID:
        return f"the grid has {size} combinations, more than {MAX_GRID}: give parameters fewer grid points"
    return None
