"""``ddmq demo``: an embedded Redis, a real ``ddmq-proxy`` process, a ride-event producer and a pull
consumer pool, with a live progress line and a summary that checks per-rider order and loss.

Each rider produces ``call → pickup → pay``; riders are interleaved over 8 queues and ordered by
``$.rider_id``. A few riders' handlers are slow, some fail their first pick-up once (retried), and a
few "poison" riders' payments always fail (dead-lettered after the retries, key order kept).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ddmq.client.cli.proxy_process import ProxyChild, ProxyProcessError
from ddmq.client.consumer import ConsumedMessage, PullConsumer
from ddmq.protocol import clitools
from ddmq.protocol.net import free_port
from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import sync_redis

EVENTS = ("call", "pickup", "pay")
TOPIC = "rides"
GROUP = "cg_rides"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--riders", type=int, default=3000, help="riders, 3 events each (default 3000)")
    parser.add_argument("--workers", type=int, default=8, help="pull consumer threads (default 8)")
    parser.add_argument("--slow-riders", type=int, default=5, help="riders whose handler takes 100 ms")
    parser.add_argument("--flaky-riders", type=int, default=50, help="riders whose pick-up fails once")
    parser.add_argument("--poison-riders", type=int, default=2, help="riders whose payment always fails")
    parser.add_argument("--data-dir", help="keep Redis data and the proxy log here (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=120.0, help="give up after this many seconds")
    parser.add_argument(
        "--linger", type=float, default=0.0, metavar="SECONDS",
        help="keep the proxy and its console up this long after the summary (default 0; Ctrl-C ends it early)",
    )


@dataclass
class Checker:
    """Checks deliveries as they happen: per rider, a delivery is its next event or a repeat of it."""

    riders: int
    flaky: set[str]
    slow: set[str]
    poison: set[str]
    lock: threading.Lock = field(default_factory=threading.Lock)
    next_seq: dict[str, int] = field(default_factory=dict)
    failed_once: set[str] = field(default_factory=set)
    deliveries: int = 0
    acked: int = 0
    redeliveries: int = 0
    violations: int = 0
    fails: int = 0

    def process(self, message: ConsumedMessage) -> bool:
        event = json.loads(message.value)
        rider, seq = event["rider_id"], event["seq"]
        if rider in self.slow:
            time.sleep(0.1)
        with self.lock:
            self.deliveries += 1
            expected = self.next_seq.get(rider, 0)
            if seq < expected:
                self.redeliveries += 1  # processed before; its ack was lost or late
                return True
            if seq > expected:
                self.violations += 1
                print(f"\nORDER VIOLATION: {rider} got {EVENTS[seq]} before {EVENTS[expected]}", file=sys.stderr)
            if rider in self.poison and seq == 2:
                self.fails += 1
                return False
            if rider in self.flaky and seq == 1 and rider not in self.failed_once:
                self.failed_once.add(rider)
                self.fails += 1
                return False
            self.next_seq[rider] = seq + 1
            self.acked += 1
            return True

    def done(self) -> bool:
        with self.lock:
            return self.acked >= self.riders * 3 - len(self.poison)


def main(args: argparse.Namespace) -> int:
    rng = random.Random(2026)
    riders = [f"rider-{i}" for i in range(args.riders)]
    picks = rng.sample(riders, min(len(riders), args.slow_riders + args.flaky_riders + args.poison_riders))
    slow = set(picks[: args.slow_riders])
    flaky = set(picks[args.slow_riders : args.slow_riders + args.flaky_riders])
    poison = set(picks[args.slow_riders + args.flaky_riders :])
    checker = Checker(len(riders), flaky, slow, poison)

    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="ddmq-demo-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "redis.url").unlink(missing_ok=True)
    port = free_port()
    http_port = free_port()
    config_path = data_dir / "demo.yaml"
    config_path.write_text(
        f"""instance_id: demo-proxy
redis: embedded
embedded_redis: {{data_dir: "{data_dir / 'redis'}"}}
thrift: {{host: 127.0.0.1, port: {port}}}
http: {{enabled: true, host: 127.0.0.1, port: {http_port}}}
topics:
  {TOPIC}: {{queues: 8}}
groups:
  {GROUP}:
    {TOPIC}:
      actions: [Json, Order, PullServer]
      order_key: "$.rider_id"
      timeout_ms: 5000
      max_retry: 2
      retry_intervals_ms: [200, 500]
"""
    )
    log_path = data_dir / "proxy.log"
    print(f"ddmq demo: {len(riders)} riders x 3 events, 8 queues, {args.workers} consumer threads")
    print(f"  proxy: ddmq-proxy --config {config_path}  (log: {log_path})")
    print(f"  console: http://127.0.0.1:{http_port}/  (in a browser; --linger SECONDS keeps it up after the run)")
    log_path.unlink(missing_ok=True)
    proxy = ProxyChild(config_path, port, log_path)
    try:
        url_file = data_dir / "redis" / "redis.url"
        try:
            proxy.start(timeout_s=30)
        except ProxyProcessError as exc:
            raise SystemExit(f"ddmq-proxy did not start: {exc}") from None
        redis_url = url_file.read_text().strip()
        status = _run(args, riders, checker, redis_url, port, rng)
        _linger(args.linger, http_port, proxy)
        return status
    finally:
        proxy.stop(timeout_s=15)


def _linger(seconds: float, http_port: int, proxy: ProxyChild) -> None:
    """Keep the proxy (and its console) up for ``seconds`` after the run, so it can be looked at."""
    if seconds <= 0:
        return
    print(f"console: http://127.0.0.1:{http_port}/ stays up for {seconds:g} s (Ctrl-C to end now)", flush=True)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and proxy.running():
            time.sleep(0.2)
    except KeyboardInterrupt:
        print()


def produce_rides(redis_url: str, riders: list[str], rng: random.Random, topic: str = TOPIC, queues: int = 8) -> int:
    """Each rider's ``call → pickup → pay`` (JSON, keyed by rider), riders interleaved; returns the count."""
    remaining = {rider: 0 for rider in riders}
    sent = 0
    with Producer(redis_url) as producer:
        producer.ensure_topic(topic, queues)
        while remaining:
            batch = []
            for rider in rng.sample(list(remaining), min(200, len(remaining))):
                seq = remaining[rider]
                body = {"rider_id": rider, "seq": seq, "event": EVENTS[seq], "ts": time.time()}
                if seq == 2:
                    body["fare"] = round(rng.uniform(5, 60), 2)
                batch.append({"key": rider, "value": json.dumps(body)})
                if seq == 2:
                    del remaining[rider]
                else:
                    remaining[rider] = seq + 1
            producer.send_batch(topic, batch)
            sent += len(batch)
    return sent


def _run(
    args: argparse.Namespace, riders: list[str], checker: Checker, redis_url: str, port: int, rng: random.Random
) -> int:
    started = time.monotonic()
    produced: list[int] = []
    producer = threading.Thread(target=lambda: produced.append(produce_rides(redis_url, riders, rng)), daemon=True)
    producer.start()
    consumer = PullConsumer(f"127.0.0.1:{port}", GROUP, checker.process, threads=args.workers, batch_size=32)
    consumer.start()
    interactive = sys.stdout.isatty()
    last_print = 0.0
    client = sync_redis(redis_url)
    try:
        while not checker.done() and time.monotonic() - started < args.timeout:
            time.sleep(0.1)
            now = time.monotonic()
            if now - last_print >= (0.5 if interactive else 2.0):
                last_print = now
                line = (
                    f"  delivered {checker.deliveries:>7}  acked {checker.acked:>7}/{len(riders) * 3}"
                    f"  {checker.acked / (now - started):>8.0f} msg/s  fails {checker.fails:>4}"
                    f"  order violations {checker.violations}"
                )
                print("\r" + line if interactive else line, end="" if interactive else "\n", flush=True)
        # Every other message is acked; the poison payments may still be between retries, and only
        # a consumer pulling them again lets them reach the dead-letter stream.
        while (dead := client.xlen(keys.dead_letters(GROUP, TOPIC))) < len(checker.poison):
            if time.monotonic() - started > args.timeout:
                break
            time.sleep(0.05)
    finally:
        consumer.close()
        client.close()
    elapsed = time.monotonic() - started
    producer.join(timeout=30)
    expected = len(riders) * 3
    lost = expected - checker.acked - dead
    if interactive:
        print()
    print(
        "summary: "
        f"messages={expected} produced={produced[0] if produced else 0} acked={checker.acked} "
        f"msg/s={checker.acked / elapsed:.0f} riders={len(riders)} order_violations={checker.violations} "
        f"lost={lost} retries={checker.fails + checker.redeliveries} dead_letters={dead} "
        f"seconds={elapsed:.1f}"
    )
    ok = checker.violations == 0 and lost == 0
    print("demo: OK" if ok else "demo: FAILED", file=sys.stderr if not ok else sys.stdout)
    return 0 if ok else 1


def add_producer_arguments(parser: argparse.ArgumentParser) -> None:
    clitools.env_option(
        parser, "--redis", clitools.ENV_REDIS,
        "Redis URL, e.g. redis://127.0.0.1:6379/0 (?cluster=true for a Redis Cluster)",
    )
    parser.add_argument("--riders", type=int, default=3000, help="riders per round, 3 events each (default 3000)")
    parser.add_argument("--topic", default=TOPIC, help=f"topic (default {TOPIC})")
    parser.add_argument("--queues", type=int, default=8, help="queues of the topic if it is new (default 8)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of riders; 0 = forever (default 1)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between rounds (default 5)")
    parser.add_argument("--seed", type=int, default=2026, help="random seed")


def producer_main(args: argparse.Namespace) -> int:
    """``ddmq demo-producer``: the demo's ride events into a Redis of your own, round after round."""
    rng = random.Random(args.seed)
    round_no = 0
    while args.rounds == 0 or round_no < args.rounds:
        riders = [f"rider-{round_no}-{i}" for i in range(args.riders)]
        sent = produce_rides(args.redis, riders, rng, args.topic, args.queues)
        print(f"demo-producer: round {round_no}: {sent} events of {len(riders)} riders to {args.topic}", flush=True)
        round_no += 1
        if args.rounds == 0 or round_no < args.rounds:
            time.sleep(args.interval)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="ddmq demo")
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
