"""The skills of a remote A2A agent (``[[a2a_agents]]`` in an agent file), as a
``ToolBackend``.

The official ``a2a-sdk`` speaks the protocol. ``start`` fetches the agent card and makes a
tool of each selected skill, whose input is the message to send. A call sends one message
(streaming when the card says the agent can) and follows the reply (``reply``): a message is
the result; a task reports its status updates as progress and its artifacts' text is the
result once it completes. Cancelling a call cancels its open task on the agent.

A2A has no field naming the skill a message is for, so the message's metadata carries it
as ``skill_id``; an agent that ignores it reads the message alone.

A task is kept as its call's handle, so a node that takes the session over follows it
(``resume``); one that works past ``sync_budget`` turns a sync call async; one that asks for
input is the call's result (its question and task id), and the model's next call with
``task_id`` answers into the same task.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import httpx
import structlog
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    AgentCard,
    AgentSkill,
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
)
from a2a.utils.errors import A2AError

from gateway.core.tool import ToolDef, check_tool, default_display_name
from gateway.errors import ConfigError, ToolError
from gateway.tools.a2a.reply import INPUT_REQUIRED, TaskFollower, state_name
from gateway.tools.base import NOBODY, BackendKind, Caller, ReportProgress, tool_name
from gateway.tools.entry import (
    A2AAgentEntry,
    EntryBackend,
    check_options_known,
    expand_env,
    with_options,
)
from gateway.tools.python import Progress

__all__ = ["A2ATools"]

log = structlog.get_logger("gateway.tools")

_CARD_PATH = "/.well-known/agent-card.json"
_CANCEL_TIMEOUT = 3.0
"""Seconds a cancelled call gives the agent to take ``CancelTask``: best effort."""
_POLL_INTERVAL = 1.0
"""Seconds between ``GetTask`` polls of an agent that cannot stream."""
_MAX_ASKING = 10_000
"""Questions remembered for their answers (``A2ATools._asking``), the newest."""
_FIRST_RETRY_DELAY = 1.0
_MAX_RETRY_DELAY = 30.0


class A2ATools(EntryBackend):
    """The skills of one remote A2A agent, as a ``gateway.tools.base.ToolBackend``.

    Each skill is a tool named after its id (``tool_name``), taking ``{"message": str}``.
    The result is the text of the agent's reply message, or of the completed task's
    artifacts (joined by newlines).

    Raises:
        ConfigError: a header names an environment variable that is not set.
    """

    kind: BackendKind = "a2a"

    def __init__(self, entry: A2AAgentEntry) -> None:
        super().__init__(entry)
        self._entry = entry
        self._headers = {
            key: expand_env(value, f"a2a:{entry.name}: headers.{key}")
            for key, value in entry.headers.items()
        }
        self._definitions: tuple[ToolDef, ...] = ()
        self._skills: dict[str, str] = {}
        """The card's skill id of each tool, by ours."""
        self._listeners: list[Callable[[], None]] = []
        self._http: httpx.AsyncClient | None = None
        self._client: Client | None = None
        self._streaming = False
        self._retry: asyncio.Task[None] | None = None
        self._closing = False
        self._asking: OrderedDict[tuple[str, str], str] = OrderedDict()
        """The task waiting for the user's answer, by session and tool (newest last): the
        session's next call of that tool answers it, even without its ``task_id``."""
        """``aclose`` was called: the gateway stops, and leaves remote tasks running."""

    async def start(self) -> None:
        """Fetch the card and make a tool of each selected skill, within ``connect_timeout``.

        An optional agent whose card cannot be fetched is tried again in the background;
        the change listeners are called once it answers.

        Raises:
            ConfigError: the card cannot be fetched (naming its URL and why), or its skills
                do not match the agent file.
        """
        try:
            await self._connect()
        except ConfigError as exc:
            if self.optional and self._retry is None:
                self._retry = asyncio.create_task(self._keep_trying(str(exc)), name=self.name)
            raise

    def definitions(self) -> Sequence[ToolDef]:
        return self._definitions

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    async def call(
        self,
        name: str,
        args: dict[str, Any],
        progress: ReportProgress,
        caller: Caller = NOBODY,  # not sent: the agent file's headers speak for the gateway
    ) -> Any:
        """Send ``args["message"]`` to the skill and follow the reply; see
        ``ToolBackend.call``. The message answers a task's question, into that task: the
        one ``args["task_id"]`` names, else the one that asked this session's last call of
        the tool (a model that leaves the id out still answers the question it relayed).

        A task is kept as the call's handle (``Progress.keep``); one that still works
        after ``sync_budget`` turns a sync call async (``Progress.defer``). Cancelling the
        awaiting task sends ``CancelTask`` for an open task (best effort, within a few
        seconds), then goes on cancelling.

        Returns:
            The reply's text, or the completed task's; for a task that asks for input,
            ``{"status": "input_required", "question", "task_id", "note"}``.

        Raises:
            ToolError: the task failed, was rejected or cancelled, needs authentication,
                the reply is malformed, or the agent cannot be reached.
        """
        skill, client = self._route(name)
        message = Message(
            role=Role.ROLE_USER,
            message_id=uuid.uuid4().hex,
            parts=[Part(text=str(args.get("message", "")))],
            metadata={"skill_id": skill},
        )
        asking = self._asking.pop((caller.session_id, name), None) if caller.session_id else None
        if task_id := args.get("task_id") or asking:
            message.task_id = str(task_id)
        follower = TaskFollower(progress)
        bound = log.bind(backend=self.name, skill=skill)
        # An agent that cannot stream answers at once with its task, which is then polled:
        # a blocking send would hide the task (its handle, its progress) until it ended.
        request = SendMessageRequest(
            message=message,
            configuration=SendMessageConfiguration(return_immediately=not self._streaming),
        )
        with self._budget(follower, progress):
            result = await self._follow(
                client, follower, client.send_message(request), bound, more=not self._streaming
            )
        return self._remember_question(caller, name, result)

    async def resume(
        self,
        name: str,
        handle: dict[str, Any],
        progress: ReportProgress,
        caller: Caller = NOBODY,
    ) -> Any:
        """Follow the task a call started on another gateway node (its handle names it)
        to its result, as ``call`` would have: where it stands now (``GetTask``), then
        its events (``SubscribeToTask``, or ``GetTask`` polls for an agent that cannot
        stream). See ``gateway.tools.base.Resumable``.

        Raises:
            ToolError: as ``call``; or the handle names no task the agent knows.
        """
        skill, client = self._route(name)
        task_id = handle.get("task_id")
        if not isinstance(task_id, str) or not task_id:
            raise ToolError(f"{self.name}: the call kept no remote task to re-attach to")
        follower = TaskFollower(progress)
        bound = log.bind(backend=self.name, skill=skill, task_id=task_id)
        bound.info("a2a_task_reattached")
        with self._budget(follower, progress):
            result = await self._follow(
                client, follower, self._where_it_stands(client, task_id), bound, more=True
            )
        return self._remember_question(caller, name, result)

    def _remember_question(self, caller: Caller, name: str, result: Any) -> Any:
        """``result``; a task's question is remembered for the session's next call of the
        tool, which answers it (the newest ``_MAX_ASKING`` are kept)."""
        if _asks(result) and caller.session_id is not None:
            self._asking[(caller.session_id, name)] = str(result["task_id"])
            while len(self._asking) > _MAX_ASKING:
                self._asking.popitem(last=False)
        return result

    async def _where_it_stands(self, client: Client, task_id: str) -> AsyncIterator[StreamResponse]:
        """The task as it is now, then (an open one) its events as they come."""
        yield StreamResponse(task=await client.get_task(GetTaskRequest(id=task_id)))
        if not self._streaming:
            return  # ``_follow`` polls
        try:
            async for event in client.subscribe(SubscribeToTaskRequest(id=task_id)):
                yield event
        except A2AError:
            # It ended between the two requests (an ended task has no stream): as it is now.
            yield StreamResponse(task=await client.get_task(GetTaskRequest(id=task_id)))

    def _route(self, name: str) -> tuple[str, Client]:
        skill = self._skills.get(name)
        client = self._client
        if skill is None or client is None:
            raise ToolError(f"{self.name} offers no tool {name!r}")
        return skill, client

    @contextlib.contextmanager
    def _budget(self, follower: TaskFollower, progress: ReportProgress) -> Iterator[None]:
        """While the call is followed: a task still open ``sync_budget`` seconds from now
        turns the call async (a no-op for an async call, or outside a session)."""
        if not isinstance(progress, Progress):
            yield
            return
        loop = asyncio.get_running_loop()

        def past_budget() -> None:
            if follower.open:
                progress.defer()

        timer = loop.call_later(self._entry.sync_budget, past_budget)
        try:
            yield
        finally:
            timer.cancel()

    async def _follow(
        self,
        client: Client,
        follower: TaskFollower,
        events: AsyncIterator[StreamResponse],
        bound: Any,
        *,
        more: bool,
    ) -> Any:
        """Feed ``events`` to ``follower`` until the call has its result; with ``more``,
        poll a task still open when they end (``GetTask``). Errors of the agent or the
        connection become ``ToolError``; a cancellation cancels the remote task."""
        try:
            async for event in events:
                done, result = self._feed(follower, event, bound)
                if done:
                    return result
            if follower.open and more:
                return await self._poll(client, follower, bound)
            raise ToolError(
                "the remote agent's reply ended before its task did"
                f" (state: {state_name(follower.state)})"
            )
        except asyncio.CancelledError:
            # Not when the gateway stops: a node taking the session over follows the task.
            if follower.open and follower.task_id is not None and not self._closing:
                await self._cancel_remote(client, follower.task_id, bound)
            raise
        except (A2AError, httpx.HTTPError, ValueError) as exc:
            raise ToolError(f"the remote agent {self._entry.url}: {_cause(exc)}") from exc

    async def aclose(self) -> None:
        """Stop retrying, and close the HTTP client (its pooled connections). Calls still
        followed then leave their remote tasks running."""
        self._closing = True
        if self._retry is not None:
            self._retry.cancel()
            await asyncio.gather(self._retry, return_exceptions=True)
            self._retry = None
        await self._close_client()

    def _feed(self, follower: TaskFollower, event: StreamResponse, bound: Any) -> tuple[bool, Any]:
        """One event of the reply; logged with the remote task's id once there is one,
        which is kept as the call's handle."""
        seen = follower.task_id
        try:
            return follower.feed(event)
        finally:
            if follower.task_id is not None and follower.task_id != seen:
                bound.info("a2a_task_started", task_id=follower.task_id)
                if isinstance(follower.progress, Progress):
                    follower.progress.keep({"task_id": follower.task_id})
            if follower.task_id is not None:
                bound.debug(
                    "a2a_task_event", task_id=follower.task_id, state=state_name(follower.state)
                )

    async def _poll(self, client: Client, follower: TaskFollower, bound: Any) -> Any:
        """Follow a task with ``GetTask`` until it ends: for an agent that cannot stream
        (whose send answered at once), or a stream that ended before its task did."""
        assert follower.task_id is not None
        while True:
            await asyncio.sleep(_POLL_INTERVAL)
            task = await client.get_task(GetTaskRequest(id=follower.task_id))
            done, result = self._feed(follower, StreamResponse(task=task), bound)
            if done:
                return result

    async def _cancel_remote(self, client: Client, task_id: str, bound: Any) -> None:
        """Tell the agent to stop the task; its answer (or silence) does not matter."""
        try:
            async with asyncio.timeout(_CANCEL_TIMEOUT):
                await client.cancel_task(CancelTaskRequest(id=task_id))
            bound.info("a2a_task_cancelled", task_id=task_id)
        except (TimeoutError, A2AError, httpx.HTTPError) as exc:
            bound.warning("a2a_task_cancel_failed", task_id=task_id, error=_cause(exc))

    async def _connect(self) -> None:
        """Fetch the card, make the tools, make the client."""
        http = httpx.AsyncClient(
            headers=self._headers,
            # No read timeout: a task may work long in silence, and the gateway times calls
            # out itself.
            timeout=httpx.Timeout(30.0, connect=self._entry.connect_timeout, read=None),
            follow_redirects=True,
        )
        try:
            card = await self._fetch_card(http)
            definitions, skills = self._tools(card)
            config = ClientConfig(httpx_client=http, streaming=True)
            try:
                client = ClientFactory(config).create(card)
            except ValueError as exc:  # no transport both sides speak
                raise ConfigError(f"agent card {self._card_url()}: {exc}") from exc
        except BaseException:
            await http.aclose()
            raise
        await self._close_client()
        self._http, self._client = http, client
        self._streaming = card.capabilities.streaming
        self._definitions, self._skills = definitions, skills
        log.info("a2a_agent_loaded", backend=self.name, skills=list(skills.values()))

    async def _close_client(self) -> None:
        """Close the HTTP client of an earlier start, if any."""
        self._client = None
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()

    def _card_url(self) -> str:
        url = self._entry.url.rstrip("/")
        return url if url.endswith(".json") else url + _CARD_PATH

    async def _fetch_card(self, http: httpx.AsyncClient) -> AgentCard:
        url = self._card_url()
        resolver = A2ACardResolver(http, url, agent_card_path="")
        try:
            async with asyncio.timeout(self._entry.connect_timeout):
                return await resolver.get_agent_card()
        except TimeoutError as exc:
            raise ConfigError(
                f"agent card {url}: no answer within {self._entry.connect_timeout:g} s"
            ) from exc
        except A2AError as exc:
            raise ConfigError(f"agent card {url}: {_cause(exc)}") from exc

    def _tools(self, card: AgentCard) -> tuple[tuple[ToolDef, ...], dict[str, str]]:
        """The selected skills as tools, and each one's skill id by tool name.

        Raises:
            ConfigError: ``skills`` names one the card lacks, two skills get the same tool
                name, a tool is unusable, or ``tool_options`` names a tool not offered.
        """
        offered = {skill.id: skill for skill in card.skills}
        wanted = list(offered) if self._entry.skills is None else self._entry.skills
        if missing := [s for s in wanted if s not in offered]:
            raise ConfigError(
                f"skills names {', '.join(map(repr, missing))}, which the agent card does not"
                f" list (it lists: {', '.join(offered) or 'nothing'})"
            )
        definitions: list[ToolDef] = []
        skills: dict[str, str] = {}
        for skill_id in wanted:
            definition = self._definition(offered[skill_id], card)
            if definition.name in skills:
                raise ConfigError(
                    f"skills {skills[definition.name]!r} and {skill_id!r} would both be tool"
                    f" {definition.name!r}"
                )
            skills[definition.name] = skill_id
            definitions.append(definition)
        check_options_known(self.name, self._entry.tool_options, list(skills))
        return tuple(definitions), skills

    def _definition(self, skill: AgentSkill, card: AgentCard) -> ToolDef:
        name = tool_name(skill.id)
        examples = "; ".join(e.strip() for e in skill.examples if e.strip())
        texts = [
            t
            for t in (
                skill.name.strip(),
                skill.description.strip(),
                f"Examples: {examples}" if examples else "",
            )
            if t
        ]
        agent = card.name or self._entry.name
        definition = ToolDef(
            name=name,
            description="\n\n".join(texts) or f"The {skill.id!r} skill of the agent {agent!r}.",
            kind="server",
            input_schema={
                "type": "object",
                "properties": {
                    "message": {
                        "type": "string",
                        "description": f"What to ask the remote agent {agent!r}, in plain words.",
                    },
                    "task_id": {
                        "type": "string",
                        "description": "Only to answer a question of the agent: the task_id of"
                        " the result that asked it (status input_required). Leave out"
                        " otherwise.",
                    },
                },
                "required": ["message"],
                "additionalProperties": False,
            },
            display_name=skill.name.strip() or default_display_name(name),
            timeout=self._entry.timeout,
        )
        definition = with_options(definition, self._entry.tool_options.get(name))
        check_tool(definition)
        return definition

    async def _keep_trying(self, error: str) -> None:
        """An optional agent: fetch its card again, with backoff, until it answers."""
        delay = _FIRST_RETRY_DELAY
        while True:
            log.warning("a2a_agent_unavailable", backend=self.name, error=error, retry_in=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_RETRY_DELAY)
            try:
                await self._connect()
            except ConfigError as exc:
                error = str(exc)
                continue
            for listener in self._listeners:
                listener()
            return


def _asks(result: Any) -> bool:
    """Whether a call's result is a remote task's question (``input_required``)."""
    return isinstance(result, dict) and result.get("status") == INPUT_REQUIRED


def _cause(exc: BaseException) -> str:
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return str(message)
