"""The Starlette application: routes, and the runtime shared by all sessions."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute

from gateway import __version__
from gateway.agent import DEMO_AGENT, Agent, load_agent
from gateway.config import Config
from gateway.driver import Driver, SendFn
from gateway.protocol import PROTOCOL_VERSION, Limits
from gateway.session import Session, SessionSettings
from gateway.transport import realtime_endpoint

__all__ = ["Runtime", "create_app", "new_id"]


def new_id(prefix: str) -> str:
    """A random, unguessable id such as ``call_Xb3...`` (matches ``^[A-Za-z0-9_-]+$``)."""
    return f"{prefix}_{secrets.token_urlsafe(16)}"


@dataclass(frozen=True)
class Runtime:
    """What every session of this gateway shares: config, agent, the live sessions."""

    config: Config
    agent: Agent
    drivers: set[Driver] = field(default_factory=set)
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while no session is live (tests wait on it; shutdown will too)."""

    def __post_init__(self) -> None:
        self.idle.set()

    def attach(self, driver: Driver) -> None:
        self.drivers.add(driver)
        self.idle.clear()

    def detach(self, driver: Driver) -> None:
        self.drivers.discard(driver)
        if not self.drivers:
            self.idle.set()

    def new_session(self) -> Session:
        config = self.config
        settings = SessionSettings(
            agent=self.agent.name,
            instructions=self.agent.instructions,
            tools=self.agent.tools,
            model_supports_tools=self.agent.provider.capabilities.tools,
            limits=Limits(
                max_message_chars=config.max_message_chars,
                max_queued_messages=config.max_queued_messages,
                max_steps=config.max_steps,
                ws_max_size=config.ws_max_size,
                client_call_timeout=config.client_call_timeout,
            ),
            server_tool_timeout=config.server_tool_timeout,
        )
        return Session(settings, session_id=new_id("sess"), new_id=new_id)

    def new_driver(self, session: Session, send: SendFn) -> Driver:
        return Driver(
            session,
            provider=self.agent.provider,
            server_tools=self.agent.server_tools,
            send=send,
        )


def create_app(config: Config, *, agent: Agent | None = None) -> Starlette:
    """Build the ASGI app. Loads the agent now, so a bad agent file fails at startup.

    Raises:
        ConfigError: the agent file or its scenario is invalid.
    """
    if agent is None:
        path = Path(config.agent) if config.agent else DEMO_AGENT
        agent = load_agent(path, pace=config.scripted_pace)
    runtime = Runtime(config=config, agent=agent)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "status": "ok",
                "version": __version__,
                "protocol_version": PROTOCOL_VERSION,
                "agent": runtime.agent.name,
                "model": runtime.agent.provider.name,
                "sessions": len(runtime.drivers),
            }
        )

    app = Starlette(
        routes=[
            Route("/healthz", health),
            WebSocketRoute("/v1/realtime", realtime_endpoint),
        ]
    )
    app.state.runtime = runtime
    return app
