"""The control plane's HTTP server: waitress, hardened so that slow or idle clients cannot starve it.

Stock waitress stops accepting connections once ``connection_limit`` (100) sockets are open, whatever they are
doing, and keeps an idle or half-sent request open for ``channel_timeout`` (120 s). A hundred clients that each
send part of a request would then starve every node heartbeat past its lease. Here:

- the connection limit is much higher (``connection_limit``, fitted to the file-descriptor limit), sockets
  are watched with ``poll`` (``select`` cannot go past descriptor 1024), and an idle connection is closed
  after ``idle_timeout``;
- a request's headers must all arrive within ``header_timeout`` of its first byte (slowloris trickling); the
  body is not under that deadline (a large artifact upload takes what it takes), only under the idle timeout;
- at the connection limit the server keeps accepting: it closes the oldest connections that are not running a
  request (idle keep-alive sockets and half-sent headers first, then half-sent bodies, then answers the client
  is not reading), logged at INFO at most once a minute;
- node traffic first: a request under ``/api/v1/node/`` that carries an ``Authorization`` header goes to a lane
  of the task queue that is always served before user requests, and user requests may occupy at most
  ``threads - node_threads`` worker threads, so slow user requests never hold every thread while a heartbeat
  waits;
- a response to ``HEAD`` never carries body bytes, whatever the application returns (no response desync on a
  kept-alive connection). :class:`strata.api.head.HeadResponseMiddleware` does the same inside Django.

Pure waitress and standard library: the CLI reads the STRATA_SERVER_* settings and passes them in.
"""

from __future__ import annotations

import heapq
import logging
import math
import resource
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser
from waitress.server import MultiSocketServer, TcpWSGIServer
from waitress.task import ErrorTask, ThreadedTaskDispatcher, WSGITask
from waitress.utilities import RequestEntityTooLarge

logger = logging.getLogger("strata.server")

NODE_PREFIX = "/api/v1/node/"
FD_RESERVE = 256  # descriptors kept for the database, log files, the trigger pipe, imports...
FDS_PER_CONNECTION = 2  # the socket, plus a temporary file when a body or a response overflows to disk


@dataclass(frozen=True)
class ServerLimits:
    connection_limit: int = 1000
    idle_timeout: float = 30.0
    header_timeout: float = 10.0
    node_threads: int = 4
    max_body_bytes: int = 2**31
    reuse_port: bool = False  # SO_REUSEPORT: several server processes accept on one port (strata server --workers)
    # The largest body a request to a path may carry (the path -> bytes): past it, a 413 right after the headers,
    # before any of the body is read. None: only max_body_bytes, after the whole body has been buffered.
    body_limit: Callable[[str], int] | None = None
    maintenance_interval: int = 1  # seconds between sweeps for the idle and header deadlines
    log_interval: float = 60.0  # eviction and deadline closures are logged at most this often


def fit_to_fd_limit(connection_limit: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards what ``connection_limit`` needs; lower the limit if it cannot be."""
    need = connection_limit * FDS_PER_CONNECTION + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(hard, need)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < need:
        fitted = max(16, (soft - FD_RESERVE) // FDS_PER_CONNECTION)
        logger.warning("connection limit lowered from %d to %d: the open-file limit is %d (raise it with "
                       "ulimit -n or LimitNOFILE=)", connection_limit, fitted, soft)
        return fitted
    return connection_limit


def is_node_request(request) -> bool:
    """A node's request: under /api/v1/node/ and authenticated (the token itself is checked by Django)."""
    path = "/" + (getattr(request, "path", "") or "").lstrip("/")
    return path.startswith(NODE_PREFIX) and "AUTHORIZATION" in getattr(request, "headers", {})


# --- HEAD: headers only ------------------------------------------------------------------------------


class _HeadlessMixin:
    """Never write body bytes after the headers of a response to HEAD (nor a chunked terminator)."""

    def _is_head(self) -> bool:
        return getattr(self.request, "command", "") == "HEAD"

    def write(self, data):
        if data and self._is_head():
            self.content_bytes_written += len(data)
            data = b""
        return super().write(data)

    def finish(self):
        if not self._is_head():
            return super().finish()
        if not self.wrote_header:
            self.write(b"")
        return None


class StrataWSGITask(_HeadlessMixin, WSGITask):
    def get_environment(self):
        environ = super().get_environment()
        if self._is_head():
            # A file handed to wsgi.file_wrapper goes straight to the socket: make the app iterate it instead.
            environ.pop("wsgi.file_wrapper", None)
        return environ


class StrataErrorTask(_HeadlessMixin, ErrorTask):
    pass


# --- channels: when the current request started ------------------------------------------------------


class TimedRequestParser(HTTPRequestParser):
    """A parser is created when the first byte of a request arrives: remember when. With a ``body_limit`` (see
    :class:`ServerLimits`), a request whose ``Content-Length`` is over its path's limit is answered 413 as soon as
    its headers end, and a chunked body as soon as it grows past it: nothing more of it is read or buffered."""

    def __init__(self, adj):
        super().__init__(adj)
        self.started = time.time()

    def received(self, data):
        consumed = super().received(data)
        body_limit = getattr(self.adj, "strata_body_limit", None)
        if body_limit is not None and self.headers_finished and not self.completed and self.error is None:
            limit = body_limit(self.path or "/")
            size = self.body_bytes_received if self.chunked else self.content_length
            if size > limit:
                self.error = RequestEntityTooLarge(f"the request body exceeds the {limit} byte limit of this path")
                self.completed = True
        return consumed


class StrataChannel(HTTPChannel):
    task_class = StrataWSGITask
    error_task_class = StrataErrorTask
    parser_class = TimedRequestParser


def _busy(channel) -> bool:
    """Running a request or queued for a thread, or already closing: never evicted."""
    return bool(channel.requests or channel.will_close or channel.close_when_flushed)


def _eviction_key(channel):
    """Evicted first to last: idle sockets and half-sent headers (by when the client last made progress on a
    request), then half-sent bodies (uploads under way), then finished responses the client is slow to read."""
    if channel.total_outbufs_len:
        return (2, channel.last_activity)
    request = channel.request
    if request is None:
        return (0, channel.last_activity)
    if not request.headers_finished:
        return (0, getattr(request, "started", channel.last_activity))
    return (1, channel.last_activity)


# --- node-first task queue ---------------------------------------------------------------------------


class _Lanes:
    """The dispatcher's queue: node tasks, then user tasks. ``popleft`` and ``len`` for waitress's shutdown."""

    def __init__(self):
        self.node: deque = deque()
        self.user: deque = deque()

    def __len__(self):
        return len(self.node) + len(self.user)

    def append(self, task):
        self.user.append(task)

    def popleft(self):
        return (self.node or self.user).popleft()


class NodeFirstDispatcher(ThreadedTaskDispatcher):
    """Node requests are taken before any user request, and user requests may use at most
    ``threads - node_threads`` threads, so a few threads are always free for heartbeats and reports."""

    def __init__(self, node_threads: int = 0):
        super().__init__()
        self.queue = _Lanes()
        self.node_threads = max(0, node_threads)
        self.user_limit = 1
        self.user_active = 0

    def set_thread_count(self, count):
        super().set_thread_count(count)
        with self.lock:
            self.user_limit = max(1, count - min(self.node_threads, count - 1))

    def add_task(self, task):
        requests = getattr(task, "requests", None)
        node = bool(requests) and is_node_request(requests[0])
        with self.lock:
            (self.queue.node if node else self.queue.user).append(task)
            self.queue_cv.notify()

    def _take(self):
        if self.queue.node:
            return self.queue.node.popleft(), False
        if self.queue.user and self.user_active < self.user_limit:
            self.user_active += 1
            return self.queue.user.popleft(), True
        return None

    def handler_thread(self, thread_no):
        while True:
            with self.lock:
                while True:
                    if self.stop_count > 0:
                        self.active_count -= 1
                        self.stop_count -= 1
                        self.threads.discard(thread_no)
                        self.thread_exit_cv.notify()
                        return
                    taken = self._take()
                    if taken is not None:
                        break
                    self.active_count -= 1
                    self.queue_cv.wait()
                    self.active_count += 1
            task, user = taken
            try:
                task.service()
            except BaseException:
                self.logger.exception("Exception when servicing %r", task)
            finally:
                if user:
                    with self.lock:
                        self.user_active -= 1
                        if self.queue.user:
                            self.queue_cv.notify()


# --- the server ----------------------------------------------------------------------------------------


class _Closures:
    """Counts connections closed by eviction and by the header deadline; logs them at most once a while."""

    def __init__(self, limits: ServerLimits):
        self.limits = limits
        self.lock = threading.Lock()
        self.evicted = 0
        self.header_timeouts = 0
        self.last_log = 0.0
        self.total_evicted = 0
        self.total_header_timeouts = 0

    def note(self, now: float, evicted: int = 0, header_timeouts: int = 0) -> None:
        with self.lock:
            self.evicted += evicted
            self.header_timeouts += header_timeouts
            self.total_evicted += evicted
            self.total_header_timeouts += header_timeouts
        self.flush(now)

    def flush(self, now: float) -> None:
        with self.lock:
            if not (self.evicted or self.header_timeouts) or now - self.last_log < self.limits.log_interval:
                return
            evicted, header_timeouts = self.evicted, self.header_timeouts
            self.evicted = self.header_timeouts = 0
            self.last_log = now
        logger.info("closed %d connection(s) at the connection limit (%d), oldest idle or incomplete first, "
                    "and %d whose request headers did not arrive within %g s (counts since the last such "
                    "message, at most one a %g s)", evicted, self.limits.connection_limit, header_timeouts,
                    self.limits.header_timeout, self.limits.log_interval)


class HardenedServer(TcpWSGIServer):
    channel_class = StrataChannel

    def __init__(self, application, *, limits: ServerLimits, closures: _Closures, **kw):
        self.limits = limits
        self.closures = closures
        self.hard_limit = limits.connection_limit + max(16, limits.connection_limit // 10)
        super().__init__(application, **kw)

    def set_reuse_addr(self):
        super().set_reuse_addr()
        if self.limits.reuse_port:  # the kernel spreads new connections over the processes bound to the port
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)

    def readable(self):
        now = time.time()
        if now >= self.next_channel_cleanup:
            self.next_channel_cleanup = now + self.adj.cleanup_interval
            self.maintenance(now)
        if not self.accepting:
            return False
        accept = self._make_room(now)
        if not accept and not self.in_connection_overflow:
            self.in_connection_overflow = True
            logger.warning("%d connections are open and all are running a request: not accepting new ones "
                           "until some finish", len(self.active_channels))
        elif accept and self.in_connection_overflow:
            self.in_connection_overflow = False
            logger.info("accepting connections again")
        return accept

    def _make_room(self, now: float) -> bool:
        """At the connection limit, mark the oldest connections that run no request for closing."""
        channels = self.active_channels
        total, limit = len(channels), self.limits.connection_limit
        if total < limit:
            return True
        closing = sum(1 for channel in channels.values() if channel.will_close or channel.close_when_flushed)
        live = total - closing
        if live >= limit:
            # Make a little room at once so that a flood does not sort the channels on every accept.
            wanted = live - limit + 1 + limit // 50
            victims = heapq.nsmallest(wanted, (c for c in channels.values() if not _busy(c)), key=_eviction_key)
            for channel in victims:
                channel.will_close = True
            live -= len(victims)
            if victims:
                self.closures.note(now, evicted=len(victims))
        return live < limit and total < self.hard_limit

    def maintenance(self, now):
        """Close idle connections and requests whose headers are past their deadline."""
        idle_cutoff = now - self.limits.idle_timeout
        header_cutoff = now - self.limits.header_timeout
        header_timeouts = 0
        for channel in list(self.active_channels.values()):
            if channel.requests or channel.will_close:
                continue
            request = channel.request
            if request is not None and not request.headers_finished \
                    and getattr(request, "started", now) < header_cutoff:
                channel.will_close = True
                header_timeouts += 1
            elif channel.last_activity < idle_cutoff:
                channel.will_close = True
        if header_timeouts:
            self.closures.note(now, header_timeouts=header_timeouts)
        else:
            self.closures.flush(now)


def create_server(application, *, host: str = "127.0.0.1", port: int = 8000, threads: int = 16,
                  limits: ServerLimits | None = None, ident: str = "strata", **adjustments):
    """A hardened waitress server for ``application``; call ``.run()`` on it. ``port=0`` picks a free port
    (``.effective_port`` of a single-socket server says which)."""
    limits = limits or ServerLimits()
    limits = replace(limits, connection_limit=fit_to_fd_limit(limits.connection_limit))
    adj = Adjustments(host=host, port=port, threads=threads, ident=ident,
                      connection_limit=limits.connection_limit,
                      channel_timeout=max(1, math.ceil(limits.idle_timeout)),
                      cleanup_interval=max(1, limits.maintenance_interval),
                      asyncore_use_poll=True,
                      max_request_body_size=limits.max_body_bytes,
                      **adjustments)
    adj.strata_body_limit = limits.body_limit  # read by TimedRequestParser
    dispatcher = NodeFirstDispatcher(limits.node_threads)
    dispatcher.set_thread_count(adj.threads)
    socket_map: dict = {}
    closures = _Closures(limits)
    servers = [HardenedServer(application, map=socket_map, dispatcher=dispatcher, adj=adj, sockinfo=sockinfo,
                              limits=limits, closures=closures) for sockinfo in adj.listen]
    # Several listening sockets (a host name with IPv4 and IPv6 addresses) share one set of connections.
    shared = servers[0].active_channels
    for server in servers[1:]:
        server.active_channels = shared
    if len(servers) == 1:
        return servers[0]
    listening = [(server.effective_host, server.effective_port) for server in servers]
    return MultiSocketServer(socket_map, adj, listening, dispatcher, servers[0].log_info)
