"""The fault-injecting relay (:mod:`tests.harness.relay`) itself, against the real redis-server: each mode
does to a plain redis-py client what it claims to, and the relay goes away with the process that started it.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.harness.relay import Relay, RelayError

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 1.0  # the clients' socket timeout: how long a blackholed command takes to fail
DEADLINE_S = 5.0  # failure guard for every wait on something observable


@pytest.fixture
def relay(redis_url: str) -> Iterator[Relay]:
    port = urlsplit(redis_url).port
    assert port is not None
    with Relay(port) as running:
        yield running


@pytest.fixture
def connect(relay: Relay, redis_url: str) -> Iterator[Callable[[], redis.Redis]]:
    """A new client through the relay, with no retries: each failure reaches the test."""
    clients: list[redis.Redis] = []

    def new() -> redis.Redis:
        client = redis.Redis.from_url(
            relay.url(redis_url), socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),
        )
        clients.append(client)
        return client

    yield new
    for client in clients:
        client.close()


def raw(relay: Relay) -> socket.socket:
    """A plain socket through the relay, to see exactly which bytes come back and when."""
    sock = socket.create_connection(("127.0.0.1", relay.port), timeout=DEADLINE_S)
    sock.sendall(b"PING\r\n")
    assert sock.recv(100) == b"+PONG\r\n"
    return sock


def nothing_within(sock: socket.socket, seconds: float) -> bool:
    """No byte (and no end of stream) arrives within ``seconds``: the one wait here that is a guess."""
    sock.settimeout(seconds)
    try:
        sock.recv(100)
        return False
    except TimeoutError:
        return True
    finally:
        sock.settimeout(DEADLINE_S)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S}s"
        time.sleep(0.02)


def test_pass_forwards_both_ways(relay: Relay, connect: Callable[[], redis.Redis]) -> None:
    client = connect()
    assert client.set("k", "v")
    assert client.get("k") == b"v"
    stats = relay.stats()
    assert stats["accepted"] == stats["current"] == 1
    assert stats["bytes_up"] > 0 and stats["bytes_down"] > 0
    assert stats["mode"] == "pass"


def test_blackhole_holds_bytes_until_pass(relay: Relay, connect: Callable[[], redis.Redis]) -> None:
    client = connect()
    client.ping()
    before = raw(relay)
    relay.mode("blackhole")
    with pytest.raises(redis.TimeoutError):
        client.get("k")
    before.sendall(b"PING\r\n")
    during = socket.create_connection(("127.0.0.1", relay.port), timeout=DEADLINE_S)  # accepted, held
    during.sendall(b"PING\r\n")
    assert nothing_within(during, 0.3)
    assert nothing_within(before, 0.1)
    relay.mode("pass")
    # What was held flows now, on the connections from before and during the blackhole alike.
    assert before.recv(100) == b"+PONG\r\n"
    assert during.recv(100) == b"+PONG\r\n"
    assert connect().get("k") is None
    before.close()
    during.close()


def test_reset_breaks_existing_and_new_connections(relay: Relay, connect: Callable[[], redis.Redis]) -> None:
    client = connect()
    client.ping()
    relay.mode("reset")
    with pytest.raises(redis.ConnectionError):
        client.get("k")
    with pytest.raises(redis.ConnectionError):
        connect().ping()
    assert relay.stats()["resets"] >= 2
    relay.mode("pass")
    assert client.get("k") is None  # redis-py reconnects on the next command


def test_reset_sends_rst(relay: Relay) -> None:
    sock = raw(relay)
    relay.mode("reset")
    with pytest.raises(ConnectionResetError):  # a FIN would read as b"" instead
        sock.recv(100)
    sock.close()


def test_silent_connections_stay_silent_while_new_ones_work(relay: Relay, connect: Callable[[], redis.Redis]) -> None:
    client = connect()
    client.ping()
    old = raw(relay)
    relay.mode("silent")
    with pytest.raises(redis.TimeoutError):
        client.get("k")
    assert connect().set("k", "v")
    relay.mode("pass")
    old.sendall(b"PING\r\n")
    assert nothing_within(old, 0.3)
    assert relay.stats()["current"] >= 3  # never closed by the relay
    old.close()


def test_oneway_up_delivers_requests_but_no_replies(
    relay: Relay, connect: Callable[[], redis.Redis], redis_url: str
) -> None:
    client = connect()
    client.ping()
    relay.mode("oneway-up")
    with pytest.raises(redis.TimeoutError):
        client.set("k", "v")
    with redis.Redis.from_url(redis_url) as direct:
        wait_for(lambda: direct.get("k") == b"v", "SET reaching Redis")
    with pytest.raises(redis.TimeoutError):
        client.get("k")


def test_oneway_down_holds_requests(relay: Relay, redis_url: str) -> None:
    sock = raw(relay)
    relay.mode("oneway-down")
    sock.sendall(b"SET k v\r\n")
    assert nothing_within(sock, 0.3)
    with redis.Redis.from_url(redis_url) as direct:
        assert direct.get("k") is None
    relay.mode("pass")
    assert sock.recv(100) == b"+OK\r\n"
    sock.close()


def test_flap_resets_periodically(relay: Relay, connect: Callable[[], redis.Redis]) -> None:
    sock = raw(relay)
    relay.mode("flap", 0.5)
    with pytest.raises(ConnectionResetError):
        sock.recv(100)  # blocks until the first flap
    sock.close()
    client = connect()
    deadline = time.monotonic() + 3
    while relay.stats()["resets"] < 2:
        assert time.monotonic() < deadline, relay.stats()
        # Keeps a connection up for the next flap to reset: redis-py finds a reset connection before it
        # sends, and reconnects (a reset in the middle of a command fails it).
        with contextlib.suppress(redis.ConnectionError):
            client.ping()
        time.sleep(0.01)
    relay.mode("pass")
    resets = relay.stats()["resets"]
    client.ping()
    time.sleep(0.6)  # longer than the period: a flap would have come
    client.ping()
    assert relay.stats()["resets"] == resets


@pytest.mark.parametrize(
    "line", ["mode nosuch", "mode flap", "mode flap x", "mode flap -1", "mode pass 3", "bogus", ""]
)
def test_bad_control_input_is_refused(relay: Relay, connect: Callable[[], redis.Redis], line: str) -> None:
    with socket.create_connection(("127.0.0.1", relay.control_port), timeout=DEADLINE_S) as sock:
        sock.sendall(line.encode() + b"\nstats\n")
        lines = sock.makefile("rb")
        answers = lines.readline(), lines.readline()
        lines.close()
    assert answers[0].startswith(b"error "), answers
    assert answers[1].startswith(b"{"), answers  # the connection still serves
    with pytest.raises(RelayError, match="error unknown mode"):
        relay.mode("nosuch")
    assert connect().ping()


def test_relay_exits_with_its_parent() -> None:
    code = "import os; from tests.harness.relay import Relay; print(Relay(1).start().port, flush=True); os._exit(0)"
    parent = subprocess.run([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, timeout=15, check=True)
    port = int(parent.stdout)

    def refused() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except ConnectionRefusedError:
            return True
        return False

    wait_for(refused, "relay exit after its parent's")
