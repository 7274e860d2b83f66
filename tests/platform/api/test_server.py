"""The control plane's HTTP server (strata.api.server) and HEAD handling (strata.api.head).

The socket-level tests run the real server in subprocesses: ``strata server`` on a temporary STRATA_HOME with
SQLite, and a toy WSGI app behind the same hardened server for the node-first queue. Every process is reaped and
every socket closed in teardown. Deadlines are generous: the tests assert outcomes, never short wall times.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from wsgiref.util import setup_testing_defaults

import pytest
from support import wait_for

SCRUBBED = ("STRATA_DATABASE_URL", "STRATA_BROKER_URL", "STRATA_BROKER_PREFIX", "STRATA_CACHE_URL", "STRATA_HOME",
            "STRATA_CONFIG", "STRATA_URL", "STRATA_TOKEN", "STRATA_NODE_TOKEN", "STRATA_PUBLIC_URL",
            "STRATA_SCHEDULE_INLINE", "DJANGO_SETTINGS_MODULE")
CONNECTION_LIMIT = 100
HEADER_TIMEOUT = 3
DEADLINE = 30.0


# --- helpers ------------------------------------------------------------------------------------------


def server_env(home: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in SCRUBBED}
    env.update({"STRATA_HOME": str(home), "PYTHONUNBUFFERED": "1"}, **extra)
    return env


def reap(process: subprocess.Popen) -> None:
    """SIGTERM the process group, then SIGKILL it; wait for the leader."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def start_listening(command: list[str], env: dict, log_path: Path, pattern: str) -> tuple[subprocess.Popen, int]:
    with log_path.open("ab") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)

    def port():
        if process.poll() is not None:
            raise AssertionError(f"{command} exited with {process.returncode}:\n{log_path.read_text()}")
        found = re.search(pattern, log_path.read_text())
        return int(found.group(1)) if found else None

    try:
        return process, wait_for(port, 180, message=f"{command} to listen")
    except BaseException:
        reap(process)
        raise


class Raw:
    """An HTTP/1.1 client on one raw socket, reading responses strictly in order (no slack for stray bytes)."""

    def __init__(self, port: int, timeout: float = DEADLINE):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buffer = b""

    def close(self):
        self.sock.close()

    def send(self, method: str, path: str, headers: dict | None = None, body: bytes = b"") -> None:
        lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        if body:
            lines.append(f"Content-Length: {len(body)}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buffer += data
        return bool(data)

    def _take(self, count: int) -> bytes:
        while len(self.buffer) < count:
            if not self._fill():
                raise AssertionError(f"connection closed with {len(self.buffer)} of {count} bytes")
        taken, self.buffer = self.buffer[:count], self.buffer[count:]
        return taken

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            if not self._fill():
                raise AssertionError(f"connection closed before a full line: {self.buffer!r}")
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def response(self, head: bool = False) -> SimpleNamespace:
        while b"\r\n\r\n" not in self.buffer:
            if not self._fill():
                raise AssertionError(f"connection closed before a full response head: {self.buffer!r}")
        raw_head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *header_lines = raw_head.decode("latin-1").split("\r\n")
        assert re.match(r"HTTP/1\.[01] \d{3} ", status_line), f"not a status line: {status_line!r}"
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        status = int(status_line.split()[1])
        body = b""
        if not head and status not in (204, 304):
            if "content-length" in headers:
                body = self._take(int(headers["content-length"]))
            elif headers.get("transfer-encoding") == "chunked":
                while size := int(self._line(), 16):
                    body += self._take(size)
                    self._take(2)
                self._take(2)
            else:
                while self._fill():
                    pass
                body, self.buffer = self.buffer, b""
        return SimpleNamespace(status=status, headers=headers, body=body)

    def closed_by_peer(self) -> bool:
        return peer_closed(self.sock)


def peer_closed(sock: socket.socket) -> bool:
    """Whether the server closed this socket (EOF or reset); waits at most a moment."""
    sock.settimeout(0.2)
    try:
        return sock.recv(1) == b""
    except (TimeoutError, BlockingIOError):
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(DEADLINE)


def get(port: int, method: str, path: str, headers: dict | None = None, body: bytes = b"") -> SimpleNamespace:
    client = Raw(port)
    try:
        client.send(method, path, {"Connection": "close", **(headers or {})}, body)
        return client.response(head=method == "HEAD")
    finally:
        client.close()


# --- strata server in a subprocess --------------------------------------------------------------------


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    """``strata server`` on SQLite in a temporary home, with a low connection limit and header deadline so that
    eviction and the deadline are exercised; a user token for the API."""
    home = tmp_path_factory.mktemp("strata-server-home")
    env = server_env(home, STRATA_SERVER_CONNECTION_LIMIT=str(CONNECTION_LIMIT),
                     STRATA_SERVER_HEADER_TIMEOUT=str(HEADER_TIMEOUT), STRATA_SERVER_IDLE_TIMEOUT="300")
    strata = [sys.executable, "-m", "strata.cli.main"]
    subprocess.run([*strata, "user", "create", "alice", "--team", "alpha", "--password-file", "-"],
                   input="correct-horse-battery", text=True, env=env, check=True, capture_output=True, timeout=300)
    token = subprocess.run([*strata, "token", "create", "--local", "--user", "alice", "--team", "alpha"],
                           text=True, env=env, check=True, capture_output=True, timeout=300).stdout.strip()
    log = home / "server.log"
    process, port = start_listening([*strata, "server", "--host", "127.0.0.1", "--port", "0", "--threads", "4"],
                                    env, log, r"listening on http://127\.0\.0\.1:(\d+)")
    try:
        wait_for(lambda: _healthy(port), 120, message="/healthz")
        yield SimpleNamespace(port=port, token=token, log=log, process=process)
    finally:
        reap(process)


def _healthy(port: int) -> bool:
    try:
        return get(port, "GET", "/healthz").status == 200
    except (OSError, AssertionError):
        return False


@pytest.fixture
def sockets():
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def test_idle_and_half_sent_connections_do_not_starve_the_server(control_plane, sockets):
    # Three times the connection limit: half send nothing at all (the header deadline does not apply to them,
    # and the idle timeout is 300 s here), half send part of a request line and headers, then all idle.
    for index in range(3 * CONNECTION_LIMIT):
        sock = socket.create_connection(("127.0.0.1", control_plane.port), timeout=DEADLINE)
        sockets.append(sock)
        if index % 2:
            sock.sendall(b"GET /api/v1/jobs/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")

    health = get(control_plane.port, "GET", "/healthz")  # stock waitress: no answer for 120 s
    assert health.status == 200 and json.loads(health.body) == {"status": "ok"}
    heartbeat = get(control_plane.port, "POST", "/api/v1/node/heartbeat/", {"Content-Type": "application/json"},
                    b"{}")
    assert heartbeat.status == 401  # served (no node token): node traffic still gets through
    assert control_plane.process.poll() is None
    # The oldest idle connections made room, and the server said so.
    wait_for(lambda: "at the connection limit" in control_plane.log.read_text(), DEADLINE, message="the eviction log")
    # The oldest sockets that sent nothing (not under the header deadline, far from the idle timeout) were
    # closed to make room.
    wait_for(lambda: any(peer_closed(sock) for sock in sockets[0:60:2]), DEADLINE, message="an evicted socket")


def test_trickled_headers_are_cut_at_the_header_deadline(control_plane):
    client = Raw(control_plane.port)
    try:
        client.sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        started = time.monotonic()
        deadline = started + 120
        while True:
            assert time.monotonic() < deadline, "the server never closed a client trickling its headers"
            try:
                client.sock.sendall(b"a")  # one byte a second: never idle, and the headers never end
            except OSError:
                break
            if client.closed_by_peer():
                break
            time.sleep(0.8)
        assert time.monotonic() - started >= HEADER_TIMEOUT - 0.5  # closed by the deadline, not at once
    finally:
        client.close()


def test_a_slow_body_is_not_cut_by_the_header_deadline(control_plane):
    client = Raw(control_plane.port)
    try:
        body = b'{"a": 1}'
        client.sock.sendall(b"POST /api/v1/node/heartbeat/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                            b"Content-Type: application/json\r\n"
                            + f"Content-Length: {len(body)}\r\n\r\n".encode())
        for byte in body:  # 8 s of body, well past the 3 s header deadline
            time.sleep(1)
            client.sock.sendall(bytes([byte]))
        assert client.response().status == 401  # the whole request arrived and was answered
    finally:
        client.close()


def test_head_answers_carry_no_body_on_a_kept_alive_connection(control_plane):
    auth = {"Authorization": f"Bearer {control_plane.token}"}
    client = Raw(control_plane.port)
    try:
        expected = {f"/api/v1/jobs/{uuid.uuid4()}/": 404, "/healthz": 200, "/login/": 200,
                    "/static/dashboard/strata.css": 200, "/admin/": 302, "/no/such/page/": 404}
        for path, status in expected.items():
            client.send("HEAD", path, auth)
            head = client.response(head=True)
            assert head.status == status, path
            # The next response on the same connection must start right after the HEAD's headers (Raw asserts
            # that it begins with a status line).
            client.send("GET", path, auth)
            full = client.response()
            assert full.status == status, path
            assert full.body or status == 302, path
            assert int(head.headers["content-length"]) == len(full.body), path
        client.send("HEAD", f"/api/v1/jobs/{uuid.uuid4()}/")  # 401, JSON body on GET
        assert client.response(head=True).status == 401
        client.send("GET", "/healthz")
        assert json.loads(client.response().body) == {"status": "ok"}
        assert client.buffer == b""
    finally:
        client.close()


# --- the hardened server around a toy WSGI app ----------------------------------------------------------

TOY_SERVER = textwrap.dedent("""
    import sys
    import threading
    import time

    from strata.api.server import ServerLimits, create_server

    running = {"slow": 0}
    lock = threading.Lock()

    def app(environ, start_response):
        path = environ["PATH_INFO"]
        if path == "/slow":
            with lock:
                running["slow"] += 1
            time.sleep(600)
        if path == "/stream":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return iter([b"no ", b"length"])
        body = f"slow={running['slow']}".encode() if path.startswith("/api/v1/node/") else b"hello"
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]

    server = create_server(app, host="127.0.0.1", port=0, threads=3, limits=ServerLimits(node_threads=1))
    print(f"toy listening on {server.effective_port}", flush=True)
    server.run()
""")


@pytest.fixture
def toy_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("toy-server")
    script = folder / "toy.py"
    script.write_text(TOY_SERVER)
    process, port = start_listening([sys.executable, str(script)], server_env(folder), folder / "toy.log",
                                    r"toy listening on (\d+)")
    try:
        yield port
    finally:
        reap(process)


def test_node_requests_are_served_while_slow_user_requests_hold_the_threads(toy_server, sockets):
    # Four slow user requests for three threads: user requests may take two (one is kept for nodes),
    # the other two wait in the queue.
    for _ in range(4):
        sock = socket.create_connection(("127.0.0.1", toy_server), timeout=DEADLINE)
        sockets.append(sock)
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")

    def node_sees_two_slow_requests():
        answer = get(toy_server, "POST", "/api/v1/node/heartbeat/", {"Authorization": "Bearer st_x_y"}, b"{}")
        assert answer.status == 200  # answered while the slow requests hold the user threads
        return answer.body == b"slow=2"

    wait_for(node_sees_two_slow_requests, DEADLINE, message="a node request served beside two slow user requests")


def test_server_never_writes_a_body_after_head_headers(toy_server):
    client = Raw(toy_server)
    try:
        client.send("HEAD", "/hello")
        head = client.response(head=True)
        assert head.status == 200 and head.headers["content-length"] == "5"
        client.send("GET", "/hello")
        assert client.response().body == b"hello"
        # No length known: the answer closes the connection, with no chunk terminator after the headers.
        client.send("HEAD", "/stream")
        assert client.response(head=True).status == 200
        while client._fill():
            pass
        assert client.buffer == b""
    finally:
        client.close()


# --- units --------------------------------------------------------------------------------------------


def test_node_first_dispatcher_keeps_a_thread_for_node_requests():
    from strata.api.server import NodeFirstDispatcher

    gate, done, running = threading.Event(), [], []

    class Task:
        def __init__(self, path, authorized=True, block=False):
            headers = {"AUTHORIZATION": "Bearer x"} if authorized else {}
            self.requests = [SimpleNamespace(path=path, headers=headers)]
            self.block = block

        def service(self):
            running.append(self)
            if self.block:
                gate.wait(60)
            done.append(self)

        def cancel(self):
            pass

    dispatcher = NodeFirstDispatcher(node_threads=1)
    dispatcher.set_thread_count(3)
    try:
        slow = [Task("/api/v1/jobs/", block=True) for _ in range(4)]
        for task in slow:
            dispatcher.add_task(task)
        wait_for(lambda: len(running) == 2, DEADLINE, message="two user tasks running")
        unauthenticated = Task("/api/v1/node/heartbeat/", authorized=False)
        node = Task("/api/v1/node/heartbeat/")
        dispatcher.add_task(unauthenticated)
        dispatcher.add_task(node)
        wait_for(lambda: node in done, DEADLINE, message="the node task")
        assert unauthenticated not in done  # no token, no priority lane: it waits with the user requests
        assert len([task for task in running if task in slow]) == 2
        gate.set()
        wait_for(lambda: len(done) == 6, DEADLINE, message="every task")
    finally:
        gate.set()
        dispatcher.shutdown(timeout=10)


def test_eviction_takes_idle_and_half_sent_connections_before_uploads_and_never_running_ones():
    from strata.api.server import _busy, _eviction_key

    def channel(last_activity, request=None, requests=(), outbuf=0):
        return SimpleNamespace(last_activity=last_activity, request=request, requests=list(requests),
                               total_outbufs_len=outbuf, will_close=False, close_when_flushed=False)

    idle_new = channel(50)
    half_headers_old = channel(90, SimpleNamespace(headers_finished=False, started=10))
    idle_old = channel(20)
    upload = channel(5, SimpleNamespace(headers_finished=True, started=1))
    unread_answer = channel(1, outbuf=100)
    running = channel(0, requests=[object()])
    channels = [idle_new, half_headers_old, idle_old, upload, unread_answer, running]
    order = sorted((c for c in channels if not _busy(c)), key=_eviction_key)
    assert order == [half_headers_old, idle_old, idle_new, upload, unread_answer]


def test_connection_limit_is_fitted_to_the_open_file_limit(monkeypatch):
    from strata.api import server

    calls = []
    monkeypatch.setattr(server.resource, "getrlimit", lambda which: (1024, 1024))
    monkeypatch.setattr(server.resource, "setrlimit", lambda which, limits: calls.append(limits))
    assert server.fit_to_fd_limit(1000) == (1024 - server.FD_RESERVE) // server.FDS_PER_CONNECTION
    assert server.fit_to_fd_limit(100) == 100

    monkeypatch.setattr(server.resource, "getrlimit", lambda which: (1024, 65536))
    assert server.fit_to_fd_limit(1000) == 1000
    assert calls[-1] == (1000 * server.FDS_PER_CONNECTION + server.FD_RESERVE, 65536)


def _wsgi(method: str, path: str, headers: dict | None = None) -> tuple[str, dict, bytes]:
    """Call the Django WSGI application itself (no test client, which drops HEAD bodies on its own)."""
    from django.core import signals
    from django.db import close_old_connections

    from strata.wsgi import application

    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "HTTP_HOST": "testserver", "wsgi.input": io.BytesIO()}
    environ.update(headers or {})
    setup_testing_defaults(environ)
    answer = {}

    def start_response(status, response_headers, exc_info=None):
        answer["status"], answer["headers"] = status, {k.lower(): v for k, v in response_headers}

    # Like Django's test client: keep the test's database connection open across the request.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        result = application(environ, start_response)
        try:
            body = b"".join(result)
        finally:
            result.close()
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)
    return answer["status"], answer["headers"], body


@pytest.mark.django_db
def test_django_answers_head_with_headers_only(make_team, make_user, make_token):
    team = make_team()
    token = make_token(make_user(team=team), team=team)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    for path, status in ((f"/api/v1/jobs/{uuid.uuid4()}/", "404"), ("/healthz", "200"), ("/login/", "200"),
                         ("/static/dashboard/strata.css", "200"), ("/nowhere/", "404")):
        get_status, get_headers, get_body = _wsgi("GET", path, auth)
        head_status, head_headers, head_body = _wsgi("HEAD", path, auth)
        assert get_status.startswith(status) and head_status.startswith(status), path
        assert get_body and head_body == b"", path
        assert head_headers["content-type"] == get_headers["content-type"], path
        assert int(head_headers["content-length"]) == len(get_body), path


def test_head_middleware_closes_streams_and_keeps_headers(tmp_path):
    from django.http import FileResponse, HttpResponse, StreamingHttpResponse
    from django.test import RequestFactory

    from strata.api.head import HeadResponseMiddleware

    head = RequestFactory().head("/anything")
    file_path = tmp_path / "model.pt"
    file_path.write_bytes(b"x" * 1000)
    handle = file_path.open("rb")
    answered = HeadResponseMiddleware(lambda request: FileResponse(handle))(head)
    assert handle.closed and answered["Content-Length"] == "1000" and b"".join(answered) == b""

    def stream():
        yield b"chunk"

    answered = HeadResponseMiddleware(lambda request: StreamingHttpResponse(stream()))(head)
    assert b"".join(answered) == b""

    answered = HeadResponseMiddleware(lambda request: HttpResponse(b"hello", status=418))(head)
    assert answered.status_code == 418 and answered["Content-Length"] == "5" and answered.content == b""

    get = RequestFactory().get("/anything")
    assert HeadResponseMiddleware(lambda request: HttpResponse(b"hello"))(get).content == b"hello"


# --- several server processes on one port ---------------------------------------------------------------


def _listening(pid: int, port: int) -> bool:
    import psutil

    try:
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
                   for c in psutil.Process(pid).net_connections(kind="tcp"))
    except psutil.Error:
        return False


def test_workers_share_one_port_and_a_dead_one_is_replaced(tmp_path):
    import psutil

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    env = server_env(tmp_path)
    process, _ = start_listening([sys.executable, "-m", "strata.cli.main", "server", "--port", str(port),
                                  "--workers", "2", "--threads", "4"], env, tmp_path / "server.log",
                                 r"listening on http://127\.0\.0\.1:(\d+) \(2 processes\)")
    try:
        def workers() -> list[int]:
            return [child.pid for child in psutil.Process(process.pid).children() if _listening(child.pid, port)]

        first = wait_for(lambda: len(found := workers()) == 2 and found, 120, message="two processes listening")
        assert all(get(port, "GET", "/healthz").status == 200 for _ in range(6))
        os.kill(first[0], signal.SIGKILL)
        wait_for(lambda: len(found := workers()) == 2 and first[0] not in found and found, 120,
                 message="the killed process to be replaced")
        assert get(port, "GET", "/healthz").status == 200
        assert "exited with -9; starting another" in (tmp_path / "server.log").read_text()
    finally:
        reap(process)
    assert not psutil.pid_exists(first[1]) or psutil.Process(first[1]).status() == psutil.STATUS_ZOMBIE


def test_workers_need_a_fixed_port(tmp_path):
    done = subprocess.run([sys.executable, "-m", "strata.cli.main", "server", "--port", "0", "--workers", "2"],
                          env=server_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "--workers needs a fixed --port" in done.stderr
    assert "Traceback" not in done.stderr
