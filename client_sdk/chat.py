"""``gateway chat``: a terminal chat built on the SDK.

Streams the model's text, shows tool activity as it happens, runs the demo
agent's client functions on this machine. Ctrl-C cancels the running response;
a second Ctrl-C exits.
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
from client_sdk.exceptions import ClientError
from gateway.protocol import (
    Error,
    Outbound,
    ResponseCreated,
    ResponseDone,
    SessionResumed,
    TextDelta,
    ToolCalls,
    ToolStatus,
)

__all__ = ["run_chat"]

PROMPT = "you> "


class Chat:
    """The terminal's state: what runs, what was interrupted."""

    def __init__(self, conv: Conversation, url: str, out: TextIO) -> None:
        self.conv = conv
        self.url = url
        self.out = out
        self.responding = False
        self.interrupted = False
        self.quit = asyncio.Event()

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def register_functions(self) -> None:
        conv = self.conv
        rest = ["get_battery_level", "get_nearest_store"]

        @conv.client_function("open_settings", description="Open the chat's settings panel.")
        def open_settings(section: str | None = None) -> dict[str, Any]:
            session_id = conv.session.session_id if conv.session else "?"
            self.write(
                "\n" + settings_report(self.url, session_id, ["open_settings", *rest]) + "\n"
            )
            return {"opened": True}

        conv.add_client_function(
            battery_level, name="get_battery_level", description="Read this machine's battery."
        )
        conv.add_client_function(
            nearest_store, name="get_nearest_store", description="Find the nearest store."
        )

    def on_interrupt(self) -> None:
        """Ctrl-C: cancel the running response; again (or when idle): exit."""
        if self.responding and not self.interrupted:
            self.interrupted = True
            self.write("\n[cancelling — Ctrl-C again to quit]\n")
            asyncio.get_running_loop().create_task(self.conv.cancel())
        else:
            self.quit.set()

    async def show_events(self) -> None:
        async for event in self.conv.events():
            self.show(event)

    def show(self, event: Outbound) -> None:
        match event:
            case ResponseCreated(call_id=call_id):
                self.responding = True
                self.write("\nassistant> " if call_id is None else "\nassistant (update)> ")
            case TextDelta(delta=delta):
                self.write(delta)
            case ToolCalls(calls=calls):
                for call in calls:
                    self.write(f"\n  → {call.display_name} {json.dumps(call.args)}\n")
            case ToolStatus(status="progress"):
                self.write(f"\n  … {event.tool}: {json.dumps(event.progress)}\n")
            case ToolStatus(status=status, duplicate=False):
                mark = {"completed": "✓", "failed": "✗", "expired": "⌛", "cancelled": "⊘"}
                detail = f": {event.error}" if event.error else ""
                self.write(f"\n  {mark.get(status, '…')} {event.tool} {status}{detail}\n")
            case Error(code=code, message=message):
                self.write(f"\n  ! {code}: {message}\n")
            case SessionResumed():
                self.write("\n  [reconnected]\n")
            case ResponseDone(status=status):
                self.responding = False
                self.write("\n" if status == "completed" else f"\n  [{status}]\n")
                self.write(PROMPT)


async def run_chat(url: str, *, token: str | None = None, out: TextIO = sys.stdout) -> int:
    """Talk to the gateway at ``url`` until end of input or a second Ctrl-C."""
    loop = asyncio.get_running_loop()
    try:
        conv = await Conversation(url, token=token).__aenter__()
    except OSError as exc:
        print(f"gateway chat: cannot connect to {url}: {exc}", file=sys.stderr)
        return 1
    chat = Chat(conv, url, out)
    chat.register_functions()
    try:
        created = await conv.start()
    except ClientError as exc:
        print(f"gateway chat: {exc}", file=sys.stderr)
        await conv.close()
        return 1
    chat.write(
        f"Connected to agent {created.agent!r}. Type a message and press Enter.\n"
        "Ctrl-C cancels a reply; Ctrl-C twice, or Ctrl-D, quits.\n" + PROMPT
    )
    lines: asyncio.Queue[str | None] = asyncio.Queue()

    def read_line() -> None:
        line = sys.stdin.readline()
        lines.put_nowait(line if line else None)

    loop.add_reader(sys.stdin.fileno(), read_line)
    loop.add_signal_handler(signal.SIGINT, chat.on_interrupt)
    shower = asyncio.create_task(chat.show_events())
    quitting = asyncio.create_task(chat.quit.wait())
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
            if line.strip():
                chat.interrupted = False
                chat.responding = True
                await conv.post(line.strip())
            else:
                chat.write(PROMPT)
    finally:
        loop.remove_reader(sys.stdin.fileno())
        loop.remove_signal_handler(signal.SIGINT)
        for task in (shower, quitting):
            task.cancel()
        with contextlib.suppress(Exception):
            await conv.close()
        chat.write("\nbye\n")
    if shower.done() and not shower.cancelled() and shower.exception() is not None:
        print(f"gateway chat: {shower.exception()}", file=sys.stderr)
        return 1
    return 0
