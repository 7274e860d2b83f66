"""A real webhook receiver for tests: an http.server thread on 127.0.0.1 that records each POST and answers as the
test says (codes in turn, or silence for a while). Importable from every test as ``webhook_receiver``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() when the request's body was read

    def json(self):
        return json.loads(self.body)


@dataclass
class Receiver:
    """What the receiver got, and how it answers: ``codes`` (popped per request, then 200), ``hang`` seconds of
    silence before answering (``release`` ends them early)."""

    url: str = ""
    received: list[Received] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)
    hang: float = 0.0
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_for(self, count: int, timeout: float = 60.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.received) >= count:
                    return list(self.received)
            time.sleep(0.02)
        raise AssertionError(f"the receiver got {len(self.received)} requests, not {count}, in {timeout:g} s")


def start_receiver() -> tuple[Receiver, ThreadingHTTPServer, threading.Thread]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            with state.lock:
                state.received.append(Received(self.path, {k: v for k, v in self.headers.items()}, body,
                                               time.monotonic()))
                code = state.codes.pop(0) if state.codes else 200
            if state.hang:
                state.release.wait(state.hang)
            try:
                self.send_response(code)
                answer = b"ok" if code < 300 else b"receiver error"
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
            except OSError:  # the sender gave up (timeout) and closed the connection
                pass

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    return state, server, thread


@contextmanager
def receiving() -> Iterator[Receiver]:
    """A started receiver, shut down (its hanging answers released, its thread joined) on exit."""
    state, server, thread = start_receiver()
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)
