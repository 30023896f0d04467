"""The shipped JS SDK (client_sdk/js/gateway-client.js) under Node survives every kind of
drop, with both WebSocket classes it runs with there: the ws npm package and Node's own.

A proxy in front of the real gateway fails connections exactly where each bug was: as the
client sends ``session.start``, as the gateway answers it, a resume's upgrade reset or never
answered, the first connect's too, ``close()`` while no socket is attached. Then seeded random
drops over many conversations, whose transcripts must equal those of a run without drops.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.proxy import Proxy, Upgrade, proxy_to
from tests.support import Gateway, serving

JS = Path(__file__).parent / "js"
SCRIPT = JS / "live_drops.mjs"
RANDOM_SCRIPT = JS / "live_drops_random.mjs"
CALLED = "calling A A=a"  # "one": device_a runs, its output is {"value": "a"}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("node") is None, reason="Node is not installed"),
    pytest.mark.parametrize("impl", ["ws", "builtin"]),
]

OnLine = Callable[[str, asyncio.StreamWriter], Awaitable[None]]


async def run_node(script: Path, *args: str, on_line: OnLine | None = None) -> Any:
    """Run ``script`` with ``args`` (the WebSocket class second); hand every stdout line but
    the result to ``on_line``; return the JSON of its ``result`` line."""
    impl = args[1]
    if impl == "ws":
        assert (JS / "node_modules" / "ws").is_dir(), "the ws package is missing: run make test"
    flags = ["--experimental-websocket"] if impl == "builtin" else []
    node = await asyncio.create_subprocess_exec(
        "node",
        "--no-warnings",
        *flags,
        str(script),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert node.stdin is not None
    assert node.stdout is not None
    assert node.stderr is not None
    result = None
    try:
        async with asyncio.timeout(20):
            while line := (await node.stdout.readline()).decode():
                if line.startswith("result "):
                    result = json.loads(line.removeprefix("result "))
                elif on_line is not None:
                    await on_line(line.strip(), node.stdin)
            stderr = (await node.stderr.read()).decode()
            assert await node.wait() == 0, stderr
    finally:
        if node.returncode is None:
            node.kill()
            await node.wait()
    assert result is not None, stderr
    return result


async def conversation(
    proxy: Proxy, impl: str, scenario: str, on_line: OnLine | None = None
) -> dict[str, Any]:
    result: dict[str, Any] = await run_node(SCRIPT, proxy.url(), impl, scenario, on_line=on_line)
    return result


ENDED_WITHIN = 20.0
"""A sanity bound: a closed session ends in milliseconds; this is ten times the worst seen
on a loaded machine and still far sooner than ``session_ttl`` (120 s) would end it."""


async def ended(gateway: Gateway, sessions_left: int = 0) -> None:
    """Wait until only ``sessions_left`` sessions remain on the gateway: ended by the
    client's close, not by their ``session_ttl``."""
    try:
        async with asyncio.timeout(ENDED_WITHIN):
            if sessions_left == 0:
                await gateway.runtime.idle.wait()
                return
            # Polled: no event tells when one of several sessions ended.
            while len(gateway.runtime.drivers) > sessions_left:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    except TimeoutError as exc:
        left = len(gateway.runtime.drivers)
        raise AssertionError(f"{left} sessions left, not {sessions_left}") from exc


def on_ready(act: Callable[[], Awaitable[None]]) -> OnLine:
    """At the script's ``ready``: ``act()``, then tell the script to go on."""

    async def handle(line: str, stdin: asyncio.StreamWriter) -> None:
        assert line == "ready", line
        await act()
        stdin.write(b"go\n")
        await stdin.drain()

    return handle


def assert_called_once(result: dict[str, Any], answers: list[str], gateway: Gateway) -> None:
    assert result["error"] is None
    assert result["answers"] == answers
    assert result["runs"] == [1]  # device_a's call ran once
    # The model was asked once per step: "echo" takes one, "one" two (the call, its result).
    assert len(gateway.model.requests) == len(answers) + 1


async def test_a_start_cut_on_its_way_up_is_sent_again(impl: str) -> None:
    async with serving() as gateway, proxy_to(gateway.port) as proxy:
        cut = proxy.cut_at("up", "session.start")
        result = await conversation(proxy, impl, "start")
        assert cut.done.is_set()
        await ended(gateway)  # the first start never reached the gateway: one session, ended
    assert_called_once(result, [CALLED], gateway)
    assert result["states"] == ["connecting", "open", "reconnecting", "open", "closed"]
    assert result["reconnects"] == 0
    assert result["dials"] == 2


async def test_a_start_whose_answer_is_cut_is_sent_again(impl: str) -> None:
    async with serving() as gateway, proxy_to(gateway.port) as proxy:
        cut = proxy.cut_at("down", "session.created")
        result = await conversation(proxy, impl, "start")
        assert cut.done.is_set()
        # The conversation's session ended; the first one, never heard of, waits its TTL.
        await ended(gateway, sessions_left=1)
        assert len(gateway.runtime.drivers) == 1
    assert_called_once(result, [CALLED], gateway)
    assert result["states"] == ["connecting", "open", "reconnecting", "open", "closed"]
    assert result["dials"] == 2


async def test_a_resume_whose_upgrade_is_reset_is_tried_again(impl: str) -> None:
    async with serving() as gateway, proxy_to(gateway.port) as proxy:

        async def reset_the_resume() -> None:
            proxy.upgrades = ["reset"]
            assert proxy.drop() == 1

        result = await conversation(proxy, impl, "resume", on_ready(reset_the_resume))
        await ended(gateway)
    assert_called_once(result, ["before", CALLED], gateway)
    assert result["reconnects"] == 1
    assert result["states"] == ["connecting", "open", "reconnecting", "open", "closed"]
    assert result["dials"] == 3


async def test_a_resume_whose_upgrade_is_never_answered_is_tried_again(impl: str) -> None:
    async with serving() as gateway, proxy_to(gateway.port) as proxy:

        async def hold_the_resume() -> None:
            proxy.upgrades = ["hold"]
            assert proxy.drop() == 1

        result = await conversation(proxy, impl, "resume", on_ready(hold_the_resume))
        await ended(gateway)
    assert_called_once(result, ["before", CALLED], gateway)
    assert result["reconnects"] == 1
    assert proxy.held == 1
    assert result["dials"] == 3


@pytest.mark.parametrize("upgrade", ["reset", "hold"])
async def test_a_first_connect_that_fails_is_tried_again(impl: str, upgrade: Upgrade) -> None:
    async with serving() as gateway, proxy_to(gateway.port) as proxy:
        proxy.upgrades = [upgrade]
        result = await conversation(proxy, impl, "start")
        await ended(gateway)
    assert_called_once(result, [CALLED], gateway)
    assert result["states"] == ["connecting", "open", "closed"]
    assert result["dials"] == 2
    assert proxy.held == (upgrade == "hold")


async def test_close_during_a_resume_attempt_ends_the_session_at_once(impl: str) -> None:
    async with serving() as gateway, proxy_to(gateway.port) as proxy:

        async def hold_the_resume() -> None:
            proxy.upgrades = ["hold"]
            assert proxy.drop() == 1
            await proxy.wait_until(lambda: proxy.held == 1)

        result = await conversation(proxy, impl, "close_held", on_ready(hold_the_resume))
        assert result["closedWhile"] == "reconnecting"
        await ended(gateway)  # not after session_ttl (120 s)
    assert result["error"] is None
    assert result["answers"] == ["before"]


async def test_close_between_attempts_ends_the_session_at_once(impl: str) -> None:
    async with serving() as gateway, proxy_to(gateway.port) as proxy:

        async def reset_the_resume() -> None:
            proxy.upgrades = ["reset"]
            assert proxy.drop() == 1

        result = await conversation(proxy, impl, "close_between", on_ready(reset_the_resume))
        assert result["closedWhile"] == "reconnecting"
        await ended(gateway)
    assert result["error"] is None
    assert result["answers"] == ["before"]
    assert result["dials"] == 2  # the first socket, the reset resume (DELETE ended it)


async def test_random_drops_change_no_transcript(impl: str) -> None:
    count, at_once = "24", "6"
    async with serving(scripted_pace=0.0) as gateway, proxy_to(gateway.port) as proxy:
        calm = await run_node(RANDOM_SCRIPT, proxy.url(), impl, count, at_once)
        accepted = proxy.accepted
        rng = random.Random(20_240_517)
        proxy.budget = lambda: rng.randint(2, 40)
        dropped = await run_node(RANDOM_SCRIPT, proxy.url(), impl, count, at_once)
        # Whether each session ended is not checked: a drop may take the close frame itself,
        # and then the gateway keeps the session until its session_ttl.
    assert [c["reconnects"] for c in calm] == [0] * 24
    assert accepted == 24
    expected = ["alpha beta gamma", CALLED, "A=a B=b", "the end"]
    assert [c["answers"] for c in calm] == [expected] * 24
    assert [c["answers"] for c in dropped] == [c["answers"] for c in calm]
    assert [c["runs"] for c in dropped] == [[1, 1, 1]] * 24  # one, then two calls: each once
    assert sum(c["reconnects"] for c in dropped) > 12  # the drops did happen (about 35 resumes)
