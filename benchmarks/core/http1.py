"""A small HTTP/1.1 keep-alive client on asyncio streams, for the load generators of ``strata bench`` (the
heartbeat benchmark's simulated nodes, the soak's users): thousands of connections in one process, no
third-party client. Standard library only."""

from __future__ import annotations

import asyncio
import time


class HttpError(Exception):
    pass


class Connection:
    """One kept-alive HTTP/1.1 connection with a bearer token (a node agent's or a user's ``requests.Session``).

    A request that finds the socket closed by the server (idle timeout, eviction at the connection limit) is sent
    once more on a new connection, as urllib3 does with a dropped pooled one -- except an unsafe one, unless
    ``resend_unsafe`` (the caller's requests are idempotent: heartbeats). ``idle_reopen_s``: a connection idle
    that long is reopened before use (below the server's idle timeout, so it is never found closed)."""

    def __init__(self, host: str, port: int, token: str, *, agent: str = "strata-bench",
                 idle_reopen_s: float | None = None, resend_unsafe: bool = False):
        self.host, self.port = host, port
        self.head = (f"Host: {host}:{port}\r\nAuthorization: Bearer {token}\r\nUser-Agent: {agent}\r\n"
                     "Accept: application/json\r\n").encode()
        self.idle_reopen_s = idle_reopen_s
        self.resend_unsafe = resend_unsafe
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.last_used = 0.0
        self.connects = 0

    def close(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:  # noqa: BLE001 - closing a broken socket
                pass
        self.reader = self.writer = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        return await self.request("POST", path, body)

    async def request(self, method: str, path: str, body: bytes | None = None,
                      headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        if body is not None:
            extra += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        message = f"{method} {path} HTTP/1.1\r\n".encode() + self.head + extra.encode() + b"\r\n" + (body or b"")
        for attempt in (0, 1):
            stale = self.idle_reopen_s is not None and time.monotonic() - self.last_used > self.idle_reopen_s
            fresh = stale or self.writer is None or self.writer.is_closing() or self.reader.at_eof()
            if fresh:
                self.close()
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
                self.connects += 1
            try:
                self.writer.write(message)
                await self.writer.drain()
                answer = await self._response()
                self.last_used = time.monotonic()
                return answer
            except (ConnectionError, asyncio.IncompleteReadError, HttpError, OSError, ValueError):
                self.close()
                if attempt or fresh or (method not in ("GET", "HEAD") and not self.resend_unsafe):
                    raise
        raise AssertionError("unreachable")

    async def _response(self) -> tuple[int, bytes]:
        line = await self.reader.readline()
        if not line:
            raise HttpError("connection closed before the answer")
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise HttpError(f"bad status line {line[:80]!r}")
        status = int(parts[1])
        length, chunked, close = None, False, False
        while True:
            header = await self.reader.readline()
            if header in (b"\r\n", b"\n", b""):
                break
            name, _, value = header.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value:
                chunked = True
            elif name == b"connection" and value == b"close":
                close = True
        if chunked:
            pieces = []
            while True:
                size = int((await self.reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await self.reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                pieces.append(await self.reader.readexactly(size))
                await self.reader.readexactly(2)
            payload = b"".join(pieces)
        elif length is not None:
            payload = await self.reader.readexactly(length)
        else:
            payload = await self.reader.read()
            close = True
        if close:
            self.close()
        return status, payload
