"""Real throttled network links: a token bucket and a TCP proxy that charges every byte to it (node side, stdlib).

:class:`components.runtime.contract.distributed.Link` turns a byte count into a sleep; the links here carry the real
bytes. A :class:`ThrottledProxy` listens on an explicit address (127.0.0.1 unless told otherwise) and forwards
each connection it accepts to one target, charging the bytes of each direction to that direction's
:class:`TokenBucket` -- one bucket per direction, shared by every connection through the proxy, so the proxy is
one full-duplex link of ``mbit`` Mbit/s each way -- and optionally delaying them by a fixed one-way latency.
It runs one asyncio event loop on one thread (any number of connections, half-closes forwarded); :meth:`stop`
closes every connection and joins that thread.

Throttling hivemind (the recipe, verified with hivemind 1.1.12 on 127.0.0.1 by
``tests/components/decentral/test_throttle.py``)
--------------------------------------------------------------------------------------------------------------
Give every peer a proxy in front of its libp2p listen port and make the peer *announce* the proxy::

    port = free_port()                                    # the peer's real (hidden) listen port
    proxy = ThrottledProxy("127.0.0.1", port, mbit=100).start()
    dht = hivemind.DHT(start=True, initial_peers=[...],
                       host_maddrs=[f"/ip4/127.0.0.1/tcp/{port}"],
                       announce_maddrs=[f"/ip4/127.0.0.1/tcp/{proxy.port}"])

The same two keyword arguments work for ``hivemind.P2P.create`` (``DHT`` passes them through). Nothing else is
needed: no relay or NAT option, no ``/p2p/<id>`` suffix in ``announce_maddrs`` (it needs an explicit port).
``announce_maddrs`` becomes p2pd's ``-announceAddrs``, which replaces the host's advertised addresses (go-libp2p's
``AddrsFactory``): ``get_visible_maddrs()`` returns only the proxy, and that is what identify gives the other
peers, so none of them learns the real listen port. Peers bootstrap with ``initial_peers`` = an earlier
peer's ``get_visible_maddrs()``, i.e. through its proxy. Observed (hivemind 1.1.12, 2 and 3 peers, a
``DecentralizedAverager`` round): one libp2p connection per peer pair, dialed to the other peer's proxy and
reused both ways; ``ss -tnp`` shows only p2pd-to-proxy and proxy-to-listen-port connections, never one
p2pd-to-p2pd; the proxies' counters carry the whole all-reduce payload, and at 8 Mbit/s the round takes at
least the payload's time. :func:`throttled_mesh` does the bookkeeping for ``n`` peers;
:func:`hivemind_addresses` returns the two keyword arguments for one peer and its proxy. Run the proxies in a
process that does little else (e.g. the benchmark's parent, with the peers in their own processes): they share
one interpreter's GIL.

A connection passes only the *dialed* peer's proxy, so that proxy charges the dialing peer's buckets too:
go-libp2p dials from its own listen port (SO_REUSEPORT; ``LIBP2P_TCP_REUSEPORT=false`` would turn that off),
so the connection's source port names the dialing peer, and :func:`throttled_mesh` gives every proxy the other
peers' listen ports and buckets (:attr:`ThrottledProxy.dialers`). Each peer thus has one access link of
``mbit`` up and ``mbit`` down, and every byte is charged to its sender's uplink and its receiver's downlink.
A connection from an unknown port (libp2p opens a few small ones, e.g. a redial that could not reuse the port)
is charged to the dialed peer's link only. Observed with 4 peers in their own processes and a 4 MB
``DecentralizedAverager`` round at 20 Mbit/s: every peer sent and received 6.35 MB (within 0.5 % of each
other), and the round took 3.3 s (the bytes alone need 2.5 s).
Forked processes (hivemind's DHT and averager run in children forked from the process that started the
proxies) inherit the proxies' sockets; :meth:`ThrottledProxy.stop` still stops forwarding, but a connection's
socket is only released when those children exit too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
STREAM_LIMIT = 1 << 20
CONNECT_TIMEOUT_S = 10.0


def mbit_to_bytes_per_s(mbit: float) -> float:
    return float(mbit) * 1e6 / 8


class TokenBucket:
    """A token bucket of ``rate_bytes_per_s`` that holds at most ``burst_bytes``.

    :meth:`consume` takes ``n`` tokens and blocks (sleeping) until the bucket's balance is back to zero: a
    request larger than what is there (even larger than the burst) takes the tokens on credit and waits the
    time the rate needs to repay them. Concurrent consumers queue in the order they asked (each one's wait
    includes the credit of those before it), so the bucket's long-run rate is exact whatever the request
    sizes. Thread-safe; :meth:`aconsume` is the same for asyncio (it never blocks the loop), and
    :meth:`reserve` takes the tokens and only returns the wait, for callers that sleep their own way (or
    charge several buckets at once and wait for the slowest, :func:`reserve_all`). A rate of ``math.inf``
    never waits and only counts. :attr:`consumed` counts every byte charged."""

    def __init__(self, rate_bytes_per_s: float, burst_bytes: float | None = None, *, clock=time.monotonic):
        if not rate_bytes_per_s > 0:
            raise ValueError(f"rate must be positive (bytes per second), not {rate_bytes_per_s!r}")
        self.rate = float(rate_bytes_per_s)
        self.burst = float(burst_bytes if burst_bytes is not None else default_burst(self.rate))
        if not self.burst > 0:
            raise ValueError(f"burst must be positive (bytes), not {burst_bytes!r}")
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens = self.burst
        self._last = clock()
        self.consumed = 0

    @property
    def unlimited(self) -> bool:
        return math.isinf(self.rate)

    def reserve(self, n: int) -> float:
        """Take ``n`` tokens now (on credit if need be); the seconds to wait until they are paid for."""
        with self._lock:
            self.consumed += n
            if self.unlimited:
                return 0.0
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= n
            return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def consume(self, n: int) -> float:
        """Take ``n`` tokens, sleeping until they are available; returns the seconds slept."""
        wait = self.reserve(n)
        if wait > 0:
            time.sleep(wait)
        return wait

    async def aconsume(self, n: int) -> float:
        wait = self.reserve(n)
        if wait > 0:
            await asyncio.sleep(wait)
        return wait

    @property
    def tokens(self) -> float:
        """The balance now (negative while consumers wait)."""
        if self.unlimited:
            return math.inf
        with self._lock:
            return min(self.burst, self._tokens + (self._clock() - self._last) * self.rate)


def reserve_all(buckets: Sequence[TokenBucket], n: int) -> float:
    """Charge ``n`` bytes to every bucket (the links along a path); the wait is the slowest one's."""
    return max((bucket.reserve(n) for bucket in buckets), default=0.0)


def default_burst(rate_bytes_per_s: float) -> float:
    """5 ms of the rate, at least 64 KiB: a link's queue, not a second's worth of free bytes."""
    return math.inf if math.isinf(rate_bytes_per_s) else max(64 * 1024.0, rate_bytes_per_s * 0.005)


class ThrottledProxy:
    """A TCP proxy from ``listen_host:listen_port`` to ``target_host:target_port`` that throttles to ``mbit``
    Mbit/s each way (None: unlimited, counting only) and adds ``latency_ms`` of one-way delay.

    The proxy is the target's access link: bytes from the connecting clients to the target are charged to
    :attr:`downlink`, bytes back to :attr:`uplink` -- one :class:`TokenBucket` per direction, shared by all
    connections through the proxy (``burst_bytes``: their depth, :func:`default_burst` if None).
    :attr:`bytes_to_target` and :attr:`bytes_from_target` count the bytes this proxy forwarded.

    ``dialers`` maps a client's *source port* to that client's own ``(uplink, downlink)`` buckets: a
    connection from such a port is charged to both ends' links (the wait is the slower one's, as on a path
    through two access links). go-libp2p dials from its listen port (SO_REUSEPORT), so for hivemind peers the
    source port names the dialing peer; :func:`throttled_mesh` fills it in. Connections from other ports are
    charged to this proxy's buckets only. Use as a context manager or call :meth:`start` and :meth:`stop`."""

    def __init__(self, target_host: str, target_port: int, *, listen_host: str = "127.0.0.1",
                 listen_port: int = 0, mbit: float | None = None, latency_ms: float = 0.0,
                 burst_bytes: float | None = None, chunk_bytes: int = CHUNK_BYTES,
                 dialers: dict[int, tuple[TokenBucket, TokenBucket]] | None = None):
        if mbit is not None and not mbit > 0:
            raise ValueError(f"mbit must be positive or None, not {mbit!r}")
        if latency_ms < 0:
            raise ValueError(f"latency_ms must be >= 0, not {latency_ms!r}")
        self.target = (str(target_host), int(target_port))
        self.listen = (str(listen_host), int(listen_port))
        self.mbit = float(mbit) if mbit is not None else None
        self.latency_s = float(latency_ms) / 1000.0
        self.chunk_bytes = int(chunk_bytes)
        rate = mbit_to_bytes_per_s(mbit) if mbit is not None else math.inf
        self.downlink = TokenBucket(rate, burst_bytes)
        self.uplink = TokenBucket(rate, burst_bytes)
        self.dialers: dict[int, tuple[TokenBucket, TokenBucket]] = dict(dialers or {})
        self.connections_from_dialers = 0
        self.bytes_to_target = 0
        self.bytes_from_target = 0
        self.connections_total = 0
        self.connections_open = 0
        self.connect_failures = 0
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    # -- the outside (any thread) ------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return self.listen[0]

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the proxy is not started")
        return self._port

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def bytes_total(self) -> int:
        return self.bytes_to_target + self.bytes_from_target

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout: float = 10.0) -> ThrottledProxy:
        if self._thread is not None:
            raise RuntimeError("the proxy was already started")
        self._thread = threading.Thread(target=self._run, name=f"throttled-proxy->{self.target[1]}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise TimeoutError(f"the proxy to {self.target[0]}:{self.target[1]} did not start in {timeout} s")
        if self._error is not None:
            self._thread.join(timeout)
            raise OSError(f"the proxy could not listen on {self.listen[0]}:{self.listen[1]}: {self._error}") \
                from self._error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listener and every connection, stop the loop and join its thread (idempotent)."""
        thread, loop = self._thread, self._loop
        if thread is None:
            return
        if loop is not None and self._stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(self._stopping.set)
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError(f"the proxy thread {thread.name} did not stop in {timeout} s")

    def __enter__(self) -> ThrottledProxy:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.address if self._port is not None else "(not started)"
        return (f"ThrottledProxy({where} -> {self.target[0]}:{self.target[1]}, mbit={self.mbit}, "
                f"latency_ms={self.latency_s * 1000:g})")

    # -- the loop's thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as error:  # noqa: BLE001 -- reported by start() or logged
            if not self._ready.is_set():
                self._error = error
            else:
                log.exception("throttled proxy %r failed", self)
        finally:
            self._ready.set()
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._accept, self.listen[0], self.listen[1], limit=STREAM_LIMIT,
                                            reuse_address=True)
        self._port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            server.close()
            for writer in list(self._writers):
                with contextlib.suppress(Exception):
                    writer.transport.abort()
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)

    def _track(self, task: asyncio.Task) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        # A plain callback starting our own task: asyncio's streams would otherwise own (and, on 3.11, trip
        # over) the task that stop() cancels.
        self._track(asyncio.get_running_loop().create_task(self._serve(client_reader, client_writer)))

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections_total += 1
        self.connections_open += 1
        self._writers.add(client_writer)
        target_writer = None
        _nodelay(client_writer)
        try:
            try:
                target_reader, target_writer = await asyncio.wait_for(
                    asyncio.open_connection(*self.target, limit=STREAM_LIMIT), CONNECT_TIMEOUT_S)
            except (TimeoutError, OSError) as error:
                self.connect_failures += 1
                log.debug("proxy %s could not reach %s:%s: %s", self.address, *self.target, error)
                return
            self._writers.add(target_writer)
            _nodelay(target_writer)
            path_in, path_out = [self.downlink], [self.uplink]
            peer = client_writer.get_extra_info("peername")
            dialer = self.dialers.get(peer[1]) if isinstance(peer, tuple) and len(peer) >= 2 else None
            if dialer is not None:
                self.connections_from_dialers += 1
                path_in.insert(0, dialer[0])
                path_out.append(dialer[1])
            pumps = [asyncio.create_task(self._pump(client_reader, target_writer, path_in, True)),
                     asyncio.create_task(self._pump(target_reader, client_writer, path_out, False))]
            for pump in pumps:
                self._track(pump)
            try:
                done, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
                for pump in done:
                    if not pump.cancelled() and pump.exception() is not None:
                        log.debug("proxy %s: connection dropped: %s", self.address, pump.exception())
                if pending:  # one side failed (a reset): drop the whole connection
                    for pump in pending:
                        pump.cancel()
                    await asyncio.gather(*pending, return_exceptions=True)
            finally:
                for pump in pumps:
                    pump.cancel()
        finally:
            for writer in (client_writer, target_writer):
                if writer is None:
                    continue
                self._writers.discard(writer)
                with contextlib.suppress(Exception):
                    writer.close()
            self.connections_open -= 1

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    path: list[TokenBucket], to_target: bool) -> None:
        """Forward one direction until end of stream, then half-close the other side's writing end."""
        queue: asyncio.Queue | None = None
        deliver: asyncio.Task | None = None
        if self.latency_s > 0:
            # Bytes are in flight for latency_s after the buckets let them go; a bounded queue is the wire.
            queue = asyncio.Queue(maxsize=256)
            deliver = asyncio.create_task(self._deliver(queue, writer, to_target))
        try:
            loop = asyncio.get_running_loop()
            while True:
                data = await reader.read(self.chunk_bytes)
                if not data:
                    break
                wait = reserve_all(path, len(data))
                if wait > 0:
                    await asyncio.sleep(wait)
                if queue is None:
                    writer.write(data)
                    self._count(len(data), to_target)
                    await writer.drain()
                else:
                    await _put_unless_failed(queue, (loop.time() + self.latency_s, data), deliver)
            if queue is not None and deliver is not None:
                await queue.put(None)
                await deliver
            if writer.can_write_eof() and not writer.is_closing():
                writer.write_eof()
        finally:
            if deliver is not None and not deliver.done():
                deliver.cancel()
                await asyncio.gather(deliver, return_exceptions=True)

    async def _deliver(self, queue: asyncio.Queue, writer: asyncio.StreamWriter, to_target: bool) -> None:
        loop = asyncio.get_running_loop()
        while (item := await queue.get()) is not None:
            due, data = item
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            writer.write(data)
            self._count(len(data), to_target)
            await writer.drain()

    def _count(self, n: int, to_target: bool) -> None:
        if to_target:
            self.bytes_to_target += n
        else:
            self.bytes_from_target += n


async def _put_unless_failed(queue: asyncio.Queue, item, deliver: asyncio.Task) -> None:
    """``queue.put(item)``, unless the task that empties the queue failed (then its error, not a hang)."""
    if queue.full():
        put = asyncio.ensure_future(queue.put(item))
        await asyncio.wait({put, deliver}, return_when=asyncio.FIRST_COMPLETED)
        if put.done():
            return
        put.cancel()
    elif not deliver.done():
        queue.put_nowait(item)
        return
    deliver.result()  # raises the delivery's error
    raise ConnectionError("the connection's delivery stopped")


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (bind to port 0, read it, close): for listeners that need it up front."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def hivemind_addresses(listen_port: int, proxy: ThrottledProxy) -> dict[str, list[str]]:
    """The keyword arguments of ``hivemind.DHT``/``P2P.create`` that make a peer listen on ``listen_port``
    of the proxy's host and announce only ``proxy`` (see the module's recipe)."""
    return {"host_maddrs": [f"/ip4/{proxy.target[0]}/tcp/{int(listen_port)}"],
            "announce_maddrs": [f"/ip4/{proxy.host}/tcp/{proxy.port}"]}


@dataclass
class MeshPeer:
    """One peer's link of a :func:`throttled_mesh`: where it listens, and its proxy (what it announces)."""

    index: int
    listen_port: int
    proxy: ThrottledProxy

    @property
    def host_maddrs(self) -> list[str]:
        return [f"/ip4/{self.proxy.target[0]}/tcp/{self.listen_port}"]

    @property
    def announce_maddrs(self) -> list[str]:
        return [f"/ip4/{self.proxy.host}/tcp/{self.proxy.port}"]

    @property
    def hivemind_kwargs(self) -> dict[str, list[str]]:
        return {"host_maddrs": self.host_maddrs, "announce_maddrs": self.announce_maddrs}

    @property
    def bytes_sent(self) -> int:
        """Bytes charged to this peer's uplink (through its own proxy or, when it dialed, another's)."""
        return self.proxy.uplink.consumed

    @property
    def bytes_received(self) -> int:
        return self.proxy.downlink.consumed


@contextlib.contextmanager
def throttled_mesh(n_peers: int, mbit: float | None, latency_ms: float = 0.0, *, host: str = "127.0.0.1",
                   listen_ports: Sequence[int] | None = None) -> Iterator[list[MeshPeer]]:
    """``n_peers`` access links of ``mbit`` Mbit/s each way, each a started :class:`ThrottledProxy` in front of
    a free listen port of ``host``; every proxy is stopped on exit. Peer ``i`` passes
    ``peers[i].hivemind_kwargs`` to ``hivemind.DHT`` (it listens on ``listen_port`` and announces its proxy)
    and bootstraps from an earlier peer's visible multiaddrs. Every proxy knows the others' listen ports as
    ``dialers``, so the bytes between two peers are charged to the sender's uplink and the receiver's downlink
    whichever of them dialed (:attr:`MeshPeer.bytes_sent`, :attr:`MeshPeer.bytes_received`)."""
    ports = list(listen_ports) if listen_ports is not None else [free_port(host) for _ in range(n_peers)]
    if len(ports) != n_peers:
        raise ValueError(f"{len(ports)} listen ports for {n_peers} peers")
    peers: list[MeshPeer] = []
    try:
        for index, port in enumerate(ports):
            proxy = ThrottledProxy(host, port, listen_host=host, mbit=mbit, latency_ms=latency_ms).start()
            peers.append(MeshPeer(index, port, proxy))
        for peer in peers:
            peer.proxy.dialers = {other.listen_port: (other.proxy.uplink, other.proxy.downlink)
                                  for other in peers if other is not peer}
        yield peers
    finally:
        for peer in peers:
            peer.proxy.stop()
