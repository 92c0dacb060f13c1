"""The HTTP adapter: pull API, Prometheus metrics, health checks and admin endpoints (aiohttp).

See :class:`~ddmq.proxy.servers.http.server.HttpServer`; the routes and their JSON are documented in
``openapi.yaml`` next to this file, served at ``/openapi.json``.
"""

from ddmq.proxy.servers.http.server import HttpServer, build_app, load_openapi

__all__ = ["HttpServer", "build_app", "load_openapi"]
