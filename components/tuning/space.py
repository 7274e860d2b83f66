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
- ``choice``: ``values``, a non-empty list of distinct JSON scalars.
- ``when`` (any parameter): the parameter exists only when parameter ``param`` (a ``choice`` or ``int`` of the
  space) took one of the values ``in``. Conditions may chain; a cycle is an error.

The trainable's spec refers to parameters as ``"{{name}}"`` (:func:`substitute`).
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any

TYPES = ("uniform", "loguniform", "int", "choice")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
MAX_PARAMETERS = 64
MAX_CHOICES = 256
MAX_INT_GRID = 32
DEFAULT_GRID = 3
KEYS = {
    "uniform": {"type", "low", "high", "grid", "when"},
    "loguniform": {"type", "low", "high", "grid", "when"},
    "int": {"type", "low", "high", "step", "log", "grid", "when"},
    "choice": {"type", "values", "when"},
}
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_.-]{0,63})\s*\}\}")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | bool) or _number(value)


def space_problems(space: Any, field: str = "spec.space") -> list[tuple[str, str]]:
    """Every problem of ``space`` at once, as ``(field path, message)``; empty when it is valid."""
    if not isinstance(space, dict):
        return [(field, "must be an object of parameter name: definition")]
    if not space:
        return [(field, "needs at least one parameter")]
    problems: list[tuple[str, str]] = []
    if len(space) > MAX_PARAMETERS:
        problems.append((field, f"at most {MAX_PARAMETERS} parameters (got {len(space)})"))
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
        for key in sorted(set(definition) - KEYS[kind]):
            problems.append((f"{where}.{key}", f"unknown for a {kind} parameter; allowed: "
                             f"{', '.join(sorted(KEYS[kind] - {'type'}))}"))
        problems.extend(_definition_problems(where, kind, definition))
        if "when" in definition:
            problems.extend(_when_problems(where, definition["when"], space, name))
    if not problems:
        problems.extend(_cycle_problems(space, field))
    return problems


def _definition_problems(where: str, kind: str, definition: dict) -> list[tuple[str, str]]:
    problems = []
    if kind == "choice":
        values = definition.get("values")
        if not isinstance(values, list) or not values:
            return [(f"{where}.values", "must be a non-empty list")]
        if len(values) > MAX_CHOICES:
            problems.append((f"{where}.values", f"at most {MAX_CHOICES} values"))
        bad = [index for index, value in enumerate(values) if not _scalar(value)]
        for index in bad:
            problems.append((f"{where}.values.{index}", "must be a string, a finite number, true, false or null"))
        if not bad:
            keys = [repr((type(value).__name__, value)) for value in values]
            if len(set(keys)) != len(keys):
                problems.append((f"{where}.values", "must not repeat a value"))
        return problems
    low, high = definition.get("low"), definition.get("high")
    check = _integer if kind == "int" else _number
    noun = "an integer" if kind == "int" else "a finite number"
    for key, value in (("low", low), ("high", high)):
        if value is None:
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
        if not _integer(grid) or not 2 <= grid <= 1000:
            problems.append((f"{where}.grid", "must be an integer between 2 and 1000"))
    return problems


def _when_problems(where: str, when: Any, space: dict, name: str) -> list[tuple[str, str]]:
    if not isinstance(when, dict) or set(when) != {"param", "in"}:
        return [(f"{where}.when", 'must be {"param": <a choice or int parameter>, "in": [values]}')]
    problems = []
    parent = when["param"]
    if parent == name:
        problems.append((f"{where}.when.param", "a parameter cannot depend on itself"))
    elif not isinstance(parent, str) or parent not in space:
        problems.append((f"{where}.when.param", f"no parameter {parent!r} in the space"))
    elif not isinstance(space[parent], dict) or space[parent].get("type") not in {"choice", "int"}:
        problems.append((f"{where}.when.param", f"{parent!r} must be a choice or int parameter"))
    values = when["in"]
    if not isinstance(values, list) or not values or not all(_scalar(value) for value in values):
        problems.append((f"{where}.when.in", "must be a non-empty list of values"))
    return problems


def _cycle_problems(space: dict, field: str) -> list[tuple[str, str]]:
    problems = []
    for name in space:
        seen, current = {name}, space[name].get("when", {}).get("param") if "when" in space[name] else None
        while current is not None:
            if current in seen:
                problems.append((f"{field}.{name}.when", f"conditions form a cycle through {current!r}"))
                break
            seen.add(current)
            definition = space[current]
            current = definition["when"]["param"] if "when" in definition else None
    return problems


def normalize_space(space: Any) -> dict[str, dict[str, Any]]:
    """The space with defaults filled in; raises ValueError naming every problem."""
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
    """Parameter names with every condition's parameter before the parameters that depend on it."""
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
    """Whether ``name`` exists given the (partial) ``params``: its condition, and its parent's, hold."""
    definition = space[name]
    if "when" not in definition:
        return True
    parent = definition["when"]["param"]
    return (is_active(space, parent, params) and parent in params
            and params[parent] in definition["when"]["in"])


def active(space: dict, params: dict) -> list[str]:
    """The parameters that exist given ``params``, parents first."""
    return [name for name in order(space) if is_active(space, name, params)]


def substitute(template: Any, params: dict) -> Any:
    """A deep copy of ``template`` (a trainable's spec) with ``"{{name}}"`` replaced by the parameter's value (its
    type kept) and ``{{name}}`` inside longer strings by its text. An unknown name raises KeyError naming it."""
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
            return params[name]

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


def grid_points(space: dict) -> dict[str, list]:
    """The values the grid searcher tries per parameter (of a normalized space)."""
    points: dict[str, list] = {}
    for name, definition in space.items():
        kind = definition["type"]
        if kind == "choice":
            points[name] = list(definition["values"])
        elif kind == "int":
            low, high, step = definition["low"], definition["high"], definition.get("step", 1)
            every = list(range(low, high + 1, step))
            if "grid" not in definition and len(every) <= MAX_INT_GRID:
                points[name] = every
            else:
                count = definition.get("grid", DEFAULT_GRID)
                spaced = [low + round((high - low) * index / (count - 1)) for index in range(count)]
                points[name] = sorted({low + ((value - low) // step) * step for value in spaced})
        else:
            count = definition.get("grid", DEFAULT_GRID)
            low, high = float(definition["low"]), float(definition["high"])
            if kind == "loguniform":
                ratio = math.log(high / low)
                points[name] = [low * math.exp(ratio * index / (count - 1)) for index in range(count)]
            else:
                points[name] = [low + (high - low) * index / (count - 1) for index in range(count)]
            points[name][-1] = high
    return points


def grid_problem(space: dict) -> str | None:
    """Why the grid searcher cannot sweep ``space`` (a normalized space); None if it can."""
    for name, definition in space.items():
        if "when" in definition:
            return f"the grid searcher does not take conditional parameters ({name!r}); use random or tpe"
        if definition["type"] == "int" and "grid" not in definition:
            count = len(range(definition["low"], definition["high"] + 1, definition.get("step", 1)))
            if count > MAX_INT_GRID:
                return f"{name!r} has {count} values: give it a grid (points to try)"
    return None


def grid_size(space: dict) -> int:
    """How many trials the full grid has."""
    return math.prod(len(values) for values in grid_points(space).values())
