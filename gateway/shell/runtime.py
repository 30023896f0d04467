"""The runtime every session of a gateway node shares: config, agent, store, the live
sessions (the registry of their drivers), starting and stopping them.

Their moves between nodes on a shared store are its collaborator's, the cluster
(``gateway.shell.cluster``). Below the edges: the socket endpoints and the HTTP routes take
the runtime from the app's state and call down into it, never the other way.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any

import structlog

from gateway.agent.file import DEMO_AGENT, Agent, load_agent, load_crew
from gateway.auth.admission import AddressCounter, SessionQuota, proxy_networks
from gateway.auth.credentials import Authenticator
from gateway.auth.limits import Budgets
from gateway.auth.origin import OriginPolicy
from gateway.config import Config
from gateway.core.event import Disconnected
from gateway.core.principal import ANONYMOUS, Principal
from gateway.core.schema_guard import SchemaGuard, SchemaLimits
from gateway.core.session import AgentProfile, Session, SessionSettings
from gateway.core.state import SessionState
from gateway.errors import TooManySessions, closing
from gateway.providers.base import Provider, ReportsRetries
from gateway.providers.realtime import RealtimeProvider
from gateway.shell.cluster import Cluster, ResumeRefusal, token_hash
from gateway.shell.connection import Abort, Connection, FrameWriter, Socket
from gateway.shell.driver import Driver
from gateway.shell.meter import Meter, UsageObserver
from gateway.shell.metrics import Metrics
from gateway.shell.notify import Notifier, PushObserver, server_tool_lookup
from gateway.shell.observe import LogObserver, SessionObserver
from gateway.shell.schema_worker import SchemaWorker
from gateway.shell.voice import VoicePool
from gateway.store import Lease, SessionRecord, Store, ledger_for, store_from_config
from gateway.wire.v1 import Limits, SessionAttach, SessionResume

__all__ = ["ResumeRefusal", "Runtime", "agent_from_config", "new_id"]

log = structlog.get_logger("gateway.app")

_READY_TIMEOUT = 1.0
"""Seconds the store has to answer ``/readyz``'s ping."""
_MOVE_WAIT = 2.0
"""Seconds after ``session.going_away`` at shutdown a session's clients have to resume on
another node before it is handed over anyway (the SDKs take milliseconds)."""
_END_WAIT = 2.0
"""Seconds ``end_session`` waits for a session driven here to have ended (it goes on
ending after)."""


def _model_name(agent: Agent) -> str:
    """What an agent's model is called in usage and prices: its name (``gpt-4o-mini``), or
    its provider's for a model without one (``scripted``)."""
    return agent.model or agent.provider.name


def new_id(prefix: str) -> str:
    """A random, unguessable id such as ``call_Xb3...`` (matches ``^[A-Za-z0-9_-]+$``)."""
    return f"{prefix}_{secrets.token_urlsafe(16)}"


class Runtime:
    """What every session of this gateway shares: config, agent, store, live sessions."""

    def __init__(self, config: Config, agent: Agent, store: Store | None = None) -> None:
        """Raises ``ConfigError``: an agent ``agent`` may hand sessions to is invalid."""
        self.config = config
        self.agent = agent
        self.agents = load_crew(agent, pace=config.scripted_pace)
        """``agent`` and every agent its sessions may be handed to, by name."""
        self.store: Store = store or store_from_config(config)
        self.node = config.node_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        """This gateway node's name in leases."""
        self.drivers: dict[str, Driver] = {}
        self.idle = asyncio.Event()
        """Set while no session is live (tests and shutdown wait on it)."""
        self.idle.set()
        self.closing = False
        self._runs: dict[str, asyncio.Task[None]] = {}
        self.auth = Authenticator.from_config(config, agent=agent.name)
        self.origins = OriginPolicy.from_settings(
            config.allowed_origins, config.allowed_hosts, config.host
        )
        self.metrics = Metrics()
        """This gateway's Prometheus metrics (``GET /metrics``), on a registry of its own."""
        self.notifier = (
            Notifier(agent.notify, registry=self.metrics.registry) if agent.notify else None
        )
        """Posts the agent's push notices (``notify_url``), if it has a webhook."""
        for member in self.agents.values():
            self._count_retries(member.provider)
        self.schema_guard = SchemaGuard(
            SchemaLimits(
                max_size=config.tool_schema_max_size,
                max_total_size=config.client_functions_max_size,
                max_depth=config.max_schema_depth,
                max_nodes=config.max_schema_nodes,
                max_pattern_length=config.max_schema_pattern_length,
                max_check_steps=config.max_schema_check_steps,
            ),
            cache_size=config.max_cached_schemas,
        )
        """Client-function schema limits, and the schemas checked so far (all sessions)."""
        self.schema_worker = SchemaWorker(self.schema_guard)
        self.voice = VoicePool.from_config(config)
        """The speech engines for sessions' audio (their workers start with the first)."""

        self.sockets = AddressCounter(
            config.max_sockets_per_ip, exempt=proxy_networks(config.forwarded_allow_ips)
        )
        """Open WebSockets per client address (``max_sockets_per_ip``)."""
        self.budgets = Budgets.load(config.limits)
        """The limits file (``--limits``): usage limits, prices (docs/usage.md)."""
        self.budgets.check_priced(_model_name(member) for member in self.agents.values())
        self.meter = Meter(
            self.budgets,
            ledger_for(self.store, keep_days=self.budgets.spec.usage.keep_days),
            {name: _model_name(member) for name, member in self.agents.items()},
            self.metrics,
        )
        """Every model step reserved against its limits, and usage counted by key, end
        user, agent and model."""
        self.sessions = SessionQuota(
            max_total=config.max_sessions,
            max_per_principal=config.max_sessions_per_principal,
            caps=self.budgets.session_caps,
        )
        """Sessions held, live or waiting for a resume, in total and per principal."""
        self.cluster = Cluster(
            self,
            self.store,
            node=self.node,
            lease_ttl=config.lease_ttl,
            drivers=self.drivers,
            sessions=self.sessions,
            metrics=self.metrics,
        )
        """This node's part in the moves of sessions between nodes (a shared store)."""
        self.durable = self.cluster.durable
        """Sessions are saved whole and may move between nodes (a shared store: Redis)."""

    def _count_retries(self, provider: Provider) -> None:
        if isinstance(provider, ReportsRetries):
            provider.on_retry = lambda reason: self.metrics.note_retry(provider.name, reason)

    def note_refusal(self, label: str) -> None:
        """Count a refused WebSocket connection under ``label`` (``no_token``...)."""
        self.metrics.note_refusal(label)

    async def readiness(self) -> str | None:
        """Why this gateway should get no new sessions now, or ``None`` if it is ready."""
        if self.closing:
            return "shutting_down"
        try:
            async with asyncio.timeout(_READY_TIMEOUT):
                await self.store.ping()
        except Exception as exc:
            log.warning("store_not_answering", error=type(exc).__name__)
            return "store_not_answering"
        return None

    def connection(
        self,
        socket: Socket,
        *,
        abort: Abort | None = None,
        frame_writer: FrameWriter | None = None,
    ) -> Connection:
        """Wrap a socket with this gateway's outbound bounds and timeouts.

        ``abort`` drops the socket's connection at once (the server puts it in the ASGI
        scope); without it a client that never reads is only closed.
        """
        return Connection(
            socket,
            soft_size=self.config.outbound_soft_size,
            hard_size=self.config.outbound_hard_size,
            send_timeout=self.config.send_timeout,
            close_timeout=self.config.ws_close_timeout,
            abort=abort,
            frame_writer=frame_writer,
        )

    async def start_session(self, principal: str | Principal = "anonymous") -> Driver:
        """A new session, running until it ends (``session_ttl`` after its last socket).

        Args:
            principal: who the session belongs to: what auth proved (its claims and the
                client functions it may declare go with the session), or just a name.

        Raises:
            TooManySessions: the principal holds ``max_sessions_per_principal`` sessions
                (4029), the gateway holds ``max_sessions`` (1013), or it is shutting down
                (1012: a shutdown stops what it accepted, so it accepts nothing new).
        """
        if self.closing:
            raise _shutting_down()
        if isinstance(principal, str):
            principal = (
                ANONYMOUS
                if principal == ANONYMOUS.name
                else Principal(name=principal, kind="api_key")
            )
        # Before any await: no two starts race past it.
        self.sessions.reserve(principal.name, self.agent.name)
        try:
            return await self._new_session(principal)
        except BaseException:
            self.sessions.release(principal.name, self.agent.name)
            raise

    def _settings(self, principal: Principal) -> SessionSettings:
        """What this gateway builds a session of ``principal`` from."""
        config = self.config
        return SessionSettings(
            agent=self.agent.name,
            instructions=self.agent.instructions,
            tools=self.agent.tools,
            model_supports_tools=self.agent.provider.capabilities.tools,
            model_supports_tool_choice=self.agent.provider.capabilities.tool_choice,
            confirm_rules=self.agent.confirm_rules,
            agents=self._profile,
            limits=Limits(
                max_message_chars=config.max_message_chars,
                max_queued_messages=config.max_queued_messages,
                max_steps=config.max_steps,
                ws_max_size=config.ws_max_size,
                client_call_timeout=config.client_call_timeout,
                max_messages_per_second=config.max_messages_per_second,
                max_message_burst=config.max_message_burst,
                max_tool_result_size=config.max_tool_result_size,
            ),
            server_tool_timeout=config.server_tool_timeout,
            principal=principal,
            schema_guard=self.schema_guard,
            max_history_chars=config.max_history_chars,
            voices=(
                self.agent.provider.voices
                if isinstance(self.agent.provider, RealtimeProvider)
                else self.voice.voices
            ),
        )

    def _profile(self, name: str) -> AgentProfile | None:
        """What a session handed to the agent ``name`` takes from it (its tools now)."""
        agent = self.agents.get(name)
        if agent is None:
            return None
        return AgentProfile(
            agent=agent.name,
            instructions=agent.instructions,
            tools=agent.tools,
            model_supports_tools=agent.provider.capabilities.tools,
            model_supports_tool_choice=agent.provider.capabilities.tool_choice,
            confirm_rules=agent.confirm_rules,
        )

    async def _new_session(self, principal: Principal) -> Driver:
        token = secrets.token_urlsafe(32)
        session = Session(
            self._settings(principal), session_id=new_id("sess"), resume_token=token, new_id=new_id
        )
        await self.store.create_session(
            SessionRecord(
                session_id=session.session_id,
                token_hash=token_hash(token),
                agent=self.agent.name,
                created_at=time.time(),
                principal=principal.name,
            )
        )
        lease = await self.cluster.acquire(session.session_id)
        if self.closing:  # began while the store was writing: shutdown has its list already
            await self.store.end_session(session.session_id)
            raise _shutting_down()
        return self._drive(session, principal.name, lease)

    def _drive(
        self,
        session: Session,
        principal: str,
        lease: Lease | None,
        *,
        adopted_from: int | None = None,
    ) -> Driver:
        """Run ``session`` here from now on."""
        self.cluster.start()
        meter = self.meter.session(session.principal, session.agent)
        driver = Driver(
            session,
            provider=self.agent.provider,
            tools=self.agent.toolbox,
            agents=self.agents,
            store=self.store,
            session_ttl=self.config.session_ttl,
            observers=(*self._observers(session), UsageObserver(meter)),
            meter=meter,
            check_schemas=self.schema_worker.check,
            lease=lease,
            max_client_events=self.config.max_inbound_queue,
            adopted_from=adopted_from,
            voice=self.voice,
        )
        self.drivers[driver.session_id] = driver
        self.idle.clear()
        self._runs[driver.session_id] = asyncio.create_task(
            self._run(driver, principal), name=f"gateway:session:{driver.session_id}"
        )
        return driver

    def _observers(self, session: Session) -> tuple[SessionObserver, ...]:
        """Who watches a session: its logs, the metrics, and its push notices if any."""
        observers: tuple[SessionObserver, ...] = (
            LogObserver(lambda: session.metadata),
            self.metrics.observer(),
        )
        if self.notifier is None:
            return observers
        tools = server_tool_lookup(self.agents)
        return (*observers, PushObserver(session.session_id, self.notifier.notify, tools))

    def restore(self, state: SessionState) -> Session:
        """The session ``state`` is (one taken over from another node), with this node's
        settings."""
        return Session.restore(self._settings(ANONYMOUS), state, new_id=new_id)

    def run_adopted(
        self, session: Session, principal: str, lease: Lease | None, *, seq: int
    ) -> Driver:
        """Drive ``session``, taken over from another node at ``seq``, here from now on."""
        return self._drive(session, principal, lease, adopted_from=seq)

    async def find_session(
        self, msg: SessionResume | SessionAttach, principal: str = "anonymous"
    ) -> Driver | ResumeRefusal:
        """The live session a ``session.resume`` by ``principal`` names, taken over from
        another node if need be, or the close code and reason refusing it (only the
        session's creator may resume it)."""
        return await self.cluster.find_session(msg, principal)

    async def end_session(self, session_id: str) -> None:
        """End the session now, as its client's normal close would (``DELETE
        /v1/sessions/{id}``; the caller checked the right to).

        Driven here: its loop ends it (running work cancelled, the store forgets it) and its
        socket, if one is attached, closes with 1000 "session ended"; this returns once it
        has ended (or after ``_END_WAIT``, still ending). Driven by another node, or by none
        (its node died, or it moved on): the store forgets it, so that no node resumes it
        (a resume anywhere is refused: ``session_expired``); a node still driving it finds
        its lease gone at its next commit or lease renewal (within a third of
        ``lease_ttl``), and stops, closing its socket with 1013, whose resume is refused.

        Raises:
            StoreUnavailable: the store does not answer.
        """
        driver = self.drivers.get(session_id)
        if driver is not None and not driver.moved:
            driver.feed(Disconnected())
            run = self._runs.get(session_id)
            if run is not None:
                await asyncio.wait({run}, timeout=_END_WAIT)
            if not driver.moved:  # ended here, the store told (or it will be, at its end)
                return
        await self.store.end_session(session_id)

    async def renew_leases(self) -> None:
        """One pass of the renewals: every lease of this node (see ``Cluster``)."""
        await self.cluster.renew_leases()

    async def start(self) -> None:
        """Connect the agent's tool backends (MCP servers, OpenAPI documents), before the
        gateway serves.

        Raises:
            ConfigError: one that is not optional cannot start (see ``Agent.start``).
        """
        started: list[Agent] = []
        try:
            for agent in self.agents.values():
                await agent.start()
                started.append(agent)
        except BaseException:
            for agent in started:
                await agent.aclose()
            raise
        if self.config.voice_prestart and self.voice.engines is not None:
            self.voice.start_soon()

    async def aclose(self) -> None:
        """Stop this node's background work, close the store and the tool backends (after
        ``shutdown``, which leaves no session; without it, the sessions left are cancelled
        first, so that none uses the store or a tool once they are closed)."""
        runs = list(self._runs.values())
        for task in runs:
            task.cancel()
        await asyncio.gather(*runs, self.cluster.aclose(), return_exceptions=True)
        await self.voice.aclose()
        if self.notifier is not None:
            await self.notifier.aclose()
        await self.meter.drain()  # usage still being written
        await self.store.aclose()
        for agent in self.agents.values():
            await agent.aclose()

    async def _run(self, driver: Driver, principal: str) -> None:
        # Bound for the rest of this task, which runs in a context of its own.
        structlog.contextvars.bind_contextvars(session_id=driver.session_id)
        try:
            await driver.run()
        except Exception:
            log.exception("session_crashed")
            for conn in driver.connections:
                conn.close(closing("internal").code)  # our bug: no reason text
        else:
            ended = closing("session_ended")
            for conn in driver.connections:
                if not conn.closing:
                    conn.close(ended.code, ended.reason, flush=True)
        finally:
            if self.drivers.get(driver.session_id) is driver:
                del self.drivers[driver.session_id]
            if self._runs.get(driver.session_id) is asyncio.current_task():
                del self._runs[driver.session_id]
            self.sessions.release(principal, self.agent.name)
            if not self.drivers:
                self.idle.set()
            if driver.moved:
                self.metrics.note_moved()
                log.info("session_moved")
            else:
                log.info("session_ended")

    async def shutdown(self, grace: float) -> None:
        """Graceful stop: refuse new sockets and sessions, let running responses finish for
        up to ``grace`` seconds, then cut them and close every socket with 1012, each told
        first (``session.going_away``).

        With a durable store a session moves to another node without a gap: once its
        response is done, its sockets are told the node is going away (``time_left``: what
        is left of ``grace``), and the clients resume on other nodes ahead of the close
        (the SDKs do it at the notice), which takes the session over from this one. It is
        handed over here once it has moved, or has no socket, or ``_MOVE_WAIT`` seconds
        after the notice (a client that did not move).

        Every session live at any moment until this returns is stopped, including one that
        started (or was taken over from another node) during the grace period.
        """
        self.closing = True
        drivers = list(self.drivers.values())
        log.info("shutdown_started", sessions=len(drivers), grace=grace)
        deadline = asyncio.get_running_loop().time() + grace
        try:
            async with asyncio.timeout(grace):
                await asyncio.gather(*(self._wind_down(d, deadline) for d in drivers))
        except TimeoutError:
            log.warning("shutdown_cutting_responses")
        stopped: list[Driver] = []
        while self._runs:  # until none is left: one may have started while others stopped
            drivers = list(self.drivers.values())
            for driver in drivers:
                driver.stop()
            stopped += drivers
            await asyncio.gather(*list(self._runs.values()), return_exceptions=True)
        closing = [conn.done.wait() for d in stopped for conn in d.connections]
        try:
            async with asyncio.timeout(5.0):
                await asyncio.gather(*closing)
        except TimeoutError:
            log.warning("shutdown_sockets_not_closed")
        for agent in self.agents.values():
            await agent.provider.aclose()
        log.info("shutdown_finished", sessions=len(stopped))

    async def _wind_down(self, driver: Driver, deadline: float) -> None:
        """Until ``driver`` may be stopped at shutdown (by ``deadline`` at the latest): its
        response is done and, with a durable store, its clients were told and moved on
        (or ``_MOVE_WAIT`` passed, or it has no socket). Told only once its response is
        done: a client moving mid-answer would have the answer's step run again."""
        await driver.quiet.wait()
        run = self._runs.get(driver.session_id)
        if not self.durable or run is None or run.done() or driver.detached.is_set():
            return  # nowhere to move to, or nobody to tell
        driver.going_away("shutdown", deadline - asyncio.get_running_loop().time())
        waits: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(driver.detached.wait()),
            asyncio.shield(run),
        ]
        try:
            await asyncio.wait(waits, timeout=_MOVE_WAIT)
        finally:
            for wait in waits:
                wait.cancel()


def _shutting_down() -> TooManySessions:
    return TooManySessions(label="shutting_down")


def agent_from_config(config: Config) -> Agent:
    """The agent the configuration names (the demo by default), checked.

    Raises:
        ConfigError: the agent file, its scenario or the model settings are invalid.
    """
    path = Path(config.agent) if config.agent else DEMO_AGENT
    return load_agent(path, pace=config.scripted_pace, model=config.model, base_url=config.base_url)
