"""The gateway's agent served over A2A (protocol 1.0), on the official ``a2a-sdk``.

Two routes (``a2a_routes``), mounted only when A2A is on (``--a2a``, or ``a2a = true`` in
the agent file), so that the SDK's server modules load only then:

- ``GET /.well-known/agent-card.json``: the agent card (``gateway.edge.a2a_card``), public.
- ``POST /a2a``: the SDK's JSON-RPC endpoint. Every call needs the gateway's credential
  (``Authorization: Bearer <API key>``, or a client token) when its auth is on: else HTTP
  401. The call runs for that credential's principal: its sessions count against its
  quotas, their model steps against its usage limits, as a WebSocket session's do. The
  request body is bounded by ``max_body_size`` (a larger one gets the JSON-RPC error
  ``Payload too large``), and checked to be JSON (UTF-8, bounded nesting: else ``-32700``)
  before the SDK reads it. The SDK's log records of a caller's bad request are info.

``SendMessage`` and ``SendStreamingMessage`` are one task each, run by ``GatewayExecutor``
as one turn of the context's gateway session (``gateway.edge.a2a_session``): the answer's
text is the task's ``answer`` artifact (appended delta by delta when streaming, whole at
the end otherwise), each step of a server tool a ``WORKING`` status with a short message,
and the task ends ``COMPLETED``, ``FAILED`` (with the reason), or ``CANCELED``
(``CancelTask`` cancels the running response). ``GetTask`` and the rest are the SDK's,
on its task store, scoped to the principal: this node's newest tasks in memory
(``BoundedTaskStore``) and, when the gateway's store is shared (Redis), every task in it
too (``SharedTaskStore``), so that any node answers ``GetTask`` for a task another ran.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable
from urllib.parse import quote

import msgspec
import structlog
from a2a.auth.user import User
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import Event, EventQueue
from a2a.server.owner_resolver import resolve_user_scope
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import DefaultServerCallContextBuilder, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCard,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    SubscribeToTaskRequest,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.errors import InternalError, TaskNotCancelableError, UnsupportedOperationError
from prometheus_client import Counter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Message as AsgiMessage
from starlette.types import Receive

from gateway.auth.credentials import AuthError
from gateway.core.principal import Principal
from gateway.edge.a2a_card import (
    A2A_PATH,
    AGENT_SKILL_ID,
    agent_card,
    client_functions,
    served_tools,
)
from gateway.edge.a2a_session import NO_APP, Conversation, Conversations, Refused
from gateway.edge.a2a_turn import End, Output, Status, Text
from gateway.edge.body import BodyTooLarge, read_body
from gateway.errors import StoreUnavailable
from gateway.shell.runtime import Runtime
from gateway.store import Store

__all__ = [
    "CARD_PATH",
    "MAX_TASKS",
    "SHARED_TASK_TTL",
    "BoundedTaskStore",
    "GatewayExecutor",
    "SharedTaskStore",
    "a2a_routes",
]

log = structlog.get_logger("gateway.a2a")

CARD_PATH = "/.well-known/agent-card.json"
_PRINCIPAL = "gateway.principal"
"""The ASGI scope key the authenticated caller goes under, for the SDK's call context."""
MAX_TASKS = 10_000
"""Tasks this node keeps for ``GetTask`` and ``ListTasks``, the newest (a few KB each)."""
_ELSEWHERE = (
    "the task runs on another gateway node (or ran on one that stopped): {what} must"
    " reach the node running it"
)
SHARED_TASK_TTL = 3600.0
"""Seconds a task stays in a shared store after its last change, for ``GetTask`` on any
node (this node's own newest stay longer, in its memory)."""
_ENDED = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)
_PARSE_ERROR = -32700
_INVALID_REQUEST = -32600
_INTERNAL_ERROR = -32603
"""JSON-RPC's error codes the endpoint gives itself, or tells apart in the SDK's logs."""
_SDK_LOGGER = "a2a.server.routes.jsonrpc_dispatcher"
_ANSWER = "answer"
"""The artifact id of a task's answer (ids need only be unique within their task)."""


def a2a_routes(runtime: Runtime) -> list[BaseRoute]:
    """The agent card and the JSON-RPC endpoint, for ``create_app``."""
    config = runtime.config
    sdk_log = logging.getLogger(_SDK_LOGGER)
    if _CLIENT_FAULTS not in sdk_log.filters:
        sdk_log.addFilter(_CLIENT_FAULTS)
    tasks = Counter(
        "gateway_a2a_tasks",
        "A2A tasks ended, by final state.",
        ["state"],
        registry=runtime.metrics.registry,
    )
    local = BoundedTaskStore(MAX_TASKS)
    # One node alone has every task in memory; nodes sharing Redis share their tasks.
    task_store = SharedTaskStore(local, runtime.store) if runtime.durable else local
    executor = GatewayExecutor(runtime, Conversations(runtime), lambda s: tasks.labels(s).inc())
    handler = _Handler(
        executor,
        task_store,
        # What the handler reads of it is the capabilities (streaming); the card served
        # is made for each request.
        agent_card(runtime.agent, config.public_url or "http://localhost", auth_required=False),
        shared=task_store if isinstance(task_store, SharedTaskStore) else None,
    )
    (rpc,) = create_jsonrpc_routes(handler, rpc_url=A2A_PATH, context_builder=_CallerContext())
    assert isinstance(rpc, Route)
    endpoint: Callable[[Request], Awaitable[Response]] = rpc.endpoint

    async def card(request: Request) -> Response:
        base = (config.public_url or str(request.base_url)).rstrip("/")
        auth_required = not runtime.auth.no_auth
        return JSONResponse(
            agent_card_to_dict(agent_card(runtime.agent, base, auth_required=auth_required))
        )

    async def json_rpc(request: Request) -> Response:
        try:
            principal = runtime.auth.bearer(
                request.headers.get("authorization"),
                origin=request.headers.get("origin"),
                now=time.time(),
            )
        except AuthError as exc:
            log.info("request_refused", label=exc.label, path=A2A_PATH)
            return JSONResponse(
                {"error": exc.reason, "code": exc.code},
                status_code=401,
                headers={"www-authenticate": "Bearer"},
            )
        request.scope[_PRINCIPAL] = principal
        try:
            body = await read_body(request, config.max_body_size)
        except BodyTooLarge as exc:  # the rest is not read: the connection closes
            return _rpc_error(_INVALID_REQUEST, f"Payload too large: {exc}", close=True)
        try:
            # Checked here, as the WebSocket's frames are: UTF-8 and nesting (the SDK's
            # json.loads would answer them as internal errors, each logged with a traceback).
            msgspec.json.decode(body)
        except msgspec.DecodeError as exc:
            return _rpc_error(_PARSE_ERROR, f"Parse error: {exc}")
        except RecursionError:
            return _rpc_error(_PARSE_ERROR, "Parse error: nested too deep")
        return await endpoint(Request(request.scope, _replay(body)))

    return [
        Route(CARD_PATH, card, methods=["GET"]),
        Route(A2A_PATH, json_rpc, methods=["POST"]),
    ]


class BoundedTaskStore(InMemoryTaskStore):
    """The SDK's in-memory task store, keeping the ``max_tasks`` newest tasks: past that,
    the oldest that has ended goes (``GetTask`` then finds it no more). A task still
    running is never dropped."""

    def __init__(self, max_tasks: int) -> None:
        super().__init__()
        self._max_tasks = max_tasks
        self._saved: OrderedDict[str, ServerCallContext] = OrderedDict()
        """Every task kept, oldest first, with the call context it was saved in (whose
        owner it is)."""

    async def save(self, task: Task, context: ServerCallContext) -> None:
        await super().save(task, context)
        self._saved.setdefault(task.id, context)
        for _ in range(len(self._saved) - self._max_tasks):
            oldest, owner = next(iter(self._saved.items()))
            kept = await super().get(oldest, owner)
            if kept is not None and kept.status.state not in _ENDED:
                self._saved.move_to_end(oldest)  # still running: the next oldest goes
                continue
            del self._saved[oldest]
            await super().delete(oldest, owner)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        await super().delete(task_id, context)
        self._saved.pop(task_id, None)


class SharedTaskStore(TaskStore):
    """This node's tasks (``local``) and every node's, in the gateway's shared ``store``.

    Each task is saved in ``local`` as the SDK's store does, and in ``store`` as a named
    value, ``a2a:task:<owner>:<task_id>`` (the owner scopes it, as the SDK's in-memory
    store does: another caller finds nothing), the ``Task`` protobuf, for ``ttl`` seconds.
    Not at every event: a task streamed is saved at each of its chunks, and the shared copy
    is written when its state changes (submitted, working, and how it ended, with its whole
    artifact), so another node sees a running task's state but not its answer so far.

    ``get`` asks ``local`` first (what ran here, the freshest), then ``store``. ``list``
    and ``delete`` are ``local``'s: ``ListTasks`` lists this node's tasks; a task deleted
    here stays in ``store`` until its TTL runs out. A store that does not answer: a save
    is logged (the task goes on, known here only), a ``get`` is an internal error.
    """

    def __init__(self, local: BoundedTaskStore, store: Store, *, ttl: float = SHARED_TASK_TTL):
        self._local = local
        self._store = store
        self._ttl = ttl
        self._shared_states: OrderedDict[str, TaskState] = OrderedDict()
        """The state each running task was last written to ``store`` in (ended ones go)."""

    async def save(self, task: Task, context: ServerCallContext) -> None:
        state = task.status.state
        if state == TaskState.TASK_STATE_CANCELED and not await self._here(task.id, context):
            # The SDK's CancelTask of a task that is not running here only writes CANCELED
            # (for its node to notice, which a gateway node does not): refused instead,
            # as the task would go on.
            raise TaskNotCancelableError(message=_ELSEWHERE.format(what="CancelTask"))
        await self._local.save(task, context)
        if self._shared_states.get(task.id) == state and state not in _ENDED:
            return
        try:
            await self._store.put_named(
                _task_name(task.id, context), task.SerializeToString(), ttl=self._ttl
            )
        except StoreUnavailable as exc:
            self._shared_states.pop(task.id, None)  # the next save tries again
            log.warning("a2a_task_unshared", a2a_task=task.id, error=str(exc))
            return
        if state in _ENDED:
            self._shared_states.pop(task.id, None)
            return
        self._shared_states[task.id] = state
        self._shared_states.move_to_end(task.id)
        if len(self._shared_states) > MAX_TASKS:  # tasks that never ended (their node died)
            self._shared_states.popitem(last=False)

    async def _here(self, task_id: str, context: ServerCallContext) -> bool:
        """Whether the task ran on this node (among its newest)."""
        return await self._local.get(task_id, context) is not None

    async def running_elsewhere(self, task_id: str, context: ServerCallContext) -> bool:
        """Whether the task has not ended and is not this node's: another node runs it
        (or ran it, and stopped before it ended)."""
        if await self._here(task_id, context):
            return False
        task = await self.get(task_id, context)
        return task is not None and task.status.state not in _ENDED

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        here = await self._local.get(task_id, context)
        if here is not None:
            return here
        try:
            data = await self._store.get_named(_task_name(task_id, context))
        except StoreUnavailable as exc:
            raise InternalError(message=f"the task cannot be read now: {exc}") from exc
        return None if data is None else Task.FromString(data)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        return await self._local.list(params, context)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        await self._local.delete(task_id, context)


class _Handler(DefaultRequestHandler):
    """The SDK's request handler, refusing ``SubscribeToTask`` of a task another node
    runs (with ``shared``): this node has none of its events, and the SDK would send the
    task as stored, then wait for events that never come."""

    def __init__(
        self,
        executor: AgentExecutor,
        tasks: TaskStore,
        card: AgentCard,
        *,
        shared: SharedTaskStore | None,
    ) -> None:
        super().__init__(agent_executor=executor, task_store=tasks, agent_card=card)
        self._shared = shared

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        if self._shared is not None and await self._shared.running_elsewhere(params.id, context):
            raise UnsupportedOperationError(message=_ELSEWHERE.format(what="SubscribeToTask"))
        async for event in super().on_subscribe_to_task(params, context):
            yield event


def _task_name(task_id: str, context: ServerCallContext) -> str:
    """The store's name of a caller's task: the owner quoted, so no ``:`` in it blurs
    where it ends."""
    return f"a2a:task:{quote(resolve_user_scope(context), safe='')}:{task_id}"


def _replay(body: bytes) -> Receive:
    """A ``receive`` giving ``body`` (read already) whole, for the SDK's endpoint."""
    sent = False

    async def receive() -> AsgiMessage:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _rpc_error(code: int, message: str, *, close: bool = False) -> JSONResponse:
    """A JSON-RPC error for a request the SDK never saw (its id unknown: ``null``)."""
    return JSONResponse(
        {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}},
        headers={"connection": "close"} if close else None,
    )


class _ClientFaults(logging.Filter):
    """The SDK logs a caller's bad request (bad params, an unknown method) at warning or
    error level, with a traceback: a peer could fill the logs with them. Those are info
    here, without the traceback; an internal error (``-32603``) stays an error."""

    _FAULTS = ("Failed to parse request params", "Failed to validate base JSON-RPC request")

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith("Request Error"):
            args = record.args if isinstance(record.args, tuple) else ()
            fault = len(args) > 1 and args[1] != _INTERNAL_ERROR
        else:
            fault = message.startswith(self._FAULTS)
        if fault:
            record.levelno, record.levelname, record.exc_info = logging.INFO, "INFO", None
        return True


_CLIENT_FAULTS = _ClientFaults()


class _Caller(User):
    """The principal a call's credential proves, as the SDK's user: its tasks are scoped
    by ``user_name``."""

    def __init__(self, principal: Principal) -> None:
        self.principal = principal

    @property
    def is_authenticated(self) -> bool:
        return self.principal.kind != "anonymous"

    @property
    def user_name(self) -> str:
        return self.principal.name


class _CallerContext(DefaultServerCallContextBuilder):
    """The SDK's call context (the headers it reads, such as ``A2A-Version``), with the
    caller as its user and, for the executor, its principal."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state["principal"] = request.scope[_PRINCIPAL]
        context.state["headers"].pop("authorization", None)  # the key stays out of it
        return context

    def build_user(self, request: Request) -> User:
        return _Caller(request.scope[_PRINCIPAL])


class GatewayExecutor(AgentExecutor):
    """Runs each A2A message as one turn of its context's gateway session.

    Args:
        runtime: the gateway's runtime (its agent answers).
        conversations: this node's A2A contexts.
        ended: told each task's final state (``completed``, ``failed``, ``canceled``,
            ``rejected``), for the metrics.
    """

    def __init__(
        self, runtime: Runtime, conversations: Conversations, ended: Callable[[str], None]
    ) -> None:
        self._runtime = runtime
        self._conversations = conversations
        self._ended = ended

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message = context.message
        assert message is not None
        assert context.task_id
        assert context.context_id
        task_id, context_id = context.task_id, context.context_id
        # The context only, for now: the session started below keeps what is bound.
        structlog.contextvars.bind_contextvars(a2a_context=context_id)
        await event_queue.enqueue_event(
            Task(
                id=task_id,
                context_id=context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                history=[message],
            )
        )
        updater = TaskUpdater(event_queue, task_id, context_id)
        principal: Principal = context.call_context.state["principal"]
        text = context.get_user_input()
        try:
            tool_choice = self._skill_tool(message)
            if not text.strip():
                raise Refused("send the message as text: this agent reads text parts only")
            conversation = await self._conversations.get(context_id, principal)
            await conversation.begin(task_id, text, tool_choice)
        except Refused as exc:
            log.info("a2a_task_rejected", reason=exc.reason)
            await updater.reject(_said(updater, exc.reason))
            self._ended("rejected")
            return
        structlog.contextvars.bind_contextvars(session_id=conversation.session_id, a2a_task=task_id)
        streaming = context.call_context.state.get("method") == "SendStreamingMessage"
        started = time.monotonic()
        try:
            end = await _follow(conversation, updater, streaming=streaming)
        finally:
            conversation.finish()
        # Saved before the caller hears the task ended: its next message may go to any node.
        await conversation.save()
        await _tell_end(updater, end)
        log.info(
            "a2a_task_finished",
            state=end.state,
            reason=end.reason or None,
            duration=round(time.monotonic() - started, 3),
        )
        self._ended(end.state)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """``CancelTask``: cancel the task's running response; the task ends ``CANCELED``
        (the SDK then cancels ``execute``, which lets the session go)."""
        assert context.task_id
        assert context.context_id
        conversation = self._conversations.running(context.context_id, context.task_id)
        if conversation is not None:
            conversation.cancel(context.task_id)
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel(_said(updater, "cancelled by the caller"))
        log.info("a2a_task_finished", state="canceled", a2a_task=context.task_id)
        self._ended("canceled")

    def _skill_tool(self, message: Message) -> str | None:
        """The tool a message's ``skill_id`` (metadata, as A2A has no field for it) asks
        for, which the model must call first; ``None`` for the agent as a whole.

        Raises:
            Refused: the skill is a client function, or the agent has no such skill.
        """
        if "skill_id" not in message.metadata:
            return None
        skill = message.metadata["skill_id"]
        if skill in ("", AGENT_SKILL_ID):
            return None
        agent = self._runtime.agent
        if skill in client_functions(agent):
            raise Refused(f"the skill {skill!r} {NO_APP}")
        if skill in {d.name for d in served_tools(agent)}:
            return str(skill)
        raise Refused(f"no skill {skill!r} here: the agent card lists the skills")


async def _follow(conversation: Conversation, updater: TaskUpdater, *, streaming: bool) -> End:
    """Tell the task's caller what the turn says, until it ends (its whole answer too, when
    not streaming); its ``End``, not told yet (``_tell_end``)."""
    answer: list[str] = []
    sent = False
    while True:
        outputs = [await conversation.next_output()]
        outputs += conversation.ready_outputs()
        for output in _joined(outputs):
            match output:
                case Text(delta=delta) if streaming:
                    await updater.add_artifact(
                        [Part(text=delta)], artifact_id=_ANSWER, name=_ANSWER, append=sent
                    )
                    sent = True
                case Text(delta=delta):
                    answer.append(delta)
                case Status(text=said):
                    await updater.start_work(_said(updater, said))
                case End():
                    if answer:
                        await updater.add_artifact(
                            [Part(text="".join(answer))], artifact_id=_ANSWER, name=_ANSWER
                        )
                    return output


async def _tell_end(updater: TaskUpdater, end: End) -> None:
    """The task's final state, with the reason it did not complete."""
    if end.state == "completed":
        await updater.complete()
    elif end.state == "failed":
        await updater.failed(_said(updater, end.reason))
    else:
        await updater.cancel(_said(updater, end.reason))


def _joined(outputs: list[Output]) -> list[Output]:
    """Consecutive texts as one: one artifact update per batch of deltas."""
    joined: list[Output] = []
    for output in outputs:
        last = joined[-1] if joined else None
        if isinstance(output, Text) and isinstance(last, Text):
            joined[-1] = Text(last.delta + output.delta)
        else:
            joined.append(output)
    return joined


def _said(updater: TaskUpdater, text: str) -> Message:
    return updater.new_agent_message([Part(text=text)])
