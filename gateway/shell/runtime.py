"""The runtime every session of a gateway node shares: config, agent, store, the live
sessions (the registry), and their moves between nodes on a shared store.

Below the edges: the socket endpoints and the HTTP routes take it from the app's state and
call down into it, never the other way.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import secrets
import socket
import time
from pathlib import Path

import msgspec
import structlog

from gateway.agent.file import DEMO_AGENT, Agent, load_agent, load_crew
from gateway.auth.admission import AddressCounter, SessionQuota, proxy_networks
from gateway.auth.credentials import Authenticator
from gateway.auth.origin import OriginPolicy
from gateway.config import Config
from gateway.core.principal import ANONYMOUS, Principal
from gateway.core.schema_guard import SchemaGuard, SchemaLimits
from gateway.core.session import AgentProfile, Session, SessionSettings
from gateway.core.state import decode_items, decode_state
from gateway.errors import Closing, StoreUnavailable, TooManySessions, closing, of_error
from gateway.providers.base import Provider, ReportsRetries
from gateway.shell.connection import Abort, Connection, FrameWriter, Socket
from gateway.shell.driver import Driver
from gateway.shell.metrics import Metrics
from gateway.shell.observe import LogObserver
from gateway.shell.schema_worker import SchemaWorker
from gateway.store import Lease, MemoryStore, SessionRecord, Store, store_from_config
from gateway.wire.v1 import Limits, SessionResume, decode_server

__all__ = ["ResumeRefusal", "Runtime", "agent_from_config", "new_id"]

log = structlog.get_logger("gateway.app")

_RENEW_BATCH = 500
"""Leases renewed in one pipeline (one round trip to the store)."""
_READY_TIMEOUT = 1.0
"""Seconds the store has to answer ``/readyz``'s ping."""


def new_id(prefix: str) -> str:
    """A random, unguessable id such as ``call_Xb3...`` (matches ``^[A-Za-z0-9_-]+$``)."""
    return f"{prefix}_{secrets.token_urlsafe(16)}"


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


ResumeRefusal = Closing
"""Why a ``session.resume`` is refused: close code, reason, label for logs."""


def _caught_up(session: Session, logged: list[bytes]) -> bool:
    """Catch ``session`` up with events its log has after its saved state."""
    try:
        sent = [decode_server(data) for data in logged]
    except msgspec.ValidationError:  # DecodeError too: not events this gateway wrote
        return False
    return session.catch_up(sent)


def _check_owner(record: SessionRecord, msg: SessionResume, principal: str) -> ResumeRefusal | None:
    """Why ``principal`` may not resume the session of ``record`` with ``msg``, if so."""
    # Both checks run, so the answer's timing tells nothing about which failed.
    owner = hmac.compare_digest(record.principal.encode(), principal.encode())
    token = hmac.compare_digest(record.token_hash, _token_hash(msg.resume_token))
    if not owner:
        return closing("not_owner")
    if not token:
        return closing("wrong_resume_token")
    return None


class Runtime:
    """What every session of this gateway shares: config, agent, store, live sessions."""

    def __init__(self, config: Config, agent: Agent, store: Store | None = None) -> None:
        """Raises ``ConfigError``: an agent ``agent`` may hand sessions to is invalid."""
        self.config = config
        self.agent = agent
        self.agents = load_crew(agent, pace=config.scripted_pace)
        """``agent`` and every agent its sessions may be handed to, by name."""
        self.store: Store = store or store_from_config(config)
        self.durable = not isinstance(self.store, MemoryStore)
        """Sessions are saved whole and may move between nodes (a shared store: Redis)."""
        self.node = config.node_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        """This gateway node's name in leases."""
        self._adopting: dict[str, asyncio.Future[Driver | ResumeRefusal]] = {}
        self._background: list[asyncio.Task[None]] = []
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

        self.sockets = AddressCounter(
            config.max_sockets_per_ip, exempt=proxy_networks(config.forwarded_allow_ips)
        )
        """Open WebSockets per client address (``max_sockets_per_ip``)."""
        self.sessions = SessionQuota(
            max_total=config.max_sessions, max_per_principal=config.max_sessions_per_principal
        )
        """Sessions held, live or waiting for a resume, in total and per principal."""

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
        self.sessions.reserve(principal.name)  # before any await: no two starts race past it
        try:
            return await self._new_session(principal)
        except BaseException:
            self.sessions.release(principal.name)
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
                token_hash=_token_hash(token),
                agent=self.agent.name,
                created_at=time.time(),
                principal=principal.name,
            )
        )
        lease = await self._acquire(session.session_id)
        if self.closing:  # began while the store was writing: shutdown has its list already
            await self.store.end_session(session.session_id)
            raise _shutting_down()
        return self._drive(session, principal.name, lease)

    async def _acquire(self, session_id: str) -> Lease | None:
        """The session's lease for this node, with a durable store (taken from any other)."""
        if not self.durable:
            return None
        return await self.store.acquire(session_id, self.node, ttl=self.config.lease_ttl)

    def _drive(
        self,
        session: Session,
        principal: str,
        lease: Lease | None,
        *,
        adopted_from: int | None = None,
    ) -> Driver:
        """Run ``session`` here from now on."""
        self._start_background()
        driver = Driver(
            session,
            provider=self.agent.provider,
            tools=self.agent.toolbox,
            agents=self.agents,
            store=self.store,
            session_ttl=self.config.session_ttl,
            observers=(LogObserver(lambda: session.metadata), self.metrics.observer()),
            check_schemas=self.schema_worker.check,
            lease=lease,
            max_client_events=self.config.max_inbound_queue,
            adopted_from=adopted_from,
        )
        self.drivers[driver.session_id] = driver
        self.idle.clear()
        self._runs[driver.session_id] = asyncio.create_task(
            self._run(driver, principal), name=f"gateway:session:{driver.session_id}"
        )
        return driver

    async def find_session(
        self, msg: SessionResume, principal: str = "anonymous"
    ) -> Driver | ResumeRefusal:
        """The live session a ``session.resume`` by ``principal`` names, or the close code
        and reason refusing it (only the session's creator may resume it)."""
        driver = self.drivers.get(msg.session_id)
        if driver is not None and self.durable and not await self._still_ours(driver):
            driver = None  # it left this node: take it over again, from the store
        record = await self.store.get_session(msg.session_id)
        if record is not None and driver is None and self.durable:
            refusal = _check_owner(record, msg, principal)
            if refusal is not None:
                return refusal
            return await self._adopt(record)
        if driver is None or record is None:
            if await self.store.ended(msg.session_id):
                return closing("session_expired")
            return closing("unknown_session")
        return _check_owner(record, msg, principal) or driver

    async def _still_ours(self, driver: Driver) -> bool:
        """Whether this node still drives ``driver``'s session. Asked of the store before a
        resume attaches here: a lease renewal late on a busy node must not let a client
        resume a copy another node has moved on from."""
        if driver.moved:
            return False
        if driver.lease is None:
            return True
        if await self.store.renew(driver.session_id, driver.lease, ttl=self.config.lease_ttl):
            return True
        driver.let_go()
        return False

    async def _adopt(self, record: SessionRecord) -> Driver | ResumeRefusal:
        """Take a session over from the store: another node drove it (it died, it is
        shutting down, or the client simply reconnected elsewhere)."""
        session_id = record.session_id
        adopting = self._adopting.get(session_id)
        if adopting is not None:  # two resumes at once on this node: one adoption
            return await asyncio.shield(adopting)
        future: asyncio.Future[Driver | ResumeRefusal] = asyncio.get_running_loop().create_future()
        self._adopting[session_id] = future
        try:
            found = await self._take_over(record)
            future.set_result(found)
            return found
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a lone adoption need not be awaited twice
            raise
        finally:
            del self._adopting[session_id]

    async def _take_over(self, record: SessionRecord) -> Driver | ResumeRefusal:
        expired = closing("session_expired")
        if self.closing:
            return closing("shutting_down")
        try:
            self.sessions.reserve(record.principal)
        except TooManySessions as exc:
            return of_error(exc, exc.label)
        try:
            lease = await self._acquire(record.session_id)  # first: no write of theirs after
            data = await self.store.load_state(record.session_id)
            if data is None:  # never started, or ended meanwhile
                if lease is not None:
                    await self.store.release(record.session_id, lease)
                self.sessions.release(record.principal)
                return expired
            state = decode_state(data)
            state.history = decode_items(await self.store.load_history(record.session_id))
            session = Session.restore(self._settings(ANONYMOUS), state, new_id=new_id)
            # The text a stream sent since the state was last saved is in the log.
            tail = await self.store.events_after(record.session_id, state.seq)
        except BaseException:
            self.sessions.release(record.principal)
            raise
        if tail is None or (tail and not _caught_up(session, tail)):
            if lease is not None and not await self._holds(record.session_id, lease):
                # Another node took the session over while this one read it, and moved on
                # (its acks trimmed the log): the client resumes where it is now.
                self.sessions.release(record.principal)
                return closing("session_moved")
            # Never, by the driver's rule (the log is not trimmed past the state saved):
            # were it so, the session would go on from an older point than its client's.
            log.error(
                "session_log_not_caught_up",
                session_id=record.session_id,
                saved_seq=state.seq,
                caught_up_to=session.last_seq,
                gap=tail is None,
            )
        session.adopt(time.time())
        log.info("session_adopted", session_id=record.session_id, seq=state.seq)
        self.metrics.note_adoption()
        return self._drive(session, record.principal, lease, adopted_from=state.seq)

    async def _holds(self, session_id: str, lease: Lease) -> bool:
        """Whether ``lease`` is still the session's (renewed if so); ``False`` too when
        the store does not answer (the lease will not be renewed either)."""
        try:
            return await self.store.renew(session_id, lease, ttl=self.config.lease_ttl)
        except StoreUnavailable:
            return False

    def _start_background(self) -> None:
        """With a durable store: renew this node's leases, listen for posts to its
        sessions. Started with the first session (it needs the running loop)."""
        if self.durable and not self._background:
            self._background = [
                asyncio.create_task(self._renew_leases(), name="gateway:leases"),
                asyncio.create_task(self._listen(), name="gateway:listen"),
            ]

    async def _renew_leases(self) -> None:
        """Renew the lease of every session driven here, every third of ``lease_ttl``, in
        pipelines of ``_RENEW_BATCH``; a session whose lease another node took is let go."""
        while True:
            await asyncio.sleep(self.config.lease_ttl / 3)
            await self.renew_leases()

    async def renew_leases(self) -> None:
        """One pass of the renewals: every lease of this node, in pipelines of
        ``_RENEW_BATCH``; a session whose lease another node took is let go."""
        ttl = self.config.lease_ttl
        drivers = [d for d in self.drivers.values() if d.lease is not None and not d.moved]
        for start in range(0, len(drivers), _RENEW_BATCH):
            batch = [(d, d.lease) for d in drivers[start : start + _RENEW_BATCH] if d.lease]
            try:
                renewed = await self.store.renew_many(
                    [(d.session_id, lease) for d, lease in batch], ttl=ttl
                )
            except StoreUnavailable as exc:
                log.warning("leases_not_renewed", sessions=len(batch), error=str(exc))
                continue
            for (driver, _), held in zip(batch, renewed, strict=True):
                if not held:
                    driver.let_go()

    async def _listen(self) -> None:
        """Wake the sessions driven here when something is posted for them."""
        while True:
            try:
                async with self.store.listen(self.node, self._wake):
                    await asyncio.Future()  # until cancelled, or the listener fails
            except StoreUnavailable as exc:
                log.warning("store_listen_failed", error=str(exc))
                await asyncio.sleep(1.0)

    def _wake(self, session_id: str) -> None:
        driver = self.drivers.get(session_id)
        if driver is not None:
            driver.take_posts()

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

    async def aclose(self) -> None:
        """Stop this node's background work, close the store and the tool backends (after
        ``shutdown``, which leaves no session; without it, the sessions left are cancelled
        first, so that none uses the store or a tool once they are closed)."""
        runs = [*self._runs.values(), *self._background]
        for task in runs:
            task.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        self._background = []
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
            if driver.connection is not None:
                driver.connection.close(closing("internal").code)  # our bug: no reason text
        else:
            if driver.connection is not None and not driver.connection.closing:
                ended = closing("session_ended")
                driver.connection.close(ended.code, ended.reason, flush=True)
        finally:
            if self.drivers.get(driver.session_id) is driver:
                del self.drivers[driver.session_id]
            if self._runs.get(driver.session_id) is asyncio.current_task():
                del self._runs[driver.session_id]
            self.sessions.release(principal)
            if not self.drivers:
                self.idle.set()
            if driver.moved:
                self.metrics.note_moved()
                log.info("session_moved")
            else:
                log.info("session_ended")

    async def shutdown(self, grace: float) -> None:
        """Graceful stop: refuse new sockets and sessions, let running responses finish for
        up to ``grace`` seconds, then cut them and close every socket with 1012.

        Every session live at any moment until this returns is stopped, including one that
        started (or was taken over from another node) during the grace period.
        """
        self.closing = True
        log.info("shutdown_started", sessions=len(self.drivers), grace=grace)
        try:
            async with asyncio.timeout(grace):
                await asyncio.gather(*(d.quiet.wait() for d in list(self.drivers.values())))
        except TimeoutError:
            log.warning("shutdown_cutting_responses")
        stopped: list[Driver] = []
        while self._runs:  # until none is left: one may have started while others stopped
            drivers = list(self.drivers.values())
            for driver in drivers:
                driver.stop()
            stopped += drivers
            await asyncio.gather(*list(self._runs.values()), return_exceptions=True)
        closing = [d.connection.done.wait() for d in stopped if d.connection is not None]
        try:
            async with asyncio.timeout(5.0):
                await asyncio.gather(*closing)
        except TimeoutError:
            log.warning("shutdown_sockets_not_closed")
        for agent in self.agents.values():
            await agent.provider.aclose()
        log.info("shutdown_finished", sessions=len(stopped))


def _shutting_down() -> TooManySessions:
    code, reason, label = closing("shutting_down")
    return TooManySessions(reason, close_code=code, label=label)


def agent_from_config(config: Config) -> Agent:
    """The agent the configuration names (the demo by default), checked.

    Raises:
        ConfigError: the agent file, its scenario or the model settings are invalid.
    """
    path = Path(config.agent) if config.agent else DEMO_AGENT
    return load_agent(path, pace=config.scripted_pace, model=config.model, base_url=config.base_url)
