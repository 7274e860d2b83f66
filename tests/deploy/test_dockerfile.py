"""deploy/Dockerfile, parsed (no Docker engine here: the image is not built by these tests), and the image's
health check script, run against a local HTTP server."""

from __future__ import annotations

import fnmatch
import json
import shlex
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
HEALTHCHECK = ROOT / "deploy" / "healthcheck.py"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined and comments dropped."""
    result, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        keyword, _, rest = current.partition(" ")
        result.append((keyword.upper(), rest.strip()))
        current = ""
    assert not current, "the Dockerfile ends inside a continuation line"
    return result


@pytest.fixture(scope="module")
def stages() -> dict[str, list[tuple[str, str]]]:
    by_stage: dict[str, list[tuple[str, str]]] = {}
    name = None
    for keyword, rest in instructions(DOCKERFILE.read_text()):
        if keyword == "FROM":
            words = rest.split()
            name = words[words.index("AS") + 1] if "AS" in words else rest
            by_stage[name] = []
        if name is not None:
            by_stage[name].append((keyword, rest))
    return by_stage


def last(stage, keyword):
    found = [rest for k, rest in stage if k == keyword]
    assert found, f"no {keyword}"
    return found[-1]


def test_two_stages_and_the_runtime_is_last(stages):
    assert list(stages) == ["build", "runtime"]


def test_runs_as_a_non_root_user(stages):
    user = last(stages["runtime"], "USER")
    uid = user.split(":")[0]
    assert uid not in ("root", "0") and int(uid) == 10001  # the uid the Kubernetes manifests run as
    created = " ".join(rest for k, rest in stages["runtime"] if k == "RUN")
    assert "useradd" in created and "--uid 10001" in created


def test_entrypoint_is_strata_behind_an_init(stages):
    entrypoint = json.loads(last(stages["runtime"], "ENTRYPOINT"))
    # tini as PID 1 (signals reach strata, children are reaped), then `strata`.
    assert entrypoint == ["/usr/bin/tini", "--", "strata"]
    command = json.loads(last(stages["runtime"], "CMD"))
    assert command[:1] == ["server"] and command[command.index("--host") + 1] == "0.0.0.0"


def test_default_command_parses_with_the_strata_cli(stages, cli_accepts):
    cli_accepts(json.loads(last(stages["runtime"], "CMD")))


def test_state_volume_health_check_and_ports(stages):
    runtime = stages["runtime"]
    assert json.loads(last(runtime, "VOLUME")) == ["/var/lib/strata"]
    env = " ".join(rest for k, rest in runtime if k == "ENV")
    assert "STRATA_HOME=/var/lib/strata" in env and "DJANGO_SETTINGS_MODULE=strata.settings" in env
    healthcheck = last(runtime, "HEALTHCHECK")
    assert "/usr/local/bin/strata-healthcheck" in healthcheck
    assert "STRATA_HEALTHCHECK_URL=http://127.0.0.1:8000/healthz" in env
    assert set(last(runtime, "EXPOSE").split()) == {"8000", "9108", "9109"}
    copied = [rest for k, rest in runtime if k == "COPY"]
    assert "deploy/healthcheck.py /usr/local/bin/strata-healthcheck" in copied


def test_control_plane_build_has_no_torch_and_node_build_pins_it(stages):
    build = stages["build"]
    args = {rest.split("=", 1)[0]: rest.split("=", 1)[1] if "=" in rest else None
            for k, rest in build if k == "ARG"}
    assert args["EXTRAS"] == '""'  # the default image is the control plane's
    assert args["TORCH_VERSION"] == "2.13.0"
    assert args["TORCH_INDEX_URL"].startswith("https://download.pytorch.org/whl/")
    install = " ".join(rest for k, rest in build if k == "RUN" and "pip install" in rest)
    node_branch, _, control_branch = install.partition("else")
    # torch only in the node branch, pinned, from the chosen index; the control-plane branch refuses torch.
    assert '"torch==${TORCH_VERSION}"' in node_branch and '--index-url "${TORCH_INDEX_URL}"' in node_branch
    assert 'pip install ".[${EXTRAS}]"' in node_branch
    assert "torch==" not in control_branch and 'import torch" 2>/dev/null; then' in control_branch


def dockerignore_patterns() -> list[str]:
    return [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def ignored(path: str, patterns: list[str]) -> bool:
    verdict = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        candidates = [pattern, pattern.replace("**/", "")]
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if any(fnmatch.fnmatch(prefix, c) for prefix in prefixes for c in candidates):
            verdict = not negate
    return verdict


def test_every_copied_path_exists_and_is_in_the_build_context(stages):
    patterns = dockerignore_patterns()
    sources = []
    for keyword, rest in stages["build"] + stages["runtime"]:
        if keyword == "COPY" and "--from=" not in rest:
            sources += shlex.split(rest)[:-1]
    assert {"pyproject.toml", "README.md", "platform", "components", "dashboard"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not ignored(source, patterns), f"{source} is excluded by .dockerignore"
    for heavy in (".venv", ".git", "tests", "deploy/.env"):
        assert ignored(heavy, patterns), f"{heavy} should stay out of the build context"


def test_the_build_installs_what_pyproject_packages():
    pyproject = (ROOT / "pyproject.toml").read_text()
    for package in ("platform/strata", "components", "dashboard"):
        assert f'"{package}"' in pyproject  # each is copied into the build stage above
    assert 'strata = "strata.cli.main:main"' in pyproject  # the ENTRYPOINT's program


# --- the health check script ------------------------------------------------------------------------------
class Handler(BaseHTTPRequestHandler):
    hosts: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        Handler.hosts.append(self.headers.get("Host"))
        status = {"/healthz": 200, "/metrics": 200, "/broken": 500}.get(self.path, 404)
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def run_healthcheck(*args, env=None):
    return subprocess.run([sys.executable, str(HEALTHCHECK), *args], capture_output=True, text=True, timeout=30,
                          env=env)


def test_healthcheck_passes_on_2xx_and_fails_otherwise(http_server):
    Handler.hosts.clear()
    assert run_healthcheck(f"{http_server}/healthz").returncode == 0
    assert run_healthcheck(f"{http_server}/broken").returncode == 1
    assert run_healthcheck(f"{http_server}/missing").returncode == 1
    # Django's ALLOWED_HOSTS check passes for localhost whatever address the container has.
    assert Handler.hosts and set(Handler.hosts) == {"localhost"}


def test_healthcheck_reads_its_url_from_the_environment_and_fails_when_nothing_listens(http_server):
    from support import free_port

    assert run_healthcheck(env={"STRATA_HEALTHCHECK_URL": f"{http_server}/metrics", "PATH": ""}).returncode == 0
    closed = run_healthcheck(f"http://127.0.0.1:{free_port()}/healthz")
    assert closed.returncode == 1 and "127.0.0.1" in closed.stderr
