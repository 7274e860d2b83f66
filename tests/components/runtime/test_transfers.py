"""The node's side of direct transfers (components/runtime/client/transfers.py): what it sends for a part. The whole
protocol against a real control plane and SeaweedFS: tests/e2e/test_direct_transfers.py."""

from __future__ import annotations

import base64
import hashlib

import requests

from components.runtime.client.transfers import _Range, file_digest


def test_a_part_is_sent_with_its_length_never_chunked(tmp_path):
    # S3 stores refuse (or, SeaweedFS, fail with a 500 on) a chunked body on a presigned part.
    path = tmp_path / "blob"
    path.write_bytes(bytes(range(256)) * 64)
    body = _Range(path, 1000, 5000)
    prepared = requests.Request("PUT", "http://127.0.0.1:9/part", data=body).prepare()
    assert prepared.headers["Content-Length"] == "5000" and "Transfer-Encoding" not in prepared.headers
    assert body.read() == path.read_bytes()[1000:6000] and body.read() == b""
    body.close()


def test_the_digests_of_a_range(tmp_path):
    path = tmp_path / "blob"
    data = b"abc" * 100_000
    path.write_bytes(data)
    assert file_digest(path) == hashlib.sha256(data).hexdigest()
    assert file_digest(path, 10, 2000, "md5") == base64.b64encode(hashlib.md5(data[10:2010]).digest()).decode()
