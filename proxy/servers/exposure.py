"""Exposure: which of a config's ports answer beyond this machine with no defence, said at start-up.

A bind to loopback is reachable from this machine only; any other address (``0.0.0.0``, ``::``, an
interface's address) is reachable from the network. The proxy still starts (a container or a private
network may be the defence), but logs one WARNING per exposed port naming what is open and which
setting closes it.
"""

from __future__ import annotations

import ipaddress

from ddmq.config.schema import ProxyConfig


def is_loopback_bind(host: str) -> bool:
    """``localhost`` or a loopback address; ``0.0.0.0``, ``::`` and names are not."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warnings(config: ProxyConfig) -> list[str]:
    """One sentence per port bound beyond loopback without a defence configured."""
    warnings = []
    thrift = config.thrift
    if not is_loopback_bind(thrift.host) and not thrift.allowed_clients:
        warnings.append(
            f"thrift binds {thrift.host}:{thrift.port}, beyond loopback: Thrift carries no credentials, so any "
            "host that reaches the port can pull and ack every group; allow only the consumers' networks "
            "(thrift.allowed_clients, a firewall or a network policy), or bind 127.0.0.1"
        )
    http = config.http
    # The console and /admin/... stay closed to other hosts without admin_token: no exposure there.
    if http.enabled and not is_loopback_bind(http.host) and http.data_token is None and not http.allowed_clients:
        warnings.append(
            f"http binds {http.host}:{http.port}, beyond loopback, without http.data_token: any host that "
            "reaches the port can pull and ack every group over /v1/...; set http.data_token or http.allowed_clients"
        )
    return warnings
