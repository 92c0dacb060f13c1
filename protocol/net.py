"""Ports for the processes the project starts on this host (embedded Redis, the demo's proxy, the
tests' and benchmarks' servers)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS has just handed out on ``host`` and taken back: free now, though another
    process may take it before the caller binds it (callers that start servers retry or wait)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
