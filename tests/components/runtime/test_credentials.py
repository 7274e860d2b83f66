"""Job credentials (components.runtime.shared.credentials): signed, checked, refused when tampered with, expired, for
another job or subject, or checked with another key; the local context signs with a key its workdir keeps, and
the remote context asks the control plane."""

from __future__ import annotations

import base64
import json
import secrets

import pytest

from components.runtime.client.remote import RemoteContext
from components.runtime.contract.context import Context, LocalContext
from components.runtime.shared.credentials import parse, public_key_hex, sign_with, verify

SEED = bytes(range(32))
JOB = "3f0c5b8e-9a51-4c55-9c1e-0f1b2f0d9a11"


def signed(**overrides):
    arguments = {"job": JOB, "subject": "p2p:QmPeer", "holder": "participant 1", "ttl_s": 60.0, "now": 1000.0,
                 **overrides}
    return sign_with(SEED, **arguments)


def test_a_credential_verifies_with_the_jobs_key():
    answer = signed()
    assert answer["public_key"] == public_key_hex(SEED) and len(answer["public_key"]) == 64
    assert answer["expires"] == 1060.0 and answer["issued"] == 1000.0
    claims, problem = verify(answer["credential"], answer["public_key"], job=JOB, subject="p2p:QmPeer", now=1059.0)
    assert problem is None
    assert claims == {"job": JOB, "subject": "p2p:QmPeer", "holder": "participant 1", "exp": 1060.0}
    # Without a subject, any subject of the job is fine.
    assert verify(answer["credential"], answer["public_key"], job=JOB, now=1001.0)[1] is None
    assert parse(answer["credential"])[0] == claims


def test_a_credential_is_refused_for_every_reason_with_one_line():
    answer = signed()
    credential, key = answer["credential"], answer["public_key"]

    def reason(*args, **kwargs):
        claims, problem = verify(*args, **kwargs)
        assert claims is None and problem and "\n" not in problem and credential not in problem
        return problem

    assert reason(credential, key, job=JOB, now=1060.0).startswith("the credential expired")
    assert reason(credential, key, job="another-job", now=1001.0) == "the credential is for another job"
    assert reason(credential, key, job=JOB, subject="rsa:other", now=1001.0) == "the credential is for another subject"
    other_key = public_key_hex(secrets.token_bytes(32))
    assert reason(credential, other_key, job=JOB, now=1001.0).startswith("bad signature")
    assert reason(credential, "not hex", job=JOB, now=1001.0).startswith("the job's public key")
    # Tampering: claims changed under the old signature, a signature changed, shapes that are no credential.
    payload, signature = credential.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    forged = base64.urlsafe_b64encode(json.dumps({**claims, "subject": "p2p:Evil"}).encode()).rstrip(b"=").decode()
    assert reason(f"{forged}.{signature}", key, job=JOB, now=1001.0).startswith("bad signature")
    flipped = signature[:-2] + ("A" if signature[-2] != "A" else "B") + signature[-1]
    assert reason(f"{payload}.{flipped}", key, job=JOB, now=1001.0).startswith("bad signature")
    for bad in ("", "nodot", "a.b.c", "!!!.???", f"{payload}", "x" * 5000, None, 42):
        assert reason(bad, key, job=JOB, now=1001.0) == "not a credential (bad format)"
    extra = base64.urlsafe_b64encode(json.dumps({**claims, "admin": True}).encode()).rstrip(b"=").decode()
    assert reason(f"{extra}.{signature}", key, job=JOB, now=1001.0) == "not a credential (bad format)"


def test_sign_refuses_bad_subjects_and_ttls():
    for subject in ("", "has space", "x" * 257, "new\nline"):
        with pytest.raises(ValueError, match="subject"):
            signed(subject=subject)
    with pytest.raises(ValueError, match="ttl_s"):
        signed(ttl_s=0)


def test_local_contexts_sharing_a_workdir_share_the_key(tmp_path):
    first = LocalContext(job_id=JOB, attempt_id="a", spec={}, workdir=tmp_path / "gang")
    second = LocalContext(job_id=JOB, attempt_id="a", spec={}, rank=1, workdir=tmp_path / "gang")
    elsewhere = LocalContext(job_id=JOB, attempt_id="b", spec={}, workdir=tmp_path / "other")
    answer = first.identity.credential("p2p:QmZero")
    assert answer["public_key"] == second.identity.public_key() == second.identity.credential("x")["public_key"]
    claims, problem = verify(answer["credential"], second.identity.public_key(), job=JOB, subject="p2p:QmZero")
    assert problem is None and "rank 0" in claims["holder"]
    assert verify(answer["credential"], elsewhere.identity.public_key(), job=JOB)[1].startswith("bad signature")
    assert not list((tmp_path / "gang").glob("*.tmp"))


def test_the_remote_context_asks_the_control_plane_and_others_have_none():
    class Client:
        def post(self, path, body):
            self.call = (path, body)
            return {"credential": "c", "public_key": "k", "expires": 2.0, "issued": 1.0}

    client = Client()
    ctx = RemoteContext(job_id=JOB, attempt_id="a", spec={}, client=client, node_id="n", token="t")
    assert ctx.identity.credential("p2p:QmPeer")["credential"] == "c"
    assert client.call == ("node/attempts/a/credential/", {"node": "n", "token": "t", "subject": "p2p:QmPeer"})

    class Bare(Context):
        def log(self, message, level="info"): ...
        def metrics(self, values, step): ...
        def artifact(self, path, name=None): ...
        def _save_checkpoint_bytes(self, data): ...
        def _load_checkpoint_bytes(self): ...

    with pytest.raises(NotImplementedError, match="no job credentials"):
        Bare(job_id=JOB, attempt_id="a", spec={}).identity.credential("p2p:QmPeer")
