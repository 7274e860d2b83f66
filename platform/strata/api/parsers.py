"""A JSON parser that refuses what cannot be stored or shown instead of failing with a 500 later: NaN and
infinity, pathological nesting, text with NUL or lone surrogates, integers beyond 64 bits."""

from __future__ import annotations

import json

from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import JSONParser

from strata.api.values import value_problems


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


class StrictJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding", "utf-8")
        try:
            text = stream.read().decode(encoding)
            data = json.loads(text, parse_constant=_reject_constant)
        except RecursionError as error:
            raise ParseError("JSON is nested too deeply.") from error
        except (ValueError, UnicodeDecodeError, LookupError) as error:
            raise ParseError(f"JSON parse error: {error}") from error
        try:
            problems = value_problems(data)
        except RecursionError as error:
            raise ParseError("JSON is nested too deeply.") from error
        if problems:
            raise ValidationError({field: [message] for field, message in problems.items()})
        return data
