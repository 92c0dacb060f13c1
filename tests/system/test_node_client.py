"""A client in a second language: docs/examples/node/consumer.js, a Node.js consumer whose service code
is generated from protocol/idl/consumerProxy.thrift by Apache Thrift's compiler and which talks through
the official ``thrift`` npm library, against a real proxy process.

The toolchain comes from the registries: Node.js and npm from Debian when missing, Debian's
``thrift-compiler``, the ``thrift`` package from npm (the version docs/examples/node/package.json
pins). The consumer gets every produced ride, each key in order; the message it fails once is handed out
again before any later message of its key; the committed offsets reach the produced ones.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ddmq.client.thrift_client import AsyncProxyClient
from ddmq.protocol import wire

from ..support import OrderChecker, ProxyProcess, debian_tool, produce_keyed

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "node"
GROUP = "cg_rides"
TOPIC = "rides"
RIDES = 300
KEYS = 20


#: Calls submit once in each wrong set-up and prints how each call settled (or that it never did).
WRONG_SETUP_JS = """
const thrift = require("thrift");
const ConsumerService = require("./gen/ConsumerService");
const port = Number(process.argv[2]);
const setups = [
  ["binary-framed", thrift.TFramedTransport, thrift.TBinaryProtocol],
  ["binary-buffered", thrift.TBufferedTransport, thrift.TBinaryProtocol],
  ["compact-buffered", thrift.TBufferedTransport, thrift.TCompactProtocol],
];
function one([setup, transport, protocol]) {
  return new Promise((resolve) => {
    const connection = thrift.createConnection("127.0.0.1", port, { transport, protocol });
    connection.on("error", () => {});
    const client = thrift.createClient(ConsumerService, connection);
    const timer = setTimeout(() => { resolve({ setup, outcome: "hung" }); connection.end(); }, 10000);
    client.submit(null, (err, ok) => {
      clearTimeout(timer);
      resolve(err ? { setup, outcome: "error", message: String(err.message) } : { setup, outcome: "reply", ok });
      connection.end();
    });
  });
}
(async () => {
  for (const setup of setups) console.log(JSON.stringify({ event: "setup", ...(await one(setup)) }));
})();
"""


def _toolchain(work: Path) -> tuple[str, Path]:
    """``node`` and a copy of the example with its code generated and its library installed."""
    node = debian_tool("node", "nodejs")
    npm = debian_tool("npm")
    debian_tool("thrift", "thrift-compiler")
    # package.json's script names the IDL relative to docs/examples/node: lay the copy out the same way.
    app = work / "docs" / "examples" / "node"
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("node_modules", "gen"))
    idl = work / "protocol" / "idl"
    idl.mkdir(parents=True)
    shutil.copy(ROOT / "protocol" / "idl" / "consumerProxy.thrift", idl)
    for command in ([npm, "install", "--no-audit", "--no-fund", "--loglevel=error"], [npm, "run", "generate"]):
        done = subprocess.run(command, cwd=app, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{command}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return node, app


def _events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@pytest.mark.timeout(900)
async def test_the_node_consumer_gets_every_ride_in_key_order_and_a_failure_again(
    redis_url: str, tmp_path: Path
) -> None:
    node, app = await asyncio.to_thread(_toolchain, tmp_path / "toolchain")
    group = {TOPIC: {"actions": ["Json", "Order", "PullServer"], "order_key": "$.k", "timeout_ms": 5000,
                     "max_retry": 5, "retry_intervals_ms": [50]}}
    proxy = ProxyProcess(tmp_path / "proxy", redis_url, {GROUP: group}, {TOPIC: {"queues": 4}}).start()
    try:
        produced: dict[str, int] = {}
        await asyncio.to_thread(produce_keyed, redis_url, RIDES, produced, random.Random(4), keys=KEYS, topic=TOPIC)
        command = [node, "consumer.js", "--port", str(proxy.port), "--group", GROUP, "--topic", TOPIC,
                   "--count", str(RIDES), "--fail-first", "--linger-ms", "500"]
        run = await asyncio.to_thread(subprocess.run, command, cwd=app, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
        events = _events(run.stdout)
        checker = OrderChecker()
        (failed,) = [e for e in events if e["event"] == "failed"]
        delivered = [e for e in events if e["event"] == "delivered"]
        for event in delivered:
            ride = json.loads(event["value"])
            checker.delivered(ride["k"], ride["seq"])
            if event is not delivered[0]:  # the first delivery is the one failed
                checker.acked(ride["k"], ride["seq"])
        assert checker.violations == [], checker.violations[:10]
        assert not checker.missing(produced), list(checker.missing(produced).items())[:5]
        again = [e for e in delivered if (e["qid"], e["offset"]) == (failed["qid"], failed["offset"])]
        assert len(again) == 2 and len(delivered) == RIDES + 1, (failed, len(delivered))

        async with AsyncProxyClient("127.0.0.1", proxy.port) as client:
            request = wire.ConsumeStatsRequest(group=GROUP, topic=TOPIC)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while True:
                rows = [(r.consumeOffsets, r.produceOffsets) for r in await client.get_consume_stats(request)]
                if all(committed == produced for committed, produced in rows):
                    break
                assert loop.time() < deadline, f"committed short of produced: {rows}"
                await asyncio.sleep(0.1)
        # A client set up wrong is answered, not left waiting: each of the three wrong set-ups' calls settles.
        (app / "wrong_setup.js").write_text(WRONG_SETUP_JS)
        run = await asyncio.to_thread(subprocess.run, [node, "wrong_setup.js", str(proxy.port)], cwd=app,
                                      capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
        outcomes = {e["setup"]: e for e in _events(run.stdout)}
        assert set(outcomes) == {"binary-framed", "binary-buffered", "compact-buffered"}, run.stdout
        for outcome in outcomes.values():
            assert outcome["outcome"] == "error", outcome
            assert "compact protocol over framed transport" in outcome["message"], outcome
    finally:
        assert proxy.stop() == 0, proxy.log()[-5000:]
