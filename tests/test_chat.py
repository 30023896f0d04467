"""`gateway chat` in a real pseudo-terminal against a real gateway: what the user sees, and
what Ctrl-C does at the prompt and during a reply."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import TextIO

import pexpect
import pytest

from tests.retrying_model import RetriesWhenFlaky
from tests.support import serving

ROOT = Path(__file__).parents[1]


def spawn_chat(url: str, log: TextIO) -> pexpect.spawn:
    chat = pexpect.spawn(
        sys.executable,
        ["-m", "gateway", "chat", "--url", url],
        cwd=str(ROOT),
        encoding="utf-8",
        timeout=20,
        dimensions=(40, 200),
    )
    chat.logfile_read = log  # what the terminal showed, kept with the test's files
    return chat


def converse(chat: pexpect.spawn) -> None:
    """The user's side (blocking: it runs in a thread while the gateway serves)."""
    chat.expect("you> ")
    chat.sendline("nearest store to 92031")
    chat.expect_exact("→ Nearest store(zip_code='92031')")  # display names, like the web demo
    chat.expect_exact("✓ Nearest store completed")
    chat.expect_exact("assistant> The nearest store to 92031 is Vista, 1 Main St, Vista, CA.")
    chat.expect("you> ")
    chat.sendline("do you have headphones in stock?")
    chat.expect_exact("→ Check stock running")  # a server tool, by its display name too
    chat.expect_exact("assistant> Good news")
    chat.expect("you> ")
    chat.sendline("where is my order 1234?")
    chat.expect_exact("… Check order status pending")
    chat.expect_exact("… Check order status: searching the warehouse")  # words, not JSON
    chat.expect("you> ")
    # Progress that arrives while the prompt waits goes above it, on a line of its own.
    chat.expect_exact("… Check order status: asking the carrier\r\nyou> ")
    chat.expect_exact("assistant (update)> Update on order 1234")
    chat.expect("you> ")
    chat.sendline("hello, flaky model")
    chat.expect_exact("↻ the model is retrying (HTTP 503): attempt 1 in 0.25 s")
    chat.expect_exact("assistant> Hello!")
    chat.sendcontrol("c")  # a reply is streaming: Ctrl-C cancels it
    chat.expect_exact("[cancelling — Ctrl-C again to quit]")
    chat.expect_exact("[cancelled]")
    chat.expect("you> ")
    chat.sendcontrol("c")  # at the prompt: the first Ctrl-C only asks
    chat.expect_exact("[press Ctrl-C again to quit, or Ctrl-D]")
    chat.expect("you> ")
    chat.sendline("thanks")  # still here
    chat.expect_exact("assistant> You're welcome!")
    chat.expect("you> ")
    chat.sendcontrol("c")
    chat.expect_exact("[press Ctrl-C again to quit, or Ctrl-D]")
    chat.sendcontrol("c")  # the second one quits
    chat.expect_exact("bye")
    chat.expect(pexpect.EOF)
    chat.close()


@pytest.mark.slow  # a terminal session through pexpect: about 6 s
async def test_gateway_chat_in_a_terminal(tmp_path: Path, monkeypatch):
    # The order lookup reports progress after 1.5 s and ends after 3 s: after the reply (0.5 s).
    monkeypatch.setenv("DEMO_ORDER_SECONDS", "3")
    async with serving(agent=None, scripted_pace=0.05) as demo:
        demo.model.inner = RetriesWhenFlaky(demo.model.inner)  # type: ignore[assignment]
        with (tmp_path / "chat.log").open("w") as log:
            chat = spawn_chat(demo.url, log)
            try:
                await asyncio.to_thread(converse, chat)
            finally:
                chat.terminate(force=True)
    assert chat.exitstatus == 0
    shown = (tmp_path / "chat.log").read_text()
    assert '{"stage"' not in shown  # no raw JSON
    assert "assistant> Hello!" in shown


def test_gateway_serve_and_chat_from_the_command_line(tmp_path: Path):
    """The two commands a newcomer types, each in its own terminal."""
    server = pexpect.spawn(
        sys.executable,
        ["-m", "gateway", "serve", "--port", "0", "--no-auth", "--scripted-pace", "0"],
        cwd=str(ROOT),
        env={**os.environ},
        encoding="utf-8",
        timeout=20,
    )
    try:
        log = (tmp_path / "chat.log").open("w")
        server.expect(r"running on http://127\.0\.0\.1:(\d+)")
        chat = spawn_chat(f"ws://127.0.0.1:{server.match.group(1)}/v1/realtime", log)
        chat.expect("you> ")
        chat.sendline("open the settings")
        chat.expect_exact("assistant> Sure, opening the settings.")
        chat.expect_exact("┌ settings")  # the client function ran here, on a line of its own
        chat.expect_exact("assistant> The settings are open.")
        chat.expect("you> ")
        chat.sendeof()
        chat.expect_exact("bye")
        chat.expect(pexpect.EOF)
        chat.close()
        assert chat.exitstatus == 0
    finally:
        server.kill(9)
        server.close()
        log.close()
