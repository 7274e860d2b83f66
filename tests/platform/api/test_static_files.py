"""Static files are served by WhiteNoise (in MIDDLEWARE) with DEBUG off, from the installed packages through
the finders: no collectstatic step (docs/operations/production.md, Static files)."""

from __future__ import annotations

from django.test import Client


def test_static_files_are_served_with_debug_off(settings):
    assert settings.DEBUG is False and settings.WHITENOISE_USE_FINDERS
    response = Client().get("/static/dashboard/strata.js")
    assert response.status_code == 200
    assert response["Cache-Control"] == "max-age=60, public"
    assert b"".join(response.streaming_content)  # the file's bytes
    assert response["Content-Type"].startswith("text/javascript")
    assert Client().get("/static/admin/css/base.css").status_code == 200  # another package's files too
    assert Client().get("/static/dashboard/no-such-file.js").status_code == 404
