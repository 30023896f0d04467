"""``gateway chat``: a terminal chat built on the SDK.

Streams the model's text, shows tool activity as it happens (each on a line of its
own, by the tool's display name), runs the demo agent's client functions on this
machine. Ctrl-C cancels the running response; at the prompt, Ctrl-C asks for a
second one, which quits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from typing import Any, TextIO

from client_sdk.client import Conversation
from client_sdk.device import battery_level, nearest_store, settings_report
from client_sdk.events import EventStream
from client_sdk.exceptions import ClientError
from client_sdk.handler import failure_text
from gateway.wire.v1 import (
    AgentTransferred,
    Error,
    Outbound,
    ResponseCreated,
    ResponseDone,
    ResponseRetrying,
    SessionCreated,
    SessionResumed,
    SessionUpdated,
    TextDelta,
    TextDone,
    ToolCalls,
    ToolStatus,
)

__all__ = ["run_chat"]

PROMPT = "you> "
_MARKS = {
    "running": "→",  # a server tool: client calls show as tool.calls
    "pending": "…",
    "completed": "✓",
    "failed": "✗",
    "expired": "⌛",
    "cancelled": "⊘",
}


class Chat:
    """The terminal's state: what runs, what is on screen, whether Ctrl-C was pressed."""

    def __init__(self, conv: Conversation, url: str, out: TextIO) -> None:
        self.conv = conv
        self.url = url
        self.out = out
        self.running: set[str] = set()
        """Responses between response.created and response.done."""
        self.waiting = False
        """A message was sent and its response has not started yet."""
        self.armed = False
        """Ctrl-C was pressed: another one quits."""
        self.quit = asyncio.Event()
        self.names: dict[str, str] = {}
        """Tool name -> display name, from session.created and session.updated."""
        self.updates: set[str] = set()
        """Responses an async tool's result started."""
        self.speaking: str | None = None
        """The response whose text the current line holds."""
        self.last = "\n"
        """The last character written."""
        self.prompting = False
        """The prompt is the last thing on screen: a notice rewrites it below."""
        self.step_ended = False
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def responding(self) -> bool:
        return self.waiting or bool(self.running)

    def write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()
            self.last = text[-1]
            self.prompting = False

    def prompt(self) -> None:
        self.write(PROMPT)
        self.prompting = True

    def new_line(self) -> bool:
        """Start a fresh line; ``True`` when that took the prompt away (to be shown again)."""
        prompted = self.prompting
        if prompted and self.out.isatty():
            self.out.write("\r\x1b[K")  # the prompt goes, and comes back below
            self.last = "\n"
        elif self.last != "\n":
            self.write("\n")
        self.speaking = None
        return prompted

    def notice(self, text: str) -> None:
        """A line of its own: never inside the assistant's sentence, never after the prompt."""
        prompted = self.new_line()
        self.write(text + "\n")
        if prompted:
            self.prompt()

    def speak(self, response_id: str, delta: str) -> None:
        """The model's text; a response interrupted by a notice goes on below it, labelled."""
        if self.speaking != response_id:
            self.new_line()  # response.done shows the prompt again
            self.write("assistant (update)> " if response_id in self.updates else "assistant> ")
            self.speaking = response_id
        elif self.step_ended and not self.last.isspace() and not delta[:1].isspace():
            delta = " " + delta  # a new model step, as say() joins them
        self.step_ended = False
        self.write(delta)

    def sent(self) -> None:
        """The user sent a line: a response is on its way; Ctrl-C means cancel again."""
        self.armed = False
        self.waiting = True
        self.prompting = False
        self.last = "\n"  # the terminal echoed the line and its newline

    def register_functions(self) -> None:
        conv = self.conv
        loop = asyncio.get_running_loop()
        rest = ["get_battery_level", "get_nearest_store"]

        @conv.client_function("open_settings", description="Open the chat's settings panel.")
        def open_settings(section: str | None = None) -> dict[str, Any]:
            session_id = conv.session.session_id if conv.session else "?"
            report = settings_report(self.url, session_id, ["open_settings", *rest])
            # From a worker thread: the loop's thread prints it.
            loop.call_soon_threadsafe(self.notice, report)
            return {"opened": True}

        conv.add_client_function(
            battery_level, name="get_battery_level", description="Read this machine's battery."
        )
        conv.add_client_function(
            nearest_store, name="get_nearest_store", description="Find the nearest store."
        )

    def on_interrupt(self) -> None:
        """Ctrl-C: cancel what is running; at the prompt, ask for a second one; that quits."""
        if self.armed:
            self.quit.set()
        elif self.responding:
            self.armed = True
            self.notice("  [cancelling — Ctrl-C again to quit]")
            task = asyncio.get_running_loop().create_task(self._cancel())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self.armed = True
            self.notice("  [press Ctrl-C again to quit, or Ctrl-D]")

    async def _cancel(self) -> None:
        with contextlib.suppress(ClientError):  # the session ended: nothing to cancel
            await self.conv.cancel()

    async def show_events(self, events: EventStream) -> None:
        async for event in events:
            self.show(event)

    def name(self, tool: str) -> str:
        return self.names.get(tool) or tool

    def show(self, event: Outbound) -> None:
        match event:
            case SessionCreated(tools=tools) | SessionUpdated(tools=tools):
                self.names.update({t.name: t.display_name for t in tools if t.display_name})
            case AgentTransferred(agent=agent, tools=tools, reason=reason):
                self.names.update({t.name: t.display_name for t in tools if t.display_name})
                self.notice(f"  ⇄ now with the {agent} agent" + (f" ({reason})" if reason else ""))
            case ResponseCreated(response_id=response_id, call_id=call_id):
                self.waiting = self.waiting and call_id is not None
                self.running.add(response_id)
                if call_id is not None:
                    self.updates.add(response_id)
            case ResponseRetrying(attempt=attempt, delay=delay, reason=reason):
                self.notice(
                    f"  ↻ the model is retrying ({reason}): attempt {attempt} in {delay:g} s"
                )
            case TextDelta(response_id=response_id, delta=delta):
                self.speak(response_id, delta)
            case TextDone():
                self.step_ended = True
            case ToolCalls(calls=calls):
                for call in calls:
                    args = ", ".join(f"{k}={v!r}" for k, v in call.args.items())
                    self.notice(f"  → {call.display_name or self.name(call.tool)}({args})")
            case ToolStatus(status="progress"):
                self.notice(f"  … {self.name(event.tool)}: {describe(event.progress)}")
            case ToolStatus(status=status, duplicate=False) if status in _MARKS:
                detail = f": {event.error}" if event.error else ""
                self.notice(f"  {_MARKS[status]} {self.name(event.tool)} {status}{detail}")
            case Error(code=code, message=message):
                self.notice(f"  ! {code}: {message}")
            case SessionResumed():
                self.notice("  [reconnected]")
            case ResponseDone(response_id=response_id, status=status):
                self.running.discard(response_id)
                if status != "completed":
                    self.notice(f"  [{status}]")
                if not self.responding:
                    self.armed = False  # the next Ctrl-C at the prompt asks first
                    self.new_line()
                    self.prompt()


async def run_chat(url: str, *, token: str | None = None, out: TextIO = sys.stdout) -> int:
    """Talk to the gateway at ``url`` until end of input or Ctrl-C twice at the prompt."""
    loop = asyncio.get_running_loop()
    try:
        conv = await Conversation(url, token=token).__aenter__()
    except OSError as exc:
        print(f"gateway chat: cannot connect to {url}: {exc}", file=sys.stderr)
        return 1
    chat = Chat(conv, url, out)
    events = conv.events()  # from the start: session.created names the tools
    chat.register_functions()
    try:
        created = await conv.start()
    except ClientError as exc:
        print(f"gateway chat: {exc}", file=sys.stderr)
        await conv.close()
        return 1
    chat.write(
        f"Connected to agent {created.agent!r}. Type a message and press Enter.\n"
        "Ctrl-C cancels a reply; Ctrl-C twice at the prompt, or Ctrl-D, quits.\n"
    )
    chat.prompt()
    lines: asyncio.Queue[str | None] = asyncio.Queue()

    def read_line() -> None:
        line = sys.stdin.readline()
        lines.put_nowait(line if line else None)

    # Whatever goes wrong in the background is a line of its own, not text in a sentence.
    loop.set_exception_handler(lambda _, context: chat.notice(f"  ! {_describe_failure(context)}"))
    loop.add_reader(sys.stdin.fileno(), read_line)
    loop.add_signal_handler(signal.SIGINT, chat.on_interrupt)
    shower = asyncio.create_task(chat.show_events(events))
    quitting = asyncio.create_task(chat.quit.wait())
    failure: BaseException | None = None
    try:
        while True:
            reading = asyncio.create_task(lines.get())
            done, _ = await asyncio.wait(
                {reading, quitting, shower}, return_when=asyncio.FIRST_COMPLETED
            )
            if reading not in done:
                reading.cancel()
                break
            line = reading.result()
            if line is None:
                break
            chat.last = "\n"  # the terminal echoed the line's newline
            if line.strip():
                chat.sent()
                await conv.post(line.strip())
            else:
                chat.prompt()
    except ClientError as exc:  # the session ended under a post
        failure = exc
    finally:
        loop.remove_reader(sys.stdin.fileno())
        loop.remove_signal_handler(signal.SIGINT)
        for task in (shower, quitting):
            task.cancel()
        with contextlib.suppress(Exception):
            await conv.close()
        chat.new_line()
        chat.write("bye\n")
    if shower.done() and not shower.cancelled():
        failure = failure or shower.exception()
    if failure is not None:
        print(f"gateway chat: {failure}", file=sys.stderr)
        return 1
    return 0


def describe(value: Any) -> str:
    """A tool's progress as words: ``{"stage": "asking the carrier"}`` -> that stage."""
    if isinstance(value, dict):
        if len(value) == 1:
            return describe(next(iter(value.values())))
        return ", ".join(f"{key}: {describe(item)}" for key, item in value.items())
    if isinstance(value, list):
        return ", ".join(describe(item) for item in value)
    return value if isinstance(value, str) else json.dumps(value)


def _describe_failure(context: dict[str, Any]) -> str:
    error = context.get("exception")
    return failure_text(error) if error is not None else str(context["message"])
