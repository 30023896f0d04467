"""The Python client SDK: one conversation over one resilient socket.

```python
import asyncio

from client_sdk import connect


async def main() -> None:
    async with connect("ws://127.0.0.1:8000/v1/realtime") as conv:

        @conv.client_function("get_battery_level")
        async def battery() -> dict:
            return {"level": 0.82, "charging": False}

        async for delta in conv.say("what's my battery level?"):
            print(delta, end="", flush=True)
        print()


asyncio.run(main())
```

Against the demo agent (``make run``) it prints:

```text
Your battery is at 82%.
```

Client functions run when the gateway asks for them, concurrently, within the
call's deadline. In manual tool mode (``tool_mode="manual"``) the server tools the model
calls come to the client too: ``on_server_tool`` answers them, or has the gateway run them
(the default). Calls of tools marked ``confirm`` wait for the user's approval:
``on_confirm`` asks the user (without a handler they are declined). A dropped socket is
resumed (resume.py) with backoff and jitter; the app sees no gap and no duplicate: events
are checked by ``seq``, and what the gateway had not confirmed (results, ``tool.run``
requests, ``tool.confirmation`` answers, user messages, ``session.update`` messages) is sent
again (the gateway applies each once).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Literal, TypeVar

import msgspec
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.protocol import State

from client_sdk.confirm import ConfirmHandler, ask, refused_edit
from client_sdk.connection import open_socket, resume_url
from client_sdk.events import AudioStream, EventStream
from client_sdk.exceptions import ClientError, ResumeGap, ServerError, SessionClosed
from client_sdk.framing import Protocol, audio_frame, message_frame, read_frame
from client_sdk.functions import ClientFunction, answer, make_function
from client_sdk.resume import (
    ATTEMPT_TIMEOUT,
    FINAL_CLOSES,
    GIVE_UP_AFTER,
    Outbox,
    Reconnector,
    Resumed,
    closed_with,
    drop,
    resume_of,
)
from client_sdk.server_tools import ServerToolHandler, decide
from client_sdk.tasks import Background
from client_sdk.widgets import WidgetHandler, ask_user
from gateway.errors import CloseCode
from gateway.wire.audio_frame import AnswerAudio
from gateway.wire.v1 import (
    PROTOCOL_VERSION,
    Ack,
    AgentTransferred,
    AudioRequest,
    ClientCall,
    ClientMsg,
    ConfirmItem,
    Error,
    InputAudioClear,
    InputAudioCommit,
    Outbound,
    ResponseCancel,
    ResponseCreated,
    ResponseDone,
    ResponseTruncate,
    SessionAttach,
    SessionAttached,
    SessionCreated,
    SessionGoingAway,
    SessionResume,
    SessionResumed,
    SessionSnapshot,
    SessionStart,
    SessionUpdate,
    TextDelta,
    TextDone,
    ToolCalls,
    ToolConfirm,
    ToolConfirmation,
    ToolResult,
    ToolResults,
    ToolRun,
    ToolStatus,
    UserMessage,
)

__all__ = ["Conversation", "TokenSource", "ToolMode", "connect"]

F = Callable[..., Any]
H = TypeVar("H", bound=ServerToolHandler)
C = TypeVar("C", bound=ConfirmHandler)
W = TypeVar("W", bound=WidgetHandler)
_CALL_ENDED = frozenset({"completed", "failed", "cancelled", "expired"})
MOVED = 4000
"""The close code this SDK leaves a socket with once it moved to the next one
(``session.going_away``): not 1000, which would end the session."""
ToolMode = Literal["auto", "manual"]
"""``auto``: the gateway runs its server tools; ``manual``: every tool call the model asks
for, server tools included, comes to the client (``on_server_tool``)."""
TokenSource = str | Callable[[], Awaitable[str]]
"""A client token, or an async function that fetches a fresh one (from the app's backend,
which mints it with ``POST /v1/sessions``) before each connect and reconnect."""


def connect(url: str, **options: Any) -> Conversation:
    """A conversation with the gateway at ``url`` (use it with ``async with``).

    Options are those of ``Conversation``.
    """
    return Conversation(url, **options)


class Conversation:
    """One session with the gateway, across as many sockets as it takes.

    Args:
        url: the gateway's ``ws://`` or ``wss://`` URL of ``/v1/realtime``. A socket that
            resumes the session adds ``session=<session_id>`` to its query (kept as it is
            otherwise), for load balancers that route by session; the gateway ignores it.
        token: a client token, or an async function returning a fresh one (called
            before every connect, so that a resume after the token expired works). Sent
            as the ``gateway.token.<token>`` subprotocol, out of URLs and access logs.
        api_key: an API key, for server-to-server clients (sent as
            ``Authorization: Bearer``); never put one in a browser or an app.
        agent: the agent to talk to (the gateway's default when ``None``).
        instructions: extra instructions for this session.
        metadata: anything the app wants the gateway to keep with the session.
        reconnect: resume after a dropped socket (default), and retry the first connect and
            a start whose socket dropped before ``session.created``; ``False`` raises instead.
        max_reconnect_delay: the longest wait between reconnect attempts, in seconds.
        attempt_timeout: seconds an attempt may take, from the dial to the gateway's answer
            to ``session.start`` or ``session.resume``; then its socket is dropped and the
            attempt counts as failed.
        give_up_after: seconds of failed attempts in a row after which the conversation
            ends with ``SessionClosed(1006, "could not reach the gateway for 120 s")``
            (default: the gateway's default ``session_ttl``, after which a resume cannot
            succeed anyway).
        ack_every: acknowledge received events after this many, so the gateway can
            free them.
        tool_choice: the session's default for which tools the model may call in a
            response: ``"auto"`` (its choice; the gateway's default), ``"none"``,
            ``"required"`` (at least one) or one tool's name. A forced choice holds for the
            first model step of a response; the steps after it are ``auto``.
        max_steps: the session's default for how many model steps a response may take
            (each tool round is one): 1 up to the gateway's limit
            (``session.limits.max_steps``, also its default).
        tool_mode: the session's default tool mode: ``"auto"`` (the gateway runs its server
            tools; the gateway's default) or ``"manual"`` (every tool call the model asks
            for, server tools included, comes to the client: see ``on_server_tool``).
        time_zone: the user's IANA time zone (``"Europe/Paris"``), for tools that tell
            the time (the gateway's ``get_current_time``); UTC when absent.
        segments: voice: the gateway also sends each answer's text as speakable
            ``TextSegment`` events (whole sentences or clauses, for a speech synthesizer).
        audio: voice on the socket (docs/voice.md): the user's audio in (``send_audio``),
            the answers spoken back (``audio``); an ``AudioRequest`` or its fields as a
            dict (``{"input_rate": 16000, "turn_detection": "server_vad"}``), ``{}`` for
            the defaults.
        protocol: ``"json"`` (v1's text frames) or ``"msgpack"``: v1 as binary MessagePack
            frames (``gateway.v1.msgpack``), smaller on metered links, audio as raw bytes;
            a gateway that does not speak it is spoken to in JSON.
        join: ``(session_id, resume_token)`` of a session another device started: this
            conversation joins it as one more device (``session.attach``) instead of
            starting one. Every device gets every event; a client function's calls go to
            the devices that registered it, and the first answer wins; the others' runs of
            it are stopped. Its options that only ``session.start`` carries are ignored.
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
        attempt_timeout: float = ATTEMPT_TIMEOUT,
        give_up_after: float = GIVE_UP_AFTER,
        ack_every: int = 64,
        tool_choice: str | None = None,
        max_steps: int | None = None,
        tool_mode: ToolMode | None = None,
        time_zone: str | None = None,
        segments: bool | None = None,
        audio: AudioRequest | dict[str, Any] | None = None,
        protocol: Protocol = "json",
        join: tuple[str, str] | None = None,
    ) -> None:
        self._url = url
        self._protocol: Protocol = protocol
        self._token = token
        self._api_key = api_key
        self._start_msg = SessionStart(
            agent=agent,
            instructions=instructions,
            metadata=metadata or {},
            tool_choice=tool_choice,
            max_steps=max_steps,
            tool_mode=tool_mode,
            time_zone=time_zone,
            segments=segments,
            audio=msgspec.convert(audio, AudioRequest) if isinstance(audio, dict) else audio,
        )
        self._reconnect = reconnect
        self._reconnector = Reconnector(
            self._open_socket,
            max_reconnect_delay,
            attempt_timeout=attempt_timeout,
            give_up_after=give_up_after,
        )
        self._ack_every = ack_every
        self._functions: dict[str, ClientFunction] = {}
        self._server_tool_handler: ServerToolHandler | None = None
        self._confirm_handler: ConfirmHandler | None = None
        self._widget_handler: WidgetHandler | None = None
        self._asking: set[str] = set()
        """Widget calls whose handler is asking the user now."""
        self._asked: set[str] = set()
        """Call ids whose confirmation was asked for (once each, also across resumes)."""
        self._ws: ClientConnection | None = None
        self._background = Background()
        self._subscribers: weakref.WeakSet[EventStream] = weakref.WeakSet()
        self._listeners: weakref.WeakSet[AudioStream] = weakref.WeakSet()
        self._created: asyncio.Future[SessionCreated] | None = None
        self._closing = False
        self._end: ClientError | None = None
        self._running: dict[str, asyncio.Task[None]] = {}
        self._answered: set[str] = set()
        self._outbox = Outbox()
        """What the gateway has not confirmed yet: sent again after a resume."""
        self._since_ack = 0
        self.session: SessionCreated | None = None
        self.agent: str | None = None
        """The agent the session is with: ``session.created``'s, then another after each
        ``agent.transferred``."""
        self.latest_response: str | None = None
        """The id of the latest response that started (``truncate``'s default)."""
        self.last_seq = 0
        self.reconnects = 0
        self.device_id: str | None = None
        """This device's id among those sharing the session (``session.created``'s, or
        ``session.attached``'s after ``join``); the SDK resumes as it."""
        self._join = join
        self._moving: asyncio.Task[None] | None = None
        """The move to a new socket after ``session.going_away``, while it runs."""
        self._holding = False
        """User messages wait in the outbox for the move's new socket (``_move``)."""
        self._moved_from: ClientConnection | None = None
        """The socket a move (``_move``) started from, last."""

    # ----------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Conversation:
        """Open the first socket; with ``reconnect``, retried like a resume.

        Raises:
            SessionClosed: no socket after ``give_up_after`` seconds of attempts.
            websockets.InvalidStatus: the gateway refused the upgrade for good (HTTP 401,
                403, 404...); without ``reconnect``, whatever the one attempt raised.
        """
        if not self._reconnect:
            self._ws = await self._open_socket(None)
        else:
            opened = await self._reconnector.dial(first=True)
            if not isinstance(opened, ClientConnection):
                raise opened or SessionClosed(1000, "closed by the client")
            self._ws = opened
        self._background.spawn(self._read_loop(), "reader")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """End the session (a normal close tells the gateway the client is done).

        Pending ``say()`` and ``events()`` iterators raise ``SessionClosed`` (1000); every
        task the conversation started (client functions included) is cancelled. Closing
        while no socket is attached (a resume in progress, or a wait between attempts)
        drops the attempt, then ends the session with ``DELETE /v1/sessions/{id}`` (the
        resume token as its credential), and returns within 1 s whatever the network does:
        a request not answered within 0.8 s (``resume.END_TIMEOUT``) is abandoned, and the
        gateway then ends the session when its resume window (``session_ttl``) runs out.

        With several devices on the session, a device's close leaves it: the session ends
        with the last socket (a ``DELETE`` ends it for every device; a device that joined
        never sends one).
        """
        alive = self._end is None
        self._closing = True
        self._finish(SessionClosed(1000, "closed by the client"))
        self._reconnector.stop()
        await self._background.cancel()  # the reader among them: no socket comes after this
        if self._ws is not None and self._ws.state is State.OPEN:
            await self._ws.close()
        elif alive and self.session is not None and self._join is None:
            # A device that joined leaves the session to the others; it has no socket to
            # take out of it.
            await self._reconnector.end(self.session, self._url)

    def retry_now(self) -> bool:
        """Try to reach the gateway now, instead of at the end of the wait between two
        reconnect attempts: the network is back, or the user asked to retry. The next
        attempt starts at once; if it fails too, the SDK waits again as long as the backoff
        says (it keeps growing), and the app may call this again. It never ends the
        conversation nor starts a second series of attempts, and ``give_up_after`` still
        counts from the first failed attempt. It works between the attempts of a first
        connect or start as well. Call it on the conversation's event loop.

        Returns:
            ``True`` when it cut a wait short; ``False`` when nothing was waiting: connected,
            closed, an attempt already in flight, or nothing started yet.
        """
        return self._end is None and self._reconnector.retry_now()

    async def start(self) -> SessionCreated:
        """Open the session (``say`` and ``events`` do it when needed)."""
        if self._created is None:
            self._created = asyncio.get_running_loop().create_future()
            await self._send_start()
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
            update = self._new_update(client_functions=[f.spec for f in self._functions.values()])
            self._background.spawn(self._send(update), "update")

    def on_server_tool(self, handler: H) -> H:
        """Handle the server tools the model calls in manual tool mode (``tool.calls`` with
        ``kind="server"``); usable as a decorator. One handler for every such call; a new
        one replaces it.

        ``handler(call)`` gets the ``ClientCall`` (``tool``, ``args``...) and, within the
        call's deadline, returns the call's output (JSON-compatible data), raises (the error
        result is ``"<ClassName>: <message>"``, a bare ``Exception``'s message alone, as for
        a client function: see ``handler.failure_text``), or returns
        ``RUN_ON_GATEWAY`` (or ``RunOnGateway(args={...})``, edited arguments) to have the
        gateway run the tool, whose outcome is then the call's result. ``async`` or plain
        (a plain one runs in a worker thread). Without a handler every such call runs on the
        gateway, as in auto mode. Each call id is handled once, even across reconnects; a
        ``tool.run`` the gateway has not confirmed is sent again after a resume. A
        ``tool.run`` the gateway refuses (arguments off the tool's schema) gets the refusal
        as the call's error result, so the response goes on.
        """
        self._server_tool_handler = handler
        return handler

    def on_widget(self, handler: W) -> W:
        """Ask the user the calls of widget tools (``tool.calls`` whose call has a
        ``widget``: a choice, a yes/no question, a short form); usable as a decorator. One
        handler for every such call; a new one replaces it; a client function of the
        tool's name wins over it.

        ``handler(call)`` shows ``call.widget`` and, within the call's timeout, returns the
        user's answer: ``{"choice": "Harbor Mall"}``, ``{"confirmed": False}`` or the
        form's values; the gateway checks it against the widget. ``async`` or plain (a
        plain one runs in a worker thread). An exception or an overrun is the call's error
        result. When the call ends first (expired, cancelled), the handler's task is
        cancelled and nothing is sent.
        """
        self._widget_handler = handler
        return handler

    def on_confirm(self, handler: C) -> C:
        """Ask the user about the calls of tools marked ``confirm`` (``tool.confirm``); usable
        as a decorator. One handler for every such call; a new one replaces it.

        ``handler(item)`` gets the ``ConfirmItem`` (``prompt``, a sentence to show such as
        "Cancel order 1234?", ``tool``, ``display_name``, ``args``, ``timeout``...) and,
        within the item's timeout, returns ``True`` or ``Approve()`` (approve the call as it
        is), ``Approve(args={...})`` (approve it with edited arguments), ``False`` or
        ``Decline(reason="...")`` (decline it; the model hears the reason). ``async`` or plain
        (a plain one runs in a worker thread). An exception, an overrun or any other value
        declines the call, saying so; without a handler every such call is declined with the
        reason "this client cannot ask the user": the SDK never approves by itself.

        The answer goes in a ``tool.confirmation``. An approved server tool then runs on the
        gateway (``tool.status``); an approved client function's call arrives in
        ``tool.calls`` as usual; a declined call fails (``tool.status`` ``failed``, ``code:
        declined``). Each call id is asked about once, even when a resume offers it again in
        ``open_confirmations``; an answer the gateway has not confirmed is sent again after a
        resume. Edited arguments the gateway refuses (off the tool's schema) decline the call,
        with the refusal as the reason, so the response goes on.
        """
        self._confirm_handler = handler
        return handler

    async def update(
        self,
        *,
        tool_choice: str | None = None,
        max_steps: int | None = None,
        tool_mode: ToolMode | None = None,
        audio: AudioRequest | dict[str, Any] | bool | None = None,
    ) -> str | None:
        """Change the session's default ``tool_choice``, ``max_steps`` or ``tool_mode``, or
        its ``audio`` (see the class: the fields given replace those in force; ``False``
        turns audio off); ``None`` leaves one as it is. They apply to the responses that
        start after it.

        Before the session starts they go in ``session.start``. After, they go in a
        ``session.update`` (sent again after a resume until the gateway answers it), whose
        id is returned: ``session.updated`` answers it, or an ``error`` naming it in
        ``in_reply_to`` (a tool name the session does not have, say), which leaves the
        defaults as they were.

        Returns:
            The update's id; ``None`` before the session started.
        """
        if self._end is not None:
            raise self._end
        if isinstance(audio, dict):
            audio = msgspec.convert(audio, AudioRequest)
        if self._created is None:
            changes = {"tool_choice": tool_choice, "max_steps": max_steps, "tool_mode": tool_mode}
            start = msgspec.structs.replace(
                self._start_msg, **{k: v for k, v in changes.items() if v is not None}
            )
            if audio is not None:  # False: off, as if never asked for
                start.audio = None if audio is False else AudioRequest() if audio is True else audio
            self._start_msg = start
            return None
        update = self._new_update(
            tool_choice=tool_choice, max_steps=max_steps, tool_mode=tool_mode, audio=audio
        )
        await self._send(update)
        return update.id

    # ----------------------------------------------------------------- conversation

    async def say(
        self,
        text: str,
        *,
        tool_choice: str | None = None,
        tools: Sequence[str] | None = None,
        max_steps: int | None = None,
        tool_mode: ToolMode | None = None,
    ) -> AsyncIterator[str]:
        """Send a user message and yield the text of the response to it, as it streams.

        The text of consecutive model steps (before and after a tool call) is joined with
        a space, as a reader expects, unless one side already has one.

        Args:
            text: the user's message.
            tool_choice: for this message's response only (the session's default when
                ``None``): ``"auto"``, ``"none"``, ``"required"`` or one tool's name; a
                forced choice holds for the response's first model step.
            tools: the only tools the model may use for this response, by name (some of
                the session's); every tool of the session when ``None``.
            max_steps: the most model steps this response may take (the session's default
                when ``None``).
            tool_mode: ``"auto"`` or ``"manual"`` for this response only (the session's
                default when ``None``).

        Raises:
            ServerError: the gateway refused the message or the response failed.
            ResumeGap: events were lost across a reconnect.
            SessionClosed: the session ended.
        """
        await self.start()
        stream = self.events()
        try:
            msg_id = await self.post(
                text, tool_choice=tool_choice, tools=tools, max_steps=max_steps, tool_mode=tool_mode
            )
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

    async def post(
        self,
        text: str,
        *,
        tool_choice: str | None = None,
        tools: Sequence[str] | None = None,
        max_steps: int | None = None,
        tool_mode: ToolMode | None = None,
    ) -> str:
        """Send a user message without waiting for the reply; return its id.

        The reply arrives as events (``events()``); ``response.created`` names the
        message in ``in_reply_to``. A message not yet answered when the socket drops
        is sent again after the resume, options included; the gateway counts it once.
        The options are those of ``say()``.
        """
        if isinstance(tools, str):
            raise TypeError("tools is a list of tool names, not one name")
        await self.start()
        msg_id = f"msg_{secrets.token_urlsafe(9)}"
        msg = UserMessage(
            text=text,
            id=msg_id,
            tool_choice=tool_choice,
            tools=None if tools is None else list(tools),
            max_steps=max_steps,
            tool_mode=tool_mode,
        )
        self._outbox.keep(msg)
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

    async def truncate(
        self,
        heard_chars: int | None = None,
        response_id: str | None = None,
        *,
        audio_end_ms: int | None = None,
    ) -> str:
        """Voice barge-in: the user heard only the first ``heard_chars`` characters of the
        latest response's text (its deltas joined; code points), or, for an answer the
        gateway spoke, its first ``audio_end_ms`` of audio (the player's position: give one
        of the two). The gateway stops it if it still runs, and keeps only that much of it
        in the history, so the model does not believe it said what was never heard.
        ``response_id`` defaults to the latest response this SDK saw start. Sent again
        after a resume until the gateway answers (``response.truncated``, or an ``error``
        naming the returned id).

        Returns:
            The message's id.
        """
        target = response_id or self.latest_response
        if target is None:
            raise ClientError("no response to truncate yet")
        msg = ResponseTruncate(
            id=f"trn_{secrets.token_urlsafe(9)}",
            response_id=target,
            heard_chars=heard_chars,
            audio_end_ms=audio_end_ms,
        )
        self._outbox.keep(msg)
        await self._send(msg)
        return str(msg.id)

    # ----------------------------------------------------------------- voice

    async def send_audio(self, pcm: bytes) -> None:
        """The user's audio: PCM16 little-endian mono at the session's ``input_rate``,
        20 to 100 ms a call (a binary frame each). Live audio is not kept: what is sent
        while the socket is down is dropped, like the microphone's sound then."""
        if self._end is not None:
            raise self._end
        if self._ws is not None:
            with contextlib.suppress(websockets.ConnectionClosed):
                await self._ws.send(audio_frame(self._ws, pcm))

    async def commit_audio(self) -> None:
        """End the user's turn now (``manual`` turn detection). Not resent after a drop."""
        await self._send(InputAudioCommit())

    async def clear_audio(self) -> None:
        """Drop the audio of the user's turn in progress. Not resent after a drop."""
        await self._send(InputAudioClear())

    def audio(self) -> AudioStream:
        """The answers' audio from this call on, frame by frame (an async iterator of
        ``AnswerAudio``); ``audio.done`` in ``events()`` follows each answer's last frame.

        Raises:
            SessionClosed: when the session ends.
        """
        if self._end is not None:
            raise self._end
        stream = AudioStream()
        self._listeners.add(stream)
        return stream

    # ----------------------------------------------------------------- internals

    def _new_update(self, **fields: Any) -> SessionUpdate:
        """A ``session.update``, kept to be sent again until the gateway answers it."""
        update = SessionUpdate(id=f"upd_{secrets.token_urlsafe(9)}", **fields)
        self._outbox.keep(update)
        return update

    async def _send_start(self) -> None:
        """Send ``session.start`` on the socket of now, declaring the functions registered
        so far; a socket with no ``session.created`` within ``attempt_timeout`` is dropped
        (and, as for any drop before it, the session is started on a new one)."""
        specs = [f.spec for f in self._functions.values()]
        websocket = self._ws
        if self._join is not None:  # this device joins a session another one started
            session_id, token = self._join
            await self._send(
                SessionAttach(
                    session_id=session_id,
                    resume_token=token,
                    last_seq=self.last_seq,
                    client_functions=specs,
                )
            )
        else:
            await self._send(msgspec.structs.replace(self._start_msg, client_functions=specs))
        self._background.spawn(self._watch_start(websocket), "start")

    async def _watch_start(self, websocket: ClientConnection | None) -> None:
        created = self._created
        assert created is not None
        try:
            async with asyncio.timeout(self._reconnector.attempt_timeout):
                await asyncio.shield(created)
        except TimeoutError:
            if websocket is self._ws and not created.done():
                drop(websocket)
        except Exception:  # refused or ended: start() raises it
            pass

    def _deliver(self, event: Outbound) -> None:
        for stream in self._subscribers:
            stream.put(event)

    async def _send(self, msg: ClientMsg) -> None:
        """Send if connected; a message lost to a drop is recovered on resume."""
        if self._end is not None:
            raise self._end
        if self._holding and isinstance(msg, UserMessage):
            return  # kept in the outbox for the next socket (see ``_move``)
        if self._ws is not None:
            with contextlib.suppress(websockets.ConnectionClosed):
                await self._ws.send(message_frame(self._ws, msg))

    async def _read_loop(self) -> None:
        while True:
            websocket = self._ws
            assert websocket is not None
            try:
                frame = await websocket.recv()
            except websockets.ConnectionClosed as exc:
                if self._closing:
                    return
                if self._moving is not None:  # the gateway may close it for the move
                    await asyncio.wait({self._moving})
                if websocket is not self._ws:
                    continue  # moved to the next socket (session.going_away): read that one
                closed = closed_with(exc)
                # A 4009 after a move whose answer never came: the move's own resume replaced
                # this socket, and the session goes on; resume again.
                replaced = (
                    websocket is self._moved_from and closed.closed_with == CloseCode.TAKEN_OVER
                )
                if (closed.closed_with in FINAL_CLOSES and not replaced) or not self._reconnect:
                    self._finish(closed)
                    return
                if self.session is None:  # nothing to resume: a new socket, a new start
                    if not await self._start_again():
                        return
                    continue
                outcome = await self._reconnector.run(self._resume())
                if not isinstance(outcome, Resumed):
                    if outcome is not None:
                        self._finish(outcome)  # the gateway no longer has the session
                    return
                await self._after_resume(outcome)
                continue
            if websocket is not self._ws:
                continue  # what the previous socket still had: the new one replays it
            item = read_frame(websocket, frame)
            if isinstance(item, AnswerAudio):
                for stream in self._listeners:
                    stream.put(item)
            elif item is not None:  # else a kind of frame newer than this SDK
                self._on_event(item)

    async def _start_again(self) -> bool:
        """After a drop before ``session.created``: a new socket (with backoff), and
        ``session.start`` again on it if it was sent; ``False`` when the conversation ends."""
        opened = await self._reconnector.dial()
        if not isinstance(opened, ClientConnection):
            if opened is not None:
                self._finish(opened)  # gave up
            return False
        self._ws = opened
        if self._created is not None and not self._created.done():
            await self._send_start()
        return True

    def _on_event(self, event: Outbound) -> None:
        if event.seq:
            if event.seq <= self.last_seq:
                return  # already seen: never hand the app a duplicate
            self.last_seq = event.seq
            self._since_ack += 1
            if self._since_ack >= self._ack_every:
                self._since_ack = 0
                self._background.spawn(self._send(Ack(seq=self.last_seq)), "ack")
        match event:
            case SessionCreated() if self._join is not None:
                pass  # replayed to this device, which joined: another device's start
            case SessionCreated():
                self.session, self.agent = event, event.agent
                self.device_id = event.device_id
                if self._created is not None and not self._created.done():
                    self._created.set_result(event)
            case SessionAttached():
                self._joined(event)
            case SessionSnapshot() if self._join is not None and self.session is None:
                self.last_seq = event.last_seq  # joined past what the log still holds
                self._joined(event)
            case Error() if self._join is not None and event.code == "resume_gap":
                pass  # joined past what the log still holds: the snapshot follows
            case SessionGoingAway() if self._moving is None and self.session is not None:
                self._moving = self._background.spawn(self._move(event.time_left), "move")
            case Error() if self.session is None and self._created is not None:
                if not self._created.done():
                    self._created.set_exception(ServerError(event))
            case AgentTransferred(agent=agent):
                self.agent = agent
            case ResponseCreated(response_id=response_id):
                self.latest_response = response_id
            case ToolCalls(calls=calls):
                for call in calls:
                    self._run_call(call)
            case ToolStatus(call_id=call_id, status=status) if (
                status in _CALL_ENDED and call_id in self._running and call_id not in self._answered
            ):
                # The call ended without this device's answer (another device answered it,
                # it expired, the user was asked too late): stop it, send nothing.
                self._answered.add(call_id)
                self._running[call_id].cancel()
            case ToolConfirm(calls=items):
                for item in items:
                    self._ask(item)
            case Error() if (answer := self._outbox.refused_confirmation(event)) is not None:
                if event.code == "invalid_message" and answer.approved:  # the call still waits
                    decline = self._keep_confirmation(refused_edit(answer, event.message))
                    self._background.spawn(self._send(decline), "confirm")
            case Error() if (refused := self._outbox.refused_run(event)) is not None:
                if event.code != "unknown_call":  # the call stays ours: answer it, not hang
                    call_id, tool = refused.msg.call_id, refused.tool
                    result = ToolResult(call_id=call_id, tool=tool, error=event.message)
                    self._outbox.results[result.call_id] = result
                    self._background.spawn(self._send(ToolResults(results=[result])), "result")
        self._outbox.confirm(event)
        self._deliver(event)

    def _run_call(self, call: ClientCall) -> None:
        if call.call_id in self._answered or call.call_id in self._running:
            return
        task = self._background.spawn(self._execute(call), f"call:{call.call_id}")
        self._running[call.call_id] = task
        task.add_done_callback(lambda _: self._running.pop(call.call_id, None))

    async def _execute(self, call: ClientCall) -> None:
        function = self._functions.get(call.tool)
        if call.kind == "server":  # manual tool mode: never a client function's call
            reply = await decide(self._server_tool_handler, call)
        elif function is None and call.widget is not None and self._widget_handler is not None:
            self._asking.add(call.call_id)
            try:
                reply = await ask_user(self._widget_handler, call)
            finally:
                self._asking.discard(call.call_id)
        else:
            reply = await answer(function, call)
        self._answered.add(call.call_id)
        if isinstance(reply, ToolRun):
            run = msgspec.structs.replace(reply, id=f"run_{secrets.token_urlsafe(9)}")
            self._outbox.keep_run(run, call.tool)
            await self._send(run)
        else:
            self._outbox.results[call.call_id] = reply
            await self._send(ToolResults(results=[reply]))

    def _ask(self, item: ConfirmItem) -> None:
        if item.call_id in self._asked:
            return
        self._asked.add(item.call_id)
        self._background.spawn(self._confirm(item), f"confirm:{item.call_id}")

    async def _confirm(self, item: ConfirmItem) -> None:
        answer = await ask(self._confirm_handler, item)
        await self._send(self._keep_confirmation(answer))

    def _keep_confirmation(self, answer: ToolConfirmation) -> ToolConfirmation:
        """``answer`` with an id, kept until the gateway confirms it (it replaces an earlier
        answer for the same call, which the gateway refused)."""
        answer = msgspec.structs.replace(answer, id=f"cnf_{secrets.token_urlsafe(9)}")
        self._outbox.keep_confirmation(answer)
        return answer

    def _joined(self, event: SessionAttached | SessionSnapshot) -> None:
        """``session.attached`` (or, when the log no longer holds the start of the session,
        the snapshot after ``resume_gap``): this device joined the session (``join``); the
        replay follows. Its calls and confirmations still open are taken up as after a
        resume."""
        if self._join is None:
            return  # not an answer this conversation asked for
        session_id, token = self._join
        self.session = SessionCreated(
            session_id=session_id,
            resume_token=token,
            agent=event.agent or "",
            protocol_version=PROTOCOL_VERSION,
        )
        self.agent, self.device_id = event.agent, event.device_id or self.device_id
        if self._created is not None and not self._created.done():
            self._created.set_result(self.session)
        for call in event.open_calls:
            self._run_call(call)
        for item in event.open_confirmations:
            self._ask(item)

    def _resume(self) -> SessionResume:
        """The ``session.resume`` of this conversation now: as its device, with the
        functions it offers (a gateway that gave no device id gets a plain resume)."""
        assert self.session is not None
        specs = [f.spec for f in self._functions.values()]
        return resume_of(self.session, self.last_seq, self.device_id, specs)

    async def _move(self, time_left: float) -> None:
        """``session.going_away``: resume on a new socket while this one still works (trying
        for up to ``time_left`` seconds), then carry on over the new one; the old one is
        closed with 4000 (never 1000, which would end the session), unless the gateway
        closed it first. Should the move fail, the old socket stays, and is resumed as
        usual once it closes.

        User messages sent meanwhile wait in the outbox for the new socket: one sent on the
        old socket would start its response on the node going away, to be cut there by the
        move and run again on the next (so they go on the old one only if the move fails).
        """
        self._holding = True
        self._moved_from = self._ws
        try:
            old = self._ws
            resumed = await self._reconnector.ahead(self._resume(), time_left)
            self._holding = False
            if resumed is None:
                if self._end is None and self._ws is old:
                    for msg in self._outbox.resend():  # applied once each, by their ids
                        await self._send(msg)
                return
            if self._end is not None or self._ws is not old:
                drop(resumed.websocket)
                return
            await self._after_resume(resumed)
        finally:
            self._holding = False
            self._moving = None
        if old is not None:
            with contextlib.suppress(Exception):
                await old.close(MOVED, "moved to a new socket")

    async def _after_resume(self, resumed: Resumed) -> None:
        """Carry on over the new socket: deliver the answer, send again what the gateway
        had not confirmed (it applies each once), run calls opened meanwhile."""
        self._ws = resumed.websocket
        self.reconnects += 1
        open_calls: list[ClientCall] = []
        open_confirmations: list[ConfirmItem] = []
        answer, snapshot = resumed.answer, resumed.snapshot
        if isinstance(snapshot, SessionSnapshot):  # ``answer`` is the resume_gap error
            self.last_seq, self.agent = snapshot.last_seq, snapshot.agent or self.agent
            open_calls, open_confirmations = snapshot.open_calls, snapshot.open_confirmations
            self._deliver(answer)
            self._deliver(snapshot)  # pending say() iterators raise ResumeGap
        elif isinstance(answer, SessionResumed):
            open_calls, open_confirmations = answer.open_calls, answer.open_confirmations
            self.agent = answer.agent or self.agent
            self.device_id = answer.device_id or self.device_id
            self._deliver(answer)
        else:  # not an answer to the resume: an event like any other
            for event in (answer, snapshot):
                if event is not None:
                    self._on_event(event)
        for msg in self._outbox.resend():
            await self._send(msg)
        for call in open_calls:
            self._run_call(call)
        for item in open_confirmations:
            self._ask(item)

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
        for audio in self._listeners:
            audio.end(error)

    async def _open_socket(self, session_id: str | None) -> ClientConnection:
        """A socket to the gateway, with a fresh token when the app gave a function; one
        that resumes ``session_id`` names it in the URL (``?session=``), so that a load
        balancer routing by session sends every resume of it to the same node."""
        token = self._token
        if callable(token):
            try:
                token = await token()
            except Exception as exc:  # the app's fetch failed: like an unreachable gateway
                raise ConnectionError(f"could not get a client token: {exc}") from exc
        if session_id is None and self._join is not None:
            session_id = self._join[0]  # a device joining names its session, as a resume does
        url = self._url if session_id is None else resume_url(self._url, session_id)
        return await open_socket(
            url, token=token, api_key=self._api_key, msgpack=self._protocol == "msgpack"
        )
