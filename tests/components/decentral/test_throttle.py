"""Token buckets and throttled TCP proxies, alone and in front of real hivemind peers.

Only lower bounds on time are asserted (a throttled transfer cannot be faster than its bytes allow); waits are on
states and counts, with generous timeouts, so the tests hold on a loaded 2-core machine."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import struct
import threading
import time

import pytest

from benchmarks.decentral.throttle import (
    ThrottledProxy,
    TokenBucket,
    default_burst,
    free_port,
    hivemind_addresses,
    reserve_all,
    throttled_mesh,
)

MB = 1_000_000


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _proxy_threads() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name.startswith("throttled-proxy")]


def _wait_for(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# -- the bucket ---------------------------------------------------------------------------------------------

def test_bucket_math_on_a_fake_clock():
    clock = FakeClock()
    bucket = TokenBucket(1000, 500, clock=clock)
    assert bucket.reserve(300) == 0.0  # within the burst
    assert bucket.reserve(200) == 0.0
    assert bucket.reserve(1000) == pytest.approx(1.0)  # on credit: a second at 1000 B/s
    assert bucket.reserve(500) == pytest.approx(1.5)  # queued behind the first
    clock.now += 1.5
    assert bucket.tokens == pytest.approx(0.0)
    clock.now += 10  # refills up to the burst only
    assert bucket.tokens == pytest.approx(500)
    assert bucket.reserve(2500) == pytest.approx(2.0)  # larger than the burst: still just rate-limited
    assert bucket.consumed == 300 + 200 + 1000 + 500 + 2500
    other = TokenBucket(2000, 100, clock=clock)
    assert reserve_all([bucket, other], 1000) == pytest.approx(3.0)  # the slowest link of the path
    assert other.tokens == pytest.approx(100 - 1000)


def test_bucket_rejects_bad_rates_and_unlimited_only_counts():
    for rate in (0, -1):
        with pytest.raises(ValueError):
            TokenBucket(rate)
    unlimited = TokenBucket(float("inf"))
    assert unlimited.consume(10**12) == 0.0 and unlimited.consumed == 10**12
    assert default_burst(1e3) == 64 * 1024 and default_burst(1e9) == 1e9 * 0.005


def test_consume_blocks_for_the_bytes_over_the_burst():
    bucket = TokenBucket(1 * MB, 100_000)
    assert bucket.consume(100_000) == 0.0
    started = time.monotonic()
    bucket.consume(500_000)
    assert time.monotonic() - started >= 0.45


def test_concurrent_consumers_share_the_rate():
    bucket = TokenBucket(400_000, 50_000)
    started = time.monotonic()
    threads = [threading.Thread(target=lambda: [bucket.consume(25_000) for _ in range(4)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    # 400 kB at 400 kB/s, less the burst.
    assert time.monotonic() - started >= (400_000 - 50_000) / 400_000 * 0.95


def test_aconsume_sleeps_without_blocking_the_loop():
    bucket = TokenBucket(1 * MB, 64_000)

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        started = time.monotonic()
        await bucket.aconsume(64_000)
        await bucket.aconsume(400_000)
        elapsed = time.monotonic() - started
        task.cancel()
        return elapsed, ticks

    elapsed, ticks = asyncio.run(main())
    assert elapsed >= 0.38
    assert ticks >= 3  # the loop kept running while the bucket waited


# -- the proxy ----------------------------------------------------------------------------------------------

class Server:
    """A test TCP server on 127.0.0.1: ``echo`` (echo until end of stream, then half-close), ``sink`` (read to
    the end, then answer the byte count and SHA-256), or ``source`` (send ``n`` bytes, then close)."""

    def __init__(self, mode: str, n: int = 0):
        self.mode, self.n = mode, n
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.threads: list[threading.Thread] = []
        self.accepted = 0
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            thread = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _handle(self, conn):
        with conn:
            try:
                if self.mode == "echo":
                    while data := conn.recv(1 << 16):
                        conn.sendall(data)
                    conn.shutdown(socket.SHUT_WR)
                elif self.mode == "sink":
                    digest, count = hashlib.sha256(), 0
                    while data := conn.recv(1 << 16):
                        digest.update(data)
                        count += len(data)
                    conn.sendall(f"{count} {digest.hexdigest()}".encode())
                    conn.shutdown(socket.SHUT_WR)
                elif self.mode == "source":
                    conn.sendall(b"x" * self.n)
            except OSError:
                pass

    def close(self):
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (close() alone does not)
        self.listener.close()
        self.thread.join(10)
        assert not self.thread.is_alive()


def _recv_all(sock) -> bytes:
    chunks = []
    while data := sock.recv(1 << 16):
        chunks.append(data)
    return b"".join(chunks)


@pytest.fixture
def echo():
    server = Server("echo")
    yield server
    server.close()


def test_proxy_forwards_bytes_intact_both_ways_and_counts_them(echo):
    before = _proxy_threads()
    payload = os.urandom(1_000_000)
    with ThrottledProxy("127.0.0.1", echo.port) as proxy:
        assert proxy.host == "127.0.0.1" and proxy.address == f"127.0.0.1:{proxy.port}"
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as client:
            sender = threading.Thread(target=lambda: (client.sendall(payload), client.shutdown(socket.SHUT_WR)))
            sender.start()
            assert _recv_all(client) == payload  # the echo's half-close reached us too
            sender.join(30)
        _wait_for(lambda: proxy.connections_open == 0, what="the connection to close")
        assert proxy.bytes_to_target == proxy.bytes_from_target == len(payload)
        assert proxy.uplink.consumed == proxy.downlink.consumed == len(payload)
        assert proxy.connections_total == 1
    assert _proxy_threads() == before


def test_half_close_keeps_the_other_direction_open():
    sink = Server("sink")
    payload = os.urandom(300_000)
    try:
        with ThrottledProxy("127.0.0.1", sink.port, mbit=50) as proxy:
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as client:
                client.sendall(payload)
                client.shutdown(socket.SHUT_WR)  # we are done sending; the answer must still come back
                answer = _recv_all(client).decode()
            assert answer == f"{len(payload)} {hashlib.sha256(payload).hexdigest()}"
            assert proxy.bytes_to_target == len(payload)
    finally:
        sink.close()


def test_many_concurrent_connections(echo):
    results: dict[int, bool] = {}

    def client(index):
        payload = os.urandom(50_000 + index)
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=60) as sock:
            sender = threading.Thread(target=lambda: (sock.sendall(payload), sock.shutdown(socket.SHUT_WR)))
            sender.start()
            results[index] = _recv_all(sock) == payload
            sender.join(60)

    with ThrottledProxy("127.0.0.1", echo.port, mbit=200) as proxy:
        clients = [threading.Thread(target=client, args=(index,)) for index in range(24)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(60)
        assert results == {index: True for index in range(24)}
        assert proxy.connections_total == 24
        expected = sum(50_000 + index for index in range(24))
        _wait_for(lambda: proxy.bytes_from_target == expected, what="every echo to be counted")
        assert proxy.bytes_to_target == expected


@pytest.mark.parametrize("direction", ["to_target", "from_target"])
def test_throttle_slows_each_direction(direction):
    n, mbit = 1_500_000, 8  # 1 MB/s: 1.5 s at least, less the burst
    server = Server("sink" if direction == "to_target" else "source", n)
    try:
        with ThrottledProxy("127.0.0.1", server.port, mbit=mbit) as proxy:
            started = time.monotonic()
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=60) as client:
                if direction == "to_target":
                    client.sendall(b"y" * n)
                    client.shutdown(socket.SHUT_WR)
                    assert _recv_all(client).split()[0] == str(n).encode()
                else:
                    assert len(_recv_all(client)) == n
            elapsed = time.monotonic() - started
            burst = proxy.uplink.burst
            assert elapsed >= (n - burst) / (mbit * 1e6 / 8) * 0.95
            counted = proxy.bytes_to_target if direction == "to_target" else proxy.bytes_from_target
            assert counted == n
    finally:
        server.close()


def test_latency_delays_each_way(echo):
    with ThrottledProxy("127.0.0.1", echo.port, latency_ms=150) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as client:
            started = time.monotonic()
            client.sendall(b"ping")
            got = b""
            while len(got) < 4:
                got += client.recv(4)
            assert got == b"ping"
            assert time.monotonic() - started >= 0.29  # there and back


def test_latency_and_throttle_together_keep_the_bytes_intact(echo):
    payload = os.urandom(600_000)
    with ThrottledProxy("127.0.0.1", echo.port, mbit=40, latency_ms=20, chunk_bytes=4096) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=60) as client:
            sender = threading.Thread(target=lambda: (client.sendall(payload), client.shutdown(socket.SHUT_WR)))
            sender.start()
            assert _recv_all(client) == payload
            sender.join(60)


def test_a_target_that_resets_drops_the_connection_instead_of_hanging():
    listener = socket.create_server(("127.0.0.1", 0))

    def reset_after_a_little():
        conn, _ = listener.accept()
        conn.recv(1000)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # an abortive close: a reset

    thread = threading.Thread(target=reset_after_a_little, daemon=True)
    thread.start()
    try:
        with ThrottledProxy("127.0.0.1", listener.getsockname()[1], latency_ms=10, chunk_bytes=1000) as proxy:
            client = socket.create_connection(("127.0.0.1", proxy.port), timeout=60)
            with client:
                with contextlib.suppress(OSError):  # a broken pipe or a reset while sending is fine
                    for _ in range(2000):
                        client.sendall(b"q" * 1000)
                with contextlib.suppress(ConnectionResetError):
                    assert client.recv(10) == b""
            _wait_for(lambda: proxy.connections_open == 0, what="the proxy to drop the connection")
    finally:
        listener.close()
        thread.join(10)


def test_stop_closes_every_connection_and_leaves_no_thread(echo):
    before = _proxy_threads()
    proxy = ThrottledProxy("127.0.0.1", echo.port, mbit=1).start()
    assert proxy.running
    clients = [socket.create_connection(("127.0.0.1", proxy.port), timeout=30) for _ in range(5)]
    try:
        for client in clients:
            client.sendall(b"hello")
        _wait_for(lambda: proxy.connections_open == 5, what="five open connections")
        for client in clients:  # each gets its echo, then the connection idles
            got = b""
            while len(got) < 5:
                got += client.recv(5)
        port = proxy.port
        proxy.stop()
        assert not proxy.running and _proxy_threads() == before
        for client in clients:  # closed under them: end of stream or a reset, not a hang
            try:
                assert client.recv(10) == b""
            except ConnectionResetError:
                pass
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        proxy.stop()  # idempotent
    finally:
        for client in clients:
            client.close()


def test_an_unreachable_target_closes_the_client():
    dead_port = free_port()
    with ThrottledProxy("127.0.0.1", dead_port) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as client:
            try:
                assert client.recv(10) == b""
            except ConnectionResetError:
                pass
        _wait_for(lambda: proxy.connect_failures == 1, what="the failed connect to be counted")


def test_a_busy_listen_address_is_an_error():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        proxy = ThrottledProxy("127.0.0.1", 1, listen_port=taken.getsockname()[1])
        with pytest.raises(OSError, match="could not listen"):
            proxy.start()
        assert not proxy.running


def test_mesh_wires_each_proxy_to_the_other_peers_links():
    with throttled_mesh(3, 10) as peers:
        assert [peer.index for peer in peers] == [0, 1, 2]
        for peer in peers:
            assert peer.proxy.running
            assert peer.hivemind_kwargs == {
                "host_maddrs": [f"/ip4/127.0.0.1/tcp/{peer.listen_port}"],
                "announce_maddrs": [f"/ip4/127.0.0.1/tcp/{peer.proxy.port}"]}
            assert hivemind_addresses(peer.listen_port, peer.proxy) == peer.hivemind_kwargs
            assert set(peer.proxy.dialers) == {other.listen_port for other in peers if other is not peer}
        proxies = [peer.proxy for peer in peers]
    assert not any(proxy.running for proxy in proxies)


def test_a_connection_from_a_known_dialer_is_charged_to_both_links():
    sink = Server("sink")
    try:
        with throttled_mesh(2, None, listen_ports=[sink.port, free_port()]) as (a, b):
            # b dials a's proxy from b's listen port, as go-libp2p does (SO_REUSEPORT).
            client = socket.socket()
            client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            client.bind(("127.0.0.1", b.listen_port))
            client.settimeout(30)
            client.connect(("127.0.0.1", a.proxy.port))
            with client:
                client.sendall(b"z" * 10_000)
                client.shutdown(socket.SHUT_WR)
                answer = _recv_all(client)
            _wait_for(lambda: a.proxy.connections_open == 0, what="the connection to close")
            assert a.proxy.connections_from_dialers == 1
            assert b.bytes_sent == a.bytes_received == 10_000
            assert a.bytes_sent == b.bytes_received == len(answer)
    finally:
        sink.close()


# -- hivemind through the proxies -------------------------------------------------------------------------

def test_hivemind_peers_talk_only_through_their_throttled_proxies():
    """Two hivemind peers, each listening on a hidden port and announcing its proxy, average a 2 MB tensor:
    the bytes cross the proxies and take at least as long as 8 Mbit/s allows."""
    hivemind = pytest.importorskip("hivemind")
    import torch

    mbit, numel = 8, 1 << 19  # 2 MiB of float32
    payload = numel * 4
    dhts, averagers = [], []
    with throttled_mesh(2, mbit) as peers:
        try:
            first = hivemind.DHT(start=True, **peers[0].hivemind_kwargs)
            visible = [str(addr) for addr in first.get_visible_maddrs()]
            # Only the proxy is announced: the real listen port is hidden.
            assert all(f"/tcp/{peers[0].proxy.port}/" in addr for addr in visible), visible
            assert not any(f"/tcp/{peers[0].listen_port}/" in addr for addr in visible)
            second = hivemind.DHT(start=True, initial_peers=visible, **peers[1].hivemind_kwargs)
            dhts = [first, second]
            averagers = [
                hivemind.averaging.DecentralizedAverager(
                    [torch.full((numel,), float(index))], dht, prefix="throttle-test", target_group_size=2,
                    min_matchmaking_time=2.0, request_timeout=1.0, start=True)
                for index, dht in enumerate(dhts)]
            before = [(peer.bytes_sent, peer.bytes_received) for peer in peers]
            started = time.monotonic()
            for _attempt in range(3):  # matchmaking on a busy machine may miss; a retry is a new round
                futures = [averager.step(wait=False, timeout=90) for averager in averagers]
                groups = [future.result(timeout=120) for future in futures]
                if all(groups):
                    break
            elapsed = time.monotonic() - started
            assert all(groups), "the two peers never averaged"
            with averagers[0].get_tensors() as tensors:
                assert torch.allclose(tensors[0], torch.full((numel,), 0.5))
            # Butterfly all-reduce of 2 peers: each sends half its tensor and gets back the averaged half,
            # so each peer's uplink and downlink carried at least the tensor's size, all through the proxies.
            for (sent, received), peer in zip(before, peers, strict=True):
                assert peer.bytes_sent - sent >= payload
                assert peer.bytes_received - received >= payload
            through = sum(peer.proxy.bytes_total for peer in peers)
            assert through >= 2 * payload
            assert sum(peer.proxy.connections_from_dialers for peer in peers) >= 1
            assert elapsed >= 0.9 * payload / (mbit * 1e6 / 8) - 0.2  # at least ~2 s at 1 MB/s each way
        finally:
            for averager in averagers:
                averager.shutdown()
            for dht in dhts:
                dht.shutdown()
