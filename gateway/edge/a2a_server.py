"""The gateway's agent served over A2A (protocol 1.0), on the official ``a2a-sdk``.

Two routes (``a2a_routes``), mounted only when A2A is on (``--a2a``, or ``a2a = true`` in
the agent file), so that the SDK's server modules load only then:

- ``GET /.well-known/agent-card.json``: the agent card (``gateway.edge.a2a_card``), public.
- ``POST /a2a``: the SDK's JSON-RPC endpoint. Every call needs the gateway's credential
  (``Authorization: Bearer <API key>``, or a client token) when its auth is on: else HTTP
  401. The call runs for that credential's principal: its sessions count against its
  quotas, their model steps against its usage limits, as a WebSocket session's do. The
  request body is bounded by ``max_body_size``; a larger one gets the SDK's JSON-RPC
  error (``Payload too large``), as a malformed one does.

``SendMessage`` and ``SendStreamingMessage`` are one task each, run by ``GatewayExecutor``
as one turn of the context's gateway session (``gateway.edge.a2a_session``): the answer's
text is the task's ``answer`` artifact (appended delta by delta when streaming, whole at
the end otherwise), each step of a server tool a ``WORKING`` status with a short message,
and the task ends ``COMPLETED``, ``FAILED`` (with the reason), or ``CANCELED``
(``CancelTask`` cancels the running response). ``GetTask`` and the rest are the SDK's, on
its in-memory task store, scoped to the principal.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import structlog
from a2a.auth.user import User
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import DefaultServerCallContextBuilder, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import Message, Part, Task, TaskState, TaskStatus
from prometheus_client import Counter
from starlette.exceptions import HTTPException
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
from gateway.shell.runtime import Runtime

__all__ = ["CARD_PATH", "MAX_TASKS", "BoundedTaskStore", "GatewayExecutor", "a2a_routes"]

log = structlog.get_logger("gateway.a2a")

CARD_PATH = "/.well-known/agent-card.json"
_PRINCIPAL = "gateway.principal"
"""The ASGI scope key the authenticated caller goes under, for the SDK's call context."""
MAX_TASKS = 10_000
"""Tasks this node keeps for ``GetTask`` and ``ListTasks``, the newest (a few KB each)."""
_ENDED = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)
_ANSWER = "answer"
"""The artifact id of a task's answer (ids need only be unique within their task)."""


def a2a_routes(runtime: Runtime) -> list[BaseRoute]:
    """The agent card and the JSON-RPC endpoint, for ``create_app``."""
    config = runtime.config
    tasks = Counter(
        "gateway_a2a_tasks",
        "A2A tasks ended, by final state.",
        ["state"],
        registry=runtime.metrics.registry,
    )
    executor = GatewayExecutor(runtime, Conversations(runtime), lambda s: tasks.labels(s).inc())
    handler = DefaultRequestHandler(
        agent_executor=executor,
        task_store=BoundedTaskStore(MAX_TASKS),
        # What the handler reads of it is the capabilities (streaming); the card served
        # is made for each request.
        agent_card=agent_card(
            runtime.agent, config.public_url or "http://localhost", auth_required=False
        ),
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
        receive = _bounded(request, config.max_body_size)
        return await endpoint(Request(request.scope, receive))

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


def _bounded(request: Request, max_size: int | None) -> Receive:
    """The request's ``receive``, raising HTTP 413 once the body passes ``max_size``
    (at once for a declared ``Content-Length`` over it): the SDK answers that with its
    JSON-RPC error, ``Payload too large``."""
    receive = request.receive
    if max_size is None:
        return receive
    declared = request.headers.get("content-length", "")
    size = int(declared) if declared.isdigit() else 0

    async def bounded() -> AsgiMessage:
        nonlocal size
        if size > max_size:
            raise HTTPException(413)
        message = await receive()
        if message["type"] == "http.request" and not declared:
            size += len(message.get("body", b""))
            if size > max_size:
                raise HTTPException(413)
        return message

    return bounded


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
            conversation = self._conversations.get(context_id, principal)
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
    """Tell the task's caller what the turn says, until it ends; its ``End``."""
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
                case End(state=state, reason=reason):
                    if answer:
                        await updater.add_artifact(
                            [Part(text="".join(answer))], artifact_id=_ANSWER, name=_ANSWER
                        )
                    if state == "completed":
                        await updater.complete()
                    elif state == "failed":
                        await updater.failed(_said(updater, reason))
                    else:
                        await updater.cancel(_said(updater, reason))
                    return output


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
