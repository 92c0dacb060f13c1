"""A fault-injecting TCP relay between a client (the proxy) and Redis, for network-failure tests.

It runs as its own process (``python -m tests.harness.relay --upstream PORT``), so a test can break the
network under a proxy that runs in-process or in another process alike, and is driven from the test by
:class:`Relay` over a line protocol on its control port (``mode NAME [SECONDS]``, ``stats``). It only
listens on and connects to 127.0.0.1. Each mode applies to every connection at once and models:

- ``pass``: a healthy network; bytes flow both ways (the default).
- ``blackhole``: a network that drops every packet. TCP retransmits rather than loses, so the relay stops
  reading both sockets and holds the bytes: on ``pass`` they flow again and the streams stay intact. New
  connections are accepted but not connected upstream until ``pass``.
- ``reset``: a peer or middlebox that aborts connections: each is closed with a TCP RST (SO_LINGER 0)
  towards the client, its upstream closed; new connections are reset as soon as accepted.
- ``oneway-up`` / ``oneway-down``: an asymmetric failure; only client→upstream (up) or upstream→client
  (down) bytes flow, the other direction is held as in ``blackhole``.
- ``silent``: half-open TCP after a NAT lost its state: the current connections never carry a byte again
  (even after ``pass``) and are never closed; new connections work normally.
- ``flap SECONDS``: an unstable link: ``pass``, but every SECONDS each connection is reset.
- ``lose-reply``: a reply lost on its way back, once: ``pass`` until the upstream next sends bytes on
  any connection; those bytes are dropped and that connection reset (so the upstream wrote its reply
  in full and the client never sees it), and the mode is ``pass`` again. ``stats`` counts
  ``lost_replies``.

A connection made ``silent`` stays out of every later mode, ``reset`` and ``flap`` included.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

__all__ = ["MODES", "Relay", "RelayError"]

HOST = "127.0.0.1"
#: What each mode lets through on a connection that is not silent: (client→upstream, upstream→client).
_FLOWS: dict[str, tuple[bool, bool]] = {
    "pass": (True, True), "flap": (True, True), "silent": (True, True), "oneway-up": (True, False),
    "oneway-down": (False, True), "blackhole": (False, False), "reset": (False, False),
    "lose-reply": (True, True),
}
MODES = frozenset(_FLOWS)
_REPO = Path(__file__).resolve().parents[2]


class RelayError(RuntimeError):
    """The relay process did not start, or its control port refused or failed a command."""


class _Side(asyncio.Protocol):
    """One socket of a link; ``upstream`` says which."""

    def __init__(self, link: _Link, upstream: bool) -> None:
        self.link, self.upstream = link, upstream

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.link.attach(self.upstream, transport)

    def data_received(self, data: bytes) -> None:
        self.link.forward(self.upstream, data)

    def eof_received(self) -> bool:
        self.link.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.link.lost(self.upstream)

    # Backpressure: a side that cannot write fast enough stops the other side's reading.
    def pause_writing(self) -> None:
        self.link.set_full(self.upstream, True)

    def resume_writing(self) -> None:
        self.link.set_full(self.upstream, False)


class _Link:
    """A client connection and, once connected, its upstream connection."""

    def __init__(self, relay: _RelayServer) -> None:
        self.relay = relay
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.full = {False: False, True: False}  # keyed by `upstream`: that side's write buffer is full
        self.silent = self.dead = False
        self.connect: asyncio.Task[Any] | None = None
        self.gone = asyncio.get_running_loop().create_future()  # set once the client socket is closed

    def attach(self, upstream: bool, transport: asyncio.Transport) -> None:
        if self.dead:  # an upstream connect that completed after the link was closed
            transport.abort()
            return
        if upstream:
            self.upstream = transport
        else:
            self.client = transport
            self.relay.links.add(self)
            self.relay.stats["accepted"] += 1
            if self.relay.mode == "reset":
                self.reset()
                return
        self.update()

    def update(self) -> None:
        """Make the sockets' reading match the mode: what is not read is held, in the kernel's buffers."""
        if self.dead or self.client is None:
            return
        up, down = (False, False) if self.silent else _FLOWS[self.relay.mode]
        if self.upstream is None:
            self.client.pause_reading()
            if self.connect is None and not self.silent and self.relay.mode not in ("blackhole", "reset"):
                self.connect = asyncio.ensure_future(self._connect())
            return
        for transport, flows, peer_full in ((self.client, up, True), (self.upstream, down, False)):
            if flows and not self.full[peer_full]:
                transport.resume_reading()
            else:
                transport.pause_reading()

    async def _connect(self) -> None:
        try:
            await asyncio.get_running_loop().create_connection(lambda: _Side(self, True), HOST, self.relay.port)
        except OSError:
            self.close()

    def set_full(self, upstream: bool, full: bool) -> None:
        self.full[upstream] = full
        self.update()

    def forward(self, from_upstream: bool, data: bytes) -> None:
        if from_upstream and self.relay.mode == "lose-reply" and not self.dead:
            self.relay.mode = "pass"
            self.relay.stats["lost_replies"] += 1
            self.reset()
            return
        target = self.client if from_upstream else self.upstream
        if target is not None and not self.dead:
            target.write(data)
            self.relay.stats["bytes_down" if from_upstream else "bytes_up"] += len(data)

    def close(self) -> None:
        self.dead = True
        for transport in (self.client, self.upstream):
            if transport is not None:
                transport.close()

    def reset(self) -> None:
        self.dead = True
        if self.client is not None:
            sock = self.client.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.client.abort()
            self.relay.stats["resets"] += 1
        if self.upstream is not None:
            self.upstream.abort()

    def lost(self, upstream: bool) -> None:
        self.close()
        if not upstream:
            self.relay.links.discard(self)
            if not self.gone.done():
                self.gone.set_result(None)


class _RelayServer:
    def __init__(self, upstream_port: int) -> None:
        self.port = upstream_port
        self.mode = "pass"
        self.links: set[_Link] = set()
        self.stats = {"accepted": 0, "bytes_up": 0, "bytes_down": 0, "resets": 0, "lost_replies": 0}
        self._flap: asyncio.Task[None] | None = None

    async def set_mode(self, name: str, arg: float | None) -> None:
        if self._flap is not None:
            self._flap.cancel()
            self._flap = None
        if name == "silent":
            for link in self.links:
                link.silent = True
        self.mode = name
        for link in list(self.links):
            link.update()
        if name == "reset":
            await self.reset_all()
        elif name == "flap":
            assert arg is not None
            self._flap = asyncio.create_task(self._flapping(arg))

    async def reset_all(self) -> None:
        links = [link for link in self.links if not link.silent]
        for link in links:
            link.reset()
        # The socket is closed (the RST sent) a loop iteration after abort(): answer only after that.
        if links:
            await asyncio.wait([link.gone for link in links], timeout=2)

    async def _flapping(self, period_s: float) -> None:
        while True:
            await asyncio.sleep(period_s)
            await self.reset_all()

    async def command(self, words: list[str]) -> str:
        if words == ["stats"]:
            return json.dumps({**self.stats, "current": len(self.links), "mode": self.mode})
        if len(words) < 2 or words[0] != "mode":
            return "error expected 'mode NAME [SECONDS]' or 'stats'"
        name, args = words[1], words[2:]
        if name not in MODES:
            return f"error unknown mode {name!r}"
        period_s: float | None = None
        if name == "flap":
            try:
                (period_s,) = map(float, args)
            except ValueError:
                period_s = 0.0
            if not period_s > 0:  # NaN included
                return "error mode flap needs one positive number of seconds"
        elif args:
            return f"error mode {name} takes no argument"
        await self.set_mode(name, period_s)
        return "ok"

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError), contextlib.closing(writer):
            while line := await reader.readline():
                writer.write((await self.command(line.decode(errors="replace").split())).encode() + b"\n")
                await writer.drain()


async def _serve(upstream: int, listen: int, control: int, parent: int) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    relay = _RelayServer(upstream)
    listener = await loop.create_server(lambda: _Side(_Link(relay), False), HOST, listen)
    controller = await asyncio.start_server(relay.control, HOST, control)
    ports = [server.sockets[0].getsockname()[1] for server in (listener, controller)]
    print(f"relay listen={ports[0]} control={ports[1]}", flush=True)
    # A relay whose test process died (killed, crashed) must not outlive it, holding ports and sockets.
    while not stop.is_set() and os.getppid() == parent:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1)
    listener.close()  # the relayed connections close as the process exits
    controller.close()


def main(argv: list[str] | None = None) -> None:
    parent = os.getppid()
    parser = argparse.ArgumentParser(prog="python -m tests.harness.relay", description="A fault-injecting TCP relay.")
    parser.add_argument("--upstream", type=int, required=True, help="the Redis port on 127.0.0.1")
    parser.add_argument("--listen", type=int, default=0, help="where clients connect (0: a free port)")
    parser.add_argument("--control", type=int, default=0, help="the control port (0: a free port)")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.upstream, args.listen, args.control, parent))


class Relay:
    """The relay process, seen from a test: ``with Relay(redis_port) as relay: relay.mode("blackhole")``."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._process: subprocess.Popen[bytes] | None = None
        self._ports: tuple[int, int] | None = None

    def start(self) -> Relay:
        command = [sys.executable, "-m", "tests.harness.relay", "--upstream", str(self.upstream_port)]
        # stderr is the test's own: pytest shows what the relay logged (an asyncio traceback) with a failure.
        process = subprocess.Popen(command, cwd=_REPO, stdout=subprocess.PIPE)
        self._process = process
        assert process.stdout is not None
        deadline, line = time.monotonic() + 10, b""
        try:
            while b"\n" not in line:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([process.stdout], [], [], left)[0]:
                    raise RelayError("the relay printed no ports line within 10 s")
                chunk = os.read(process.stdout.fileno(), 256)
                if not chunk:
                    raise RelayError(f"the relay exited (code {process.wait(5)}) before printing its ports")
                line += chunk
            found = re.fullmatch(rb"relay listen=(\d+) control=(\d+)\n", line)
            if found is None:
                raise RelayError(f"unexpected first line from the relay: {line!r}")
            self._ports = int(found[1]), int(found[2])
        except RelayError as error:
            self.stop()
            raise RelayError(f"{error} (its stderr is the test's)") from None
        return self

    @property
    def port(self) -> int:
        """Where clients connect (127.0.0.1)."""
        return self._started()[0]

    @property
    def control_port(self) -> int:
        return self._started()[1]

    def url(self, redis_url: str) -> str:
        """``redis_url`` pointed at the relay: its host and port replaced by 127.0.0.1 and :attr:`port`."""
        parts = urlsplit(redis_url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@{HOST}:{self.port}" if userinfo else f"{HOST}:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def mode(self, name: str, arg: float | None = None) -> None:
        """Switch every connection to mode ``name``; returns once it is in effect."""
        line = f"mode {name}" if arg is None else f"mode {name} {arg}"
        if (answer := self._request(line)) != "ok":
            raise RelayError(f"{line!r}: {answer}")

    def stats(self) -> dict[str, Any]:
        """Counters: accepted, current (connections), bytes_up, bytes_down, resets, lost_replies; and the mode."""
        return cast(dict[str, Any], json.loads(self._request("stats")))

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> Relay:
        return self if self._process is not None else self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def _started(self) -> tuple[int, int]:
        if self._ports is None:
            raise RelayError("the relay is not started")
        return self._ports

    def _request(self, line: str) -> str:
        with socket.create_connection((HOST, self.control_port), timeout=5) as sock, sock.makefile("rb") as lines:
            sock.sendall(line.encode() + b"\n")
            answer = lines.readline()
        if not answer.endswith(b"\n"):
            raise RelayError(f"the relay closed the control connection after {line!r}")
        return answer.decode().strip()


if __name__ == "__main__":
    main()
