"""The Starlette application: its routes, over the runtime shared by all sessions
(``gateway.shell.runtime``)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import structlog
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from gateway import __version__
from gateway.agent.file import Agent
from gateway.agent.workbench import describe_agent, describe_tools, run_tool_alone
from gateway.auth.origin import OriginGuard
from gateway.config import Config
from gateway.edge.auth_http import auth_routes, guard_bearer, guard_tool_test
from gateway.edge.body import BodyTooLarge, body_too_large, client_gone, read_body
from gateway.edge.openai_endpoint import OPENAI_REALTIME_PATH, openai_realtime_endpoint
from gateway.edge.sessions_http import session_routes
from gateway.edge.usage_http import usage_routes
from gateway.edge.v1_endpoint import realtime_endpoint
from gateway.shell.metrics import CONTENT_TYPE
from gateway.shell.runtime import Runtime, agent_from_config
from gateway.wire.v1 import PROTOCOL_VERSION

__all__ = ["REALTIME_PATH", "create_app"]

log = structlog.get_logger("gateway.app")


def _package_dir(package: str, *parts: str) -> Path:
    """A directory shipped inside a package (the wheel has them; so has the source tree).

    Starlette serves files from a real directory, so a zipped install is refused.
    """
    resource = files(package).joinpath(*parts)
    if not isinstance(resource, Path) or not resource.is_dir():
        raise RuntimeError(f"{package}/{'/'.join(parts)} is not a directory on disk: {resource}")
    return resource


# The web demo and the browser SDK, from the installed packages (the wheel ships them).
WEB_DEMO = _package_dir("web_demo")
SDK_JS = _package_dir("client_sdk", "js")


REALTIME_PATH = "/v1/realtime"


class GatewayApp(Starlette):
    """The Starlette app, with the realtime socket sent straight to its endpoint.

    Every ASGI layer between uvicorn and an endpoint (the middleware, the exception
    wrappers, the router) is a coroutine frame the socket holds for its whole life, and a
    pass at every handshake: about 3.5 KiB per idle session, measured with tracemalloc
    (docs/performance.md). The realtime endpoint needs none of them: it checks the origin
    itself and handles its own errors. Any other path (the same one under a
    ``root_path`` included) goes the usual way, through the ``WebSocketRoute``.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and scope["path"] == REALTIME_PATH:
            scope["app"] = self
            await realtime_endpoint(WebSocket(scope, receive, send))
            return
        await super().__call__(scope, receive, send)


def create_app(config: Config, *, agent: Agent | None = None) -> Starlette:
    """Build the ASGI app. Loads the agent now, so a bad agent file fails at startup.

    Raises:
        ConfigError: the agent file or its scenario is invalid, or the auth settings are
            unsafe or invalid (no API key with auth on, ``no_auth`` off loopback, a bad
            keys file, a short token secret).
    """
    runtime = Runtime(config, agent or agent_from_config(config))

    async def health(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "status": "stopping" if runtime.closing else "ok",
                "version": __version__,
                "protocol_version": PROTOCOL_VERSION,
                "agent": runtime.agent.name,
                "model": runtime.agent.provider.name,
                "sessions": len(runtime.drivers),
            }
        )

    async def ready(request: Request) -> JSONResponse:
        reason = await runtime.readiness()
        if reason is not None:
            return JSONResponse({"status": "not_ready", "reason": reason}, status_code=503)
        return JSONResponse({"status": "ready"})

    async def metrics(request: Request) -> Response:
        return Response(runtime.metrics.render(), media_type=CONTENT_TYPE)

    def agent_asked(request: Request) -> Agent | None:
        """The agent ``?agent=`` names (one a session may be handed to), else the
        gateway's own; ``None`` for a name it does not have."""
        name = request.query_params.get("agent")
        return runtime.agent if name is None else runtime.agents.get(name)

    def no_such_agent(request: Request) -> JSONResponse:
        name = request.query_params.get("agent", "")[:64]
        return JSONResponse({"error": f"no agent {name!r} on this gateway"}, status_code=404)

    async def list_tools(request: Request) -> JSONResponse:
        if (refused := guard_bearer(runtime, request)) is not None:
            return refused
        if (agent := agent_asked(request)) is None:
            return no_such_agent(request)
        return JSONResponse(describe_tools(agent))

    async def describe(request: Request) -> JSONResponse:
        if (refused := guard_bearer(runtime, request)) is not None:
            return refused
        return JSONResponse(describe_agent(runtime.agent))

    async def test_tool(request: Request) -> JSONResponse:
        if (refused := guard_tool_test(runtime, request)) is not None:
            return refused
        if (agent := agent_asked(request)) is None:
            return no_such_agent(request)
        status, answer = await run_tool_alone(
            agent,
            request.path_params["name"],
            await read_body(request, config.max_body_size),
            config.server_tool_timeout,
        )
        return JSONResponse(answer, status_code=status)

    async def index(request: Request) -> FileResponse:
        return FileResponse(WEB_DEMO / "index.html")

    routes: list[BaseRoute] = [
        Route("/healthz", health),
        Route("/readyz", ready),
        Route("/metrics", metrics),
        Route("/v1/agent", describe),
        Route("/v1/tools", list_tools),
        Route("/v1/tools/{name}/test", test_tool, methods=["POST"]),
        WebSocketRoute(REALTIME_PATH, realtime_endpoint),
        WebSocketRoute(OPENAI_REALTIME_PATH, openai_realtime_endpoint),
        Mount("/sdk", app=StaticFiles(directory=SDK_JS), name="sdk"),
        Route("/", index),
        Mount("/demo", app=StaticFiles(directory=WEB_DEMO)),
        *auth_routes(runtime),
        *session_routes(runtime),
        *usage_routes(runtime),
    ]
    if config.a2a or runtime.agent.a2a:
        # Here, not at the top: the A2A SDK's server loads only when it serves (docs/a2a.md).
        from gateway.edge.a2a_server import a2a_routes

        routes += a2a_routes(runtime)
    app = GatewayApp(
        routes=routes,
        middleware=[Middleware(OriginGuard, policy=runtime.origins)],
        exception_handlers={BodyTooLarge: body_too_large, ClientDisconnect: client_gone},
    )
    app.state.runtime = runtime
    return app
