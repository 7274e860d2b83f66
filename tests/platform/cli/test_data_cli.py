"""``strata data upload``: chunked through the real API views (a test client stands in for HTTP), progress
output, and an interrupted upload resumed by sending only the chunks the server lacks."""

from __future__ import annotations

import random

import pytest

from components.runtime.client.client import ApiError
from strata.cli.client_commands import data_upload
from strata.jobs.models import DataSet


class Interrupted(Exception):
    pass


class ApiClientAdapter:
    """The CLI's REST client's calls, answered by the Django test client; ``fail_after`` PUTs, the connection
    breaks."""

    def __init__(self, api, fail_after: int | None = None):
        self.api, self.fail_after, self.puts = api, fail_after, []

    def request(self, method, path, *, json=None, data=None, headers=None, params=None, raw=False, **_kwargs):
        url = f"/api/v1/{path}"
        if method == "PUT":
            if self.fail_after is not None and len(self.puts) >= self.fail_after:
                raise Interrupted
            self.puts.append(int(path.rstrip("/").rsplit("/", 1)[1]))
            extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in (headers or {}).items()
                     if k != "Content-Type"}
            response = self.api.generic("PUT", url, data=data, content_type="application/octet-stream", **extra)
        elif method == "POST":
            response = self.api.post(url, json, format="json")
        elif method == "DELETE":
            response = self.api.delete(url, params or {})
        else:
            response = self.api.get(url, params or {})
        if response.status_code >= 400:
            raise ApiError(response.status_code, response.content.decode()[:300])
        return None if response.status_code == 204 else response.json()

    def get(self, path, **kwargs):
        return self.request("GET", path, **kwargs)

    def post(self, path, json=None, **kwargs):
        return self.request("POST", path, json=json, **kwargs)

    def delete(self, path, **kwargs):
        return self.request("DELETE", path, **kwargs)


@pytest.fixture
def alice_api(make_team, make_user, make_token, api, settings, tmp_path):
    settings.STRATA_ARTIFACT_ROOT = str(tmp_path / "artifacts")
    team = make_team("alpha")
    return api(make_token(make_user("alice", team), team))


def test_an_interrupted_upload_resumes_with_the_missing_chunks_only(alice_api, tmp_path, capsys):
    root = tmp_path / "images"
    (root / "cats").mkdir(parents=True)
    (root / "cats" / "a.bin").write_bytes(random.Random(1).randbytes(6000))
    (root / ".strataignore").write_text("*\n")  # data: ignore files are not applied
    first = ApiClientAdapter(alice_api, fail_after=3)
    with pytest.raises(Interrupted):
        data_upload(first, "pets", str(root), chunk_size=1024)
    assert first.puts == [0, 1, 2]
    second = ApiClientAdapter(alice_api)
    created = data_upload(second, "pets", str(root), chunk_size=1024)
    assert second.puts and not set(second.puts) & {0, 1, 2}
    assert created["file_count"] == 2 and DataSet.objects.get(name="pets").digest == created["digest"]
    out = capsys.readouterr().out
    assert "resuming upload" in out and "(100%)" in out and "data set pets: 2 files" in out


def test_a_file_is_uploaded_as_it_is(alice_api, tmp_path):
    path = tmp_path / "table.csv"
    path.write_bytes(b"a,b\n" * 1000)
    created = data_upload(ApiClientAdapter(alice_api), "table", str(path), chunk_size=1024)
    assert created["format"] == "file" and created["files"] == [{"path": "table.csv", "size": 4000}]
