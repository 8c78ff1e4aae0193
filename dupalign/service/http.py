"""The worker's HTTP endpoint (aiohttp, inside the worker's event loop): ``/metrics``
(Prometheus text format), ``/healthz`` (the process works: 200 or 503) and ``/readyz``
(it is consuming: 200 or 503). Each check returns (ok, reason).

aiohttp is imported when the server starts: its import makes two TLS contexts (~0.3 s of CPU,
half a role process's start-up), which a process without ``[metrics]`` never needs."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from dupalign.service.exits import CliError, Exit

if TYPE_CHECKING:
    from aiohttp import web

Check = Callable[[], tuple[bool, str]]


def port_error(host: str, port: int, exc: OSError) -> CliError:
    """The one-line usage error (exit 2) of a metrics port that cannot be listened on."""
    return CliError(f"cannot listen on {host}:{port} for /metrics, /healthz, /readyz "
                    f"({exc.strerror or exc}): is another process using port {port}? choose "
                    "another with --metrics-port or metrics.port (0 = any free port)",
                    Exit.USAGE)


def check_port(host: str, port: int) -> None:
    """Raise port_error unless host:port can be listened on now: said at start-up, before
    the store is opened or Kafka is asked anything. (Bound as asyncio binds: with
    SO_REUSEADDR, so a port in TIME_WAIT passes here as it passes there.)"""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in infos:
            with socket.socket(family, kind, proto) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(address)
    except OSError as exc:
        raise port_error(host, port, exc) from None


class HttpServer:
    def __init__(self, registry: CollectorRegistry, healthy: Check, ready: Check) -> None:
        self.registry, self.healthy, self.ready = registry, healthy, ready
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    def _app(self) -> web.Application:
        from aiohttp import web

        async def metrics(request: web.Request) -> web.Response:
            resp = web.Response(body=generate_latest(self.registry))
            resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
            return resp

        def answer(check: Check) -> Callable[[web.Request], Awaitable[web.Response]]:
            async def handler(request: web.Request) -> web.Response:
                ok, reason = check()
                return web.Response(status=200 if ok else 503, text=reason + "\n")
            return handler

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/healthz", answer(self.healthy))
        app.router.add_get("/readyz", answer(self.ready))
        return app

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0 = any free port); returns the bound port."""
        from aiohttp import web

        self._runner = web.AppRunner(self._app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        try:
            await site.start()
        except OSError as exc:  # taken since check_port, or never checked
            await self._runner.cleanup()
            self._runner = None
            raise port_error(host, port, exc) from None
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else port
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
