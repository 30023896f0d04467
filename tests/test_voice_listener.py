"""The listener's bound on a session's audio backlog (gateway/shell/voice_input.py), alone: a
speech worker that never answers (a stand-in pool) fills the backlog, the socket's reader then
waits for room, and closing the listener (the session ended, or its audio was turned off)
lets that reader go on at once, so no socket task is left waiting for ever."""

from __future__ import annotations

import asyncio
from typing import NoReturn

from gateway.core.audio import AudioSettings
from gateway.shell.voice_input import MAX_QUEUED, Listener

FRAME = b"\0\0" * 320  # 20 ms at 16 kHz


async def test_closing_the_listener_frees_a_reader_waiting_for_room() -> None:
    asked = asyncio.Event()

    async def stalled_pool() -> NoReturn:
        asked.set()
        await asyncio.Event().wait()  # the workers never come
        raise AssertionError("unreachable")

    loop = asyncio.get_running_loop()
    listener = Listener(
        AudioSettings(),
        workers=stalled_pool,
        feed=lambda event: None,
        answer_playing=lambda: None,
        clock=loop.time,
    )
    await listener.hear(FRAME)
    await asyncio.wait_for(asked.wait(), 5)  # the first frame is in the listener's hands
    for _ in range(MAX_QUEUED):  # the backlog fills
        await asyncio.wait_for(listener.hear(FRAME), 5)
    waiting = asyncio.create_task(listener.hear(FRAME))
    await asyncio.sleep(0)
    assert not waiting.done()  # no room: the socket's reader waits here
    await listener.aclose()
    await asyncio.wait_for(waiting, 5)  # and goes on once the listener is closed
