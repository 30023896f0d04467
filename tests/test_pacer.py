"""The pacer: one loop timer for the paced callbacks due in the same millisecond."""

from __future__ import annotations

import asyncio

import pytest

from gateway.providers.pacer import RESOLUTION, Pacer, pacer


async def test_callbacks_run_in_the_order_of_their_times():
    loop = asyncio.get_running_loop()
    ran: list[str] = []
    done = loop.create_future()
    p = Pacer(loop)
    now = loop.time()
    p.call_at(now + 0.004, lambda: ran.append("c"))
    p.call_at(now + 0.001, lambda: ran.append("a"))
    p.call_at(now + 0.002, lambda: ran.append("b"))
    p.call_at(now + 0.006, lambda: done.set_result(None))
    await asyncio.wait_for(done, 5)
    assert ran == ["a", "b", "c"]


async def test_callbacks_due_in_one_slot_share_one_loop_timer(monkeypatch: pytest.MonkeyPatch):
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    real_call_at = loop.call_at
    p = Pacer(loop)

    def counting_call_at(when, callback, *args, **kwargs):  # type: ignore[no-untyped-def]
        if getattr(callback, "__self__", None) is p:
            armed.append(when)
        return real_call_at(when, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counting_call_at)
    ran: list[int] = []
    done = loop.create_future()
    slot_start = (int(loop.time() / RESOLUTION) + 5) * RESOLUTION
    for k in range(100):  # all within one slot
        p.call_at(slot_start + RESOLUTION * k / 200, lambda k=k: ran.append(k))
    p.call_at(slot_start + 3 * RESOLUTION, lambda: done.set_result(None))
    await asyncio.wait_for(done, 5)
    assert ran == list(range(100))
    # One timer for the hundred (not one each), and one for the last, 3 ms later, unless
    # the loop ran the first one late enough that the last was due by then too (a busy
    # machine): then the one timer served all of them.
    assert armed[0] <= slot_start + RESOLUTION
    assert len(armed) in (1, 2)


async def test_a_slot_that_came_due_while_callbacks_ran_is_not_held_back():
    """A callback arming the timer for its own next turn must not delay a sooner slot
    already waiting (the regression: every stream then waited for the slowest one)."""
    loop = asyncio.get_running_loop()
    p = Pacer(loop)
    ran: list[str] = []
    done = loop.create_future()
    now = loop.time()

    def first() -> None:
        ran.append("first")
        p.call_at(loop.time() + 0.050, lambda: (ran.append("later"), done.set_result(None)))

    p.call_at(now + 0.001, first)
    p.call_at(now + 0.003, lambda: ran.append("sooner"))
    loop.call_at(now + 0.020, lambda: ran.append("plain timer"))
    await asyncio.wait_for(done, 5)
    assert ran == ["first", "sooner", "plain timer", "later"]


async def test_a_failing_callback_does_not_stop_the_others():
    loop = asyncio.get_running_loop()
    p = Pacer(loop)
    ran: list[str] = []
    done = loop.create_future()
    slot = loop.time() + 0.002

    def fails() -> None:
        raise RuntimeError("boom")

    p.call_at(slot, fails)
    p.call_at(slot, lambda: ran.append("after"))
    p.call_at(slot + 0.002, lambda: done.set_result(None))
    await asyncio.wait_for(done, 5)
    assert ran == ["after"]


async def test_each_running_loop_has_its_own_pacer():
    assert pacer() is pacer()
    other = await asyncio.to_thread(lambda: asyncio.run(_pacer_of_new_loop()))
    assert other is not pacer()


async def _pacer_of_new_loop() -> Pacer:
    return pacer()
