"""The REST client's errors are one line, whatever the server (or a proxy in front of it) answered."""

from __future__ import annotations

import requests

from components.runtime.client.client import _describe, storable_text


def response(status: int, body: str, content_type: str) -> requests.Response:
    answer = requests.Response()
    answer.status_code, answer._content = status, body.encode()
    answer.headers["Content-Type"] = content_type
    return answer


def test_an_html_error_page_is_one_line():
    page = "<!doctype html>\n<html><head><title>502 Bad Gateway</title></head>\n<body><h1>Bad</h1>\n</body></html>"
    message, payload = _describe(response(502, page, "text/html"))
    assert message == "HTTP 502: 502 Bad Gateway" and payload is None
    message, _ = _describe(response(500, "line one\n\n   line two\n" + "x" * 500, "text/plain"))
    assert "\n" not in message and message.startswith("HTTP 500: line one line two") and len(message) < 230


def test_json_errors_name_their_fields():
    message, payload = _describe(response(400, '{"spec.epochs": ["must be >= 1"], "name": ["too long"]}',
                                          "application/json"))
    assert message == "HTTP 400: spec.epochs: must be >= 1; name: too long" and payload["name"] == ["too long"]
    assert _describe(response(404, '{"detail": "Not found."}', "application/json"))[0] == "HTTP 404: Not found."


def test_storable_text_replaces_what_the_control_plane_refuses():
    assert storable_text("a\x00b\ud800c") == "a\ufffdb\ufffdc"
    assert storable_text("plain ünïcode ✓") == "plain ünïcode ✓"
