"""A JSON parser that refuses NaN/Infinity and pathological nesting instead of failing with a 500."""

from __future__ import annotations

import json

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


class StrictJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding", "utf-8")
        try:
            text = stream.read().decode(encoding)
            return json.loads(text, parse_constant=_reject_constant)
        except RecursionError as error:
            raise ParseError("JSON is nested too deeply.") from error
        except (ValueError, UnicodeDecodeError) as error:
            raise ParseError(f"JSON parse error: {error}") from error
