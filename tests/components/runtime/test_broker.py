"""The embedded broker: messages are written atomically, so a consumer in another process never takes a
partial one (kombu's own filesystem transport writes in place and can hand a consumer an empty file)."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest
from kombu import Connection

from components.runtime.shared.broker import EMBEDDED_SCHEME, celery_broker_options

MESSAGES = 400
PAYLOAD = {"body": "x" * 200_000}  # large enough that a write is not one instant


def _produce(url: str, options: dict, queue: str) -> None:
    with Connection(url, transport_options=options) as connection:
        channel = connection.channel()
        for index in range(MESSAGES):
            channel._put(queue, {**PAYLOAD, "index": index})


def _consume(url: str, options: dict, queue: str) -> tuple[int, list[str]]:
    """Take messages as fast as they appear; return how many and the errors met."""
    from queue import Empty

    received, errors = 0, []
    with Connection(url, transport_options=options) as connection:
        channel = connection.channel()
        deadline = time.monotonic() + 120  # liveness only: the producer is a spawned process
        while received + len(errors) < MESSAGES and time.monotonic() < deadline:
            try:
                message = channel._get(queue)
            except Empty:
                continue
            except ValueError as error:  # json.JSONDecodeError: a partial message
                errors.append(str(error))
                continue
            assert message["body"] == PAYLOAD["body"]
            received += 1
    return received, errors


def _run(url: str, options: dict) -> tuple[int, list[str]]:
    context = multiprocessing.get_context("spawn")
    producer = context.Process(target=_produce, args=(url, options, "work"))
    producer.start()
    try:
        return _consume(url, options, "work")
    finally:
        producer.join(60)
        if producer.is_alive():
            producer.kill()
            producer.join()


def test_a_consumer_only_ever_sees_whole_messages(tmp_path):
    settings = celery_broker_options(f"filesystem://{tmp_path}")
    assert settings["broker_url"] == f"{EMBEDDED_SCHEME}://"
    received, errors = _run(settings["broker_url"], settings["broker_transport_options"])
    assert errors == [] and received == MESSAGES
    leftovers = [name for name in os.listdir(tmp_path / "queue")]
    assert leftovers == []


@pytest.mark.parametrize("transport", ["filesystem://", f"{EMBEDDED_SCHEME}://"])
def test_a_message_put_is_a_message_got(tmp_path, transport):
    options = celery_broker_options(f"filesystem://{tmp_path}")["broker_transport_options"]
    with Connection(transport, transport_options=options) as connection:
        # kombu caches declared exchanges per transport class in the process: one queue name per test case
        queue = connection.SimpleQueue(f"roundtrip-{transport.split(':')[0]}")
        queue.put({"attempt": "a", "token": "t"})
        assert queue.get(timeout=10).payload == {"attempt": "a", "token": "t"}
        queue.close()


# -- Redis: a broker restart must not crash the worker ---------------------------------------------------------

@pytest.fixture
def redis_server(tmp_path):
    """A redis-server of this test's own (no data kept): its URL."""
    import shutil
    import subprocess

    import redis
    from support import free_port, kill_group, wait_for

    if shutil.which("redis-server") is None:
        if os.environ.get("STRATA_REQUIRE_SERVICES") == "1":
            pytest.fail("STRATA_REQUIRE_SERVICES=1: redis-server is not installed")
        pytest.skip("redis-server is not installed")
    port = free_port()
    process = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                                "--appendonly", "no", "--dir", str(tmp_path)],
                               stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        client = redis.Redis(port=port, socket_timeout=5)
        wait_for(lambda: _answers(client), 30, message="redis-server to answer")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        kill_group(process, grace=5)


def _answers(client) -> bool:
    import redis

    try:
        return client.ping()
    except redis.RedisError:
        return False


@pytest.mark.parametrize("scheme", ["redis", "rediss"])
def test_redis_urls_keep_their_scheme_and_get_the_restart_safe_transport(scheme):
    from components.runtime.shared.broker import RedisTransport

    settings = celery_broker_options(f"{scheme}://127.0.0.1:1/0")
    assert settings["broker_url"] == f"{scheme}://127.0.0.1:1/0"
    connection = Connection(settings["broker_url"], transport_options=settings["broker_transport_options"])
    assert isinstance(connection.transport, RedisTransport)  # creating the transport does not connect
    assert connection.transport_cls == scheme  # kombu still sees `rediss` (TLS)


def test_a_redis_channel_still_reaches_the_broker_after_its_connection_released_it(redis_server):
    """Celery's consumer collects a connection the broker dropped (kombu clears the transport's ``client`` and
    the closed channels' ``connection``) and later closes the channel again or acknowledges a message on it:
    both open a new pool, which kombu's channel cannot do any more (AttributeError: ... 'hostname')."""
    settings = celery_broker_options(redis_server)
    connection = Connection(settings["broker_url"], transport_options=settings["broker_transport_options"])
    channel = connection.channel()
    assert channel.client.ping()
    transport = connection.transport
    connection.collect()
    assert transport.client is None and channel.connection is None  # released, as after a broker restart
    with channel.conn_or_acquire() as client:
        assert client.ping()
    assert transport.client is None  # left released
