"""What a stored document may hold: text that can be stored and shown safely, numbers in range.

Every write route runs the values it received through :func:`value_problems` before anything is written
(the JSON parser for every API body, the submit serializer for the API, the web form and the editor), so a
lone UTF-16 surrogate (``"\\ud800"`` in JSON), a NUL character (PostgreSQL text and jsonb cannot hold one),
an infinite float (``1e999``) or an integer no column can hold is a 400 naming the field, never a 500 after
a partial write. Field names in messages are escaped, so an error never echoes text that cannot be encoded.
"""

from __future__ import annotations

import math
from typing import Any

# The largest magnitude of an integer anywhere in a document: a signed 64-bit column's range.
MAX_INT = 2**63 - 1


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored and shown safely, or None."""
    if "\x00" in text:
        return "contains a NUL character (U+0000), which cannot be stored"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return (f"contains a lone UTF-16 surrogate (U+{ord(text[error.start]):04X}) at character {error.start}; "
                "text must be valid Unicode")
    return None


def safe_name(text: str) -> str:
    """``text`` as it can be shown in a field name or a message: escaped where it could not be encoded."""
    if text_problem(text) is None and text.isprintable():
        return text
    return text.encode("unicode_escape", errors="backslashreplace").decode("ascii")


def value_problems(value: Any, path: str = "") -> dict[str, str]:
    """Every field of a parsed JSON-like document that holds something that cannot be stored or shown: text
    with NUL or lone surrogates (in values and in keys), non-finite floats, integers beyond 64 bits.
    Returns ``{dotted.field: message}``; empty when the whole document is fine."""
    problems: dict[str, str] = {}
    _walk(value, path, problems)
    return problems


def _walk(value: Any, path: str, problems: dict[str, str]) -> None:
    where = path or "body"
    if isinstance(value, dict):
        for key, item in value.items():
            name = safe_name(key) if isinstance(key, str) else safe_name(str(key))
            child = f"{path}.{name}" if path else name
            if isinstance(key, str) and (problem := text_problem(key)):
                problems[child] = f"field name {problem}"
                continue
            _walk(item, child, problems)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _walk(item, f"{path}[{index}]" if path else f"[{index}]", problems)
    elif isinstance(value, str):
        if problem := text_problem(value):
            problems[where] = problem
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if not -MAX_INT <= value <= MAX_INT:
            problems[where] = f"number out of range: at most {MAX_INT} in magnitude"
    elif isinstance(value, float) and not math.isfinite(value):
        problems[where] = "must be a finite number (NaN and infinity are not allowed)"
