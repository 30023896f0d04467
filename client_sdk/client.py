"""The Python client SDK: one conversation over one resilient socket.

```python
async with connect("ws://127.0.0.1:8000/v1/realtime") as conv:
    @conv.client_function("get_battery_level")
    async def battery() -> dict:
        return {"level": 0.82, "charging": False}

    async for delta in conv.say("what's my battery level?"):
        print(delta, end="", flush=True)
```

Client functions run when the gateway asks for them, concurrently, within the
call's deadline. A dropped socket is resumed with backoff and jitter; the app
sees no gap and no duplicate: events are checked by ``seq``, unconfirmed results
unanswered user messages and an unanswered ``session.update`` are sent again (the
gateway applies them once).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Literal

import msgspec
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.typing import Subprotocol

from client_sdk.events import EventStream
from client_sdk.exceptions import ClientError, ResumeGap, ServerError, SessionClosed
from client_sdk.functions import ClientFunction, make_function
from gateway.errors import CloseCode
from gateway.protocol import (
    SUBPROTOCOL,
    TOKEN_SUBPROTOCOL_PREFIX,
    Ack,
    ClientCall,
    ClientMsg,
    Error,
    Outbound,
    ResponseCancel,
    ResponseCreated,
    ResponseDone,
    SessionCreated,
    SessionResume,
    SessionResumed,
    SessionSnapshot,
    SessionStart,
    SessionUpdate,
    SessionUpdated,
    TextDelta,
    TextDone,
    ToolCalls,
    ToolResult,
    ToolResults,
    ToolStatus,
    UserMessage,
    decode_server,
    encode,
)

__all__ = ["Conversation", "TokenSource", "connect"]

F = Callable[..., Any]
TokenSource = str | Callable[[], Awaitable[str]]
"""A client token, or an async function that fetches a fresh one (from the app's backend,
which mints it with ``POST /v1/sessions``) before each connect and reconnect."""
MAX_FRAME_SIZE = 64 * 2**20
"""Largest event accepted: a snapshot holds the whole transcript, far over websockets' 1 MiB."""
RESUME_ANSWER_TIMEOUT = 10.0
"""Seconds a resume waits for the gateway's answer before it drops that socket and retries."""
MAX_RESULTS_PER_MESSAGE = 128
"""Results resent after a resume go in ``tool.results`` messages of at most this many (the
protocol's limit per message)."""
# Closes after which resuming makes no sense: the session is gone or not ours.
_FINAL = {
    CloseCode.NORMAL,
    CloseCode.POLICY,
    CloseCode.UNAUTHORIZED,
    CloseCode.FORBIDDEN_ORIGIN,
    CloseCode.UNKNOWN_SESSION,
    CloseCode.SESSION_EXPIRED,
    CloseCode.TAKEN_OVER,
}


def connect(url: str, **options: Any) -> Conversation:
    """A conversation with the gateway at ``url`` (use it with ``async with``).

    Options are those of ``Conversation``.
    """
    return Conversation(url, **options)


class Conversation:
    """One session with the gateway, across as many sockets as it takes.

    Args:
        url: the gateway's ``ws://`` or ``wss://`` URL of ``/v1/realtime``.
        token: a client token, or an async function returning a fresh one (called
            before every connect, so that a resume after the token expired works). Sent
            as the ``gateway.token.<token>`` subprotocol, out of URLs and access logs.
        api_key: an API key, for server-to-server clients (sent as
            ``Authorization: Bearer``); never put one in a browser or an app.
        agent: the agent to talk to (the gateway's default when ``None``).
        instructions: extra instructions for this session.
        metadata: anything the app wants the gateway to keep with the session.
        reconnect: resume after a dropped socket (default); ``False`` raises instead.
        max_reconnect_delay: the longest wait between reconnect attempts, in seconds.
        ack_every: acknowledge received events after this many, so the gateway can
            free them.
    """

    def __init__(
        self,
        url: str,
        *,
        token: TokenSource | None = None,
        api_key: str | None = None,
        agent: str | None = None,
        instructions: str | None = None,
        metadata: dict[str, Any] | None = None,
        reconnect: bool = True,
        max_reconnect_delay: float = 10.0,
        ack_every: int = 64,
    ) -> None:
        self._url = url
        self._token = token
        self._api_key = api_key
        self._start_msg = SessionStart(
            agent=agent, instructions=instructions, metadata=metadata or {}
        )
        self._reconnect = reconnect
        self._max_delay = max_reconnect_delay
        self._ack_every = ack_every
        self._functions: dict[str, ClientFunction] = {}
        self._ws: ClientConnection | None = None
        self._pending: ClientConnection | None = None
        """A socket resuming the session, until the gateway answers (``close()`` closes it)."""
        self._tasks: set[asyncio.Task[None]] = set()
        """Every task the conversation started: the loop holds only weak references."""
        self._subscribers: weakref.WeakSet[EventStream] = weakref.WeakSet()
        self._created: asyncio.Future[SessionCreated] | None = None
        self._closing = False
        self._end: ClientError | None = None
        self._running: dict[str, asyncio.Task[None]] = {}
        self._answered: set[str] = set()
        self._unconfirmed: dict[str, ToolResult] = {}
        self._unanswered: dict[str, UserMessage] = {}
        """User messages the gateway has not started a response for yet (resent on resume)."""
        self._update: SessionUpdate | None = None
        """The last ``session.update``, until ``session.updated`` answers it (resent on resume)."""
        self._since_ack = 0
        self.session: SessionCreated | None = None
        self.last_seq = 0
        self.reconnects = 0

    # ----------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Conversation:
        self._ws = await self._open_socket()
        self._spawn(self._read_loop(), "reader")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """End the session (a normal close tells the gateway the client is done).

        Pending ``say()`` and ``events()`` iterators raise ``SessionClosed`` (1000); every
        task the conversation started (client functions included) is cancelled. Closing
        while a resume is in progress drops that socket: the gateway ends the session
        when its resume window (``session_ttl``) runs out.
        """
        self._closing = True
        self._finish(SessionClosed(1000, "closed by the client"))
        # A socket still resuming is not the session's yet, and a gateway that does not
        # answer would not answer a close either: drop it.
        _drop(self._pending)
        if self._ws is not None:
            await self._ws.close()
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def start(self) -> SessionCreated:
        """Open the session (``say`` and ``events`` do it when needed)."""
        if self._created is None:
            self._created = asyncio.get_running_loop().create_future()
            specs = [f.spec for f in self._functions.values()]
            await self._send(msgspec.structs.replace(self._start_msg, client_functions=specs))
        return await self._created

    # ----------------------------------------------------------------- functions

    def client_function(self, name: str | None = None, **options: Any) -> Callable[[F], F]:
        """Register the decorated function as a client function (see ``add_client_function``)."""

        def register(func: F) -> F:
            self.add_client_function(func, name=name, **options)
            return func

        return register

    def add_client_function(self, func: F, *, name: str | None = None, **options: Any) -> None:
        """Let the model call ``func`` on this device.

        Options: ``description`` (default: the docstring), ``input_schema`` (default:
        from the type hints), ``output_schema``, ``timeout`` (seconds the gateway
        waits), ``display_name``. Sync or async; registering after the session
        started declares the functions again with ``session.update`` (sent again after
        a resume until the gateway answers it).
        """
        function = make_function(func, name=name, **options)
        self._functions[function.spec.name] = function
        if self._created is not None:
            self._update = SessionUpdate(
                id=f"upd_{secrets.token_urlsafe(9)}",
                client_functions=[f.spec for f in self._functions.values()],
            )
            self._spawn(self._send(self._update), "update")

    # ----------------------------------------------------------------- conversation

    async def say(self, text: str) -> AsyncIterator[str]:
        """Send a user message and yield the text of the response to it, as it streams.

        The text of consecutive model steps (before and after a tool call) is joined with
        a space, as a reader expects, unless one side already has one.

        Raises:
            ServerError: the gateway refused the message or the response failed.
            ResumeGap: events were lost across a reconnect.
            SessionClosed: the session ended.
        """
        await self.start()
        stream = self.events()
        try:
            msg_id = await self.post(text)
            response_id: str | None = None
            step_ended = False  # a text.done came: the next delta starts a new step
            last = ""  # the last character yielded
            async for event in stream:
                match event:
                    case ResponseCreated() if event.in_reply_to == msg_id:
                        response_id = event.response_id
                    case TextDelta(delta=delta) if event.response_id == response_id and delta:
                        if step_ended and last and not last.isspace() and not delta[0].isspace():
                            delta = " " + delta
                        step_ended = False
                        last = delta[-1]
                        yield delta
                    case TextDone() if event.response_id == response_id:
                        step_ended = True
                    case Error() if event.in_reply_to == msg_id or (
                        response_id is not None and event.response_id == response_id
                    ):
                        raise ServerError(event)
                    case SessionSnapshot():
                        raise ResumeGap(event)
                    case ResponseDone() if event.response_id == response_id:
                        return
        finally:
            await stream.aclose()

    async def post(self, text: str) -> str:
        """Send a user message without waiting for the reply; return its id.

        The reply arrives as events (``events()``); ``response.created`` names the
        message in ``in_reply_to``. A message not yet answered when the socket drops
        is sent again after the resume; the gateway counts it once.
        """
        await self.start()
        msg_id = f"msg_{secrets.token_urlsafe(9)}"
        msg = UserMessage(text=text, id=msg_id)
        self._unanswered[msg_id] = msg
        await self._send(msg)
        return msg_id

    def events(self) -> EventStream:
        """Every event of the session from this call on, in order, once each (an async
        iterator; events that arrive before the app reads it wait in it).

        Besides the session's events it yields ``session.resumed`` after a
        reconnect, the ``resume_gap`` error and ``session.snapshot`` after one that
        lost events, and ``response.retrying`` while the gateway retries a model request.

        Raises:
            SessionClosed: when the session ends.
        """
        if self._end is not None:
            raise self._end
        stream = EventStream()
        self._subscribers.add(stream)
        return stream

    async def cancel(self, response_id: str | None = None) -> None:
        """Stop the running response (barge-in). Sent only while connected: not resent."""
        await self._send(ResponseCancel(response_id=response_id))

    # ----------------------------------------------------------------- internals

    def _deliver(self, event: Outbound) -> None:
        for stream in self._subscribers:
            stream.put(event)

    async def _send(self, msg: ClientMsg) -> None:
        """Send if connected; a message lost to a drop is recovered on resume."""
        if self._end is not None:
            raise self._end
        if self._ws is not None:
            with contextlib.suppress(websockets.ConnectionClosed):
                await self._ws.send(encode(msg).decode())

    async def _read_loop(self) -> None:
        while True:
            assert self._ws is not None
            try:
                frame = await self._ws.recv()
            except websockets.ConnectionClosed as exc:
                if self._closing:
                    return
                code = exc.rcvd.code if exc.rcvd else 1006
                reason = exc.rcvd.reason if exc.rcvd else ""
                if code in _FINAL or not self._reconnect or self.session is None:
                    self._finish(SessionClosed(code, reason))
                    return
                if not await self._resume():
                    return
                continue
            try:
                event = decode_server(frame)
            except msgspec.ValidationError:
                continue  # an event type newer than this SDK
            self._on_event(event)

    def _on_event(self, event: Outbound) -> None:
        if event.seq:
            if event.seq <= self.last_seq:
                return  # already seen: never hand the app a duplicate
            self.last_seq = event.seq
            self._since_ack += 1
            if self._since_ack >= self._ack_every:
                self._since_ack = 0
                self._spawn(self._send(Ack(seq=self.last_seq)), "ack")
        match event:
            case SessionCreated():
                self.session = event
                if self._created is not None and not self._created.done():
                    self._created.set_result(event)
            case Error() if self.session is None and self._created is not None:
                if not self._created.done():
                    self._created.set_exception(ServerError(event))
            case ToolCalls(calls=calls):
                for call in calls:
                    self._run_call(call)
            case ToolStatus(call_id=call_id):
                self._unconfirmed.pop(call_id, None)
            case ResponseCreated(in_reply_to=in_reply_to) if in_reply_to:
                self._unanswered.pop(in_reply_to, None)
            case SessionUpdated(in_reply_to=in_reply_to) if in_reply_to:
                self._answer_update(in_reply_to)
            case Error(in_reply_to=in_reply_to) if in_reply_to:
                self._unanswered.pop(in_reply_to, None)
                self._answer_update(in_reply_to)
        self._deliver(event)

    def _answer_update(self, msg_id: str) -> None:
        if self._update is not None and self._update.id == msg_id:
            self._update = None

    def _run_call(self, call: ClientCall) -> None:
        if call.call_id in self._answered or call.call_id in self._running:
            return
        task = self._spawn(self._execute(call), f"call:{call.call_id}")
        self._running[call.call_id] = task
        task.add_done_callback(lambda _: self._running.pop(call.call_id, None))

    async def _execute(self, call: ClientCall) -> None:
        function = self._functions.get(call.tool)
        try:
            if function is None:
                raise LookupError(f"this client has no function {call.tool!r}")
            async with asyncio.timeout(max(0.0, call.timeout)):
                output = await function.invoke(call.args)
            result = ToolResult(call_id=call.call_id, tool=call.tool, output=output)
        except TimeoutError:
            result = ToolResult(
                call_id=call.call_id,
                tool=call.tool,
                error="the client function overran its deadline",
            )
        except Exception as exc:  # the handler's failure is the model's to hear about
            result = ToolResult(
                call_id=call.call_id, tool=call.tool, error=f"{type(exc).__name__}: {exc}"
            )
        self._answered.add(call.call_id)
        self._unconfirmed[call.call_id] = result
        await self._send(ToolResults(results=[result]))

    async def _resume(self) -> bool:
        """Reconnect with backoff and jitter; ``False`` when the session is lost."""
        delay = 0.05
        while not self._closing:
            outcome = await self._resume_once()
            if outcome != "retry":
                return outcome == "resumed"
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))  # jitter: no thundering herd
            delay = min(delay * 2, self._max_delay)
        return False

    async def _resume_once(self) -> Literal["resumed", "retry", "stop"]:
        """One attempt: open a socket, send ``session.resume``, wait for the answer."""
        websocket: ClientConnection | None = None
        try:
            websocket = self._pending = await self._open_socket()
            first, then = await self._resume_handshake(websocket)
        except websockets.ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd else 1006
            if self._closing:
                return "stop"
            if code in _FINAL:
                self._finish(SessionClosed(code, exc.rcvd.reason if exc.rcvd else ""))
                return "stop"
            return "retry"
        except (OSError, TimeoutError, websockets.InvalidHandshake, msgspec.DecodeError):
            _drop(websocket)  # the gateway is not reachable, or not answering, yet
            return "retry"
        except BaseException:
            _drop(websocket)  # cancelled (close()) mid-resume: never leave the socket open
            raise
        finally:
            self._pending = None
        self._ws = websocket
        self.reconnects += 1
        await self._after_resume(first, then)
        return "resumed"

    async def _resume_handshake(
        self, websocket: ClientConnection
    ) -> tuple[Outbound, Outbound | None]:
        """Send ``session.resume``; return the answer (and the snapshot after a gap)."""
        assert self.session is not None
        resume = SessionResume(
            session_id=self.session.session_id,
            resume_token=self.session.resume_token,
            last_seq=self.last_seq,
        )
        await websocket.send(encode(resume).decode())
        async with asyncio.timeout(RESUME_ANSWER_TIMEOUT):
            first = decode_server(await websocket.recv())
            if isinstance(first, Error) and first.code == "resume_gap":
                return first, decode_server(await websocket.recv())
            return first, None

    async def _after_resume(self, first: Outbound, then: Outbound | None) -> None:
        open_calls: list[ClientCall] = []
        if isinstance(then, SessionSnapshot):  # ``first`` is the resume_gap error
            self.last_seq = then.last_seq
            open_calls = then.open_calls
            self._deliver(first)
            self._deliver(then)  # pending say() iterators raise ResumeGap
        elif isinstance(first, SessionResumed):
            open_calls = first.open_calls
            self._deliver(first)
        else:  # not an answer to the resume: an event like any other
            for event in (first, then):
                if event is not None:
                    self._on_event(event)
        # What may have been lost on the way out goes again; the gateway applies it once.
        results = list(self._unconfirmed.values())
        for at in range(0, len(results), MAX_RESULTS_PER_MESSAGE):
            await self._send(ToolResults(results=results[at : at + MAX_RESULTS_PER_MESSAGE]))
        for msg in list(self._unanswered.values()):
            await self._send(msg)
        if self._update is not None:
            await self._send(self._update)
        for call in open_calls:
            self._run_call(call)

    def _finish(self, error: ClientError) -> None:
        """The conversation can go no further: tell everyone waiting (once)."""
        if self._end is not None:
            return
        self._end = error
        if self._created is not None and not self._created.done():
            self._created.set_exception(error)
            self._created.exception()  # retrieved: start() may never be awaited again
        for stream in self._subscribers:
            stream.end(error)

    async def _open_socket(self) -> ClientConnection:
        """A socket to the gateway, offering ``gateway.v1`` and the credential."""
        subprotocols = [Subprotocol(SUBPROTOCOL)]
        token = self._token if self._token is None or isinstance(self._token, str) else None
        if callable(self._token):
            try:
                token = await self._token()
            except Exception as exc:  # the app's fetch failed: like an unreachable gateway
                raise ConnectionError(f"could not get a client token: {exc}") from exc
        if token is not None:
            subprotocols.append(Subprotocol(TOKEN_SUBPROTOCOL_PREFIX + token))
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else None
        return await websockets.connect(
            self._url,
            subprotocols=subprotocols,
            additional_headers=headers,
            max_size=MAX_FRAME_SIZE,
        )

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run ``work`` in the background, holding it until it is done (see ``_reap``)."""
        task = asyncio.get_running_loop().create_task(work, name=f"client_sdk:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._reap)
        return task

    def _reap(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return  # close() (or the loop's shutdown) cancelled it: nothing to report
        error = task.exception()
        if error is not None and not isinstance(error, ClientError):
            # A bug, not the conversation's end (that reaches the app through _finish).
            task.get_loop().call_exception_handler(
                {"message": f"{task.get_name()} failed", "exception": error, "task": task}
            )


def _drop(websocket: ClientConnection | None) -> None:
    """Drop a socket that never became the session's: left open, its gateway node would
    keep the session attached to a socket nobody reads. Dropped, not closed: a normal
    close (1000) would end the session."""
    if websocket is not None:
        websocket.transport.abort()
