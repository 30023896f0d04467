"""The bounded transcript over real sockets: oversized results, memory, the history budget."""

from __future__ import annotations

import gc
import tracemalloc

from gateway.core.history import items_size
from gateway.core.transcript import AssistantTurn, ToolOutcome, UserTurn
from gateway.wire.v1 import Error, ResponseDone, ToolResult, ToolResults, ToolStatus
from tests.support import say, say_until_calls, serving, session, streamed_text

MIB = 2**20
BIG_OUTPUT = {"value": "x" * MIB}
"""A result of 1 MiB: fits the test's 4 MiB frames, is over the 256 KiB default cap."""


async def _answer_big(conn) -> list:  # type: ignore[no-untyped-def, type-arg]
    calls = await say_until_calls(conn, "one")
    (call,) = calls.calls
    result = ToolResult(call_id=call.call_id, tool=call.tool, output=BIG_OUTPUT)
    await conn.send(ToolResults(id=f"r-{call.call_id}", results=[result]))
    return await conn.recv_until(lambda e: isinstance(e, ResponseDone))


async def test_a_1_mib_client_result_is_refused_and_the_session_goes_on():
    async with serving(ws_max_size=4 * MIB) as gateway, session(gateway.url) as (conn, created):
        assert created.limits is not None  # the cap is told, so a client can stay inside it
        assert created.limits.max_tool_result_size == 256 * 2**10
        events = await _answer_big(conn)
        error, status = events[0], events[1]
        assert isinstance(error, Error)
        assert error.code == "invalid_result"
        assert "max_tool_result_size" in error.message
        assert str(256 * 2**10) in error.message
        assert isinstance(status, ToolStatus)
        assert status.status == "failed"
        assert streamed_text(events).startswith("A failed: result too large")
        # The next turn works, and the session kept a few hundred characters, not a MiB.
        assert streamed_text(await say(conn, "echo still here")) == "still here"
        (driver,) = gateway.runtime.drivers.values()
        assert driver.session.history_size < 1_000
        # No copy reached the model either.
        assert all(items_size(r.items) < 1_000 for r in gateway.model.requests)


async def test_60_oversized_results_leave_memory_flat():
    async with serving(ws_max_size=4 * MIB) as gateway, session(gateway.url) as (conn, _):
        # Traced from the start, so that buffers the first rounds grow are traced too
        # (a block allocated before tracing and replaced after would count as growth).
        tracemalloc.start()
        try:
            for _ in range(5):  # warm-up: first-use allocations and buffers at their size
                await _answer_big(conn)
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(55):
                events = await _answer_big(conn)
                assert any(isinstance(e, Error) and e.code == "invalid_result" for e in events)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        (driver,) = gateway.runtime.drivers.values()
        history_size = driver.session.history_size
    print(f"memory grown over 55 oversized results: {grown} bytes; history {history_size}")
    # Kept, each result would add 1 MiB (55 MiB in all); refused, each round adds a few
    # KiB: its events in the replay log, its transcript entries, the test's recording of
    # every model request, the captured log lines.
    assert grown < 55 * 64 * 2**10, grown
    assert history_size < 60 * 300, history_size


async def test_60_accepted_1_mib_results_leave_memory_within_the_documented_bound():
    # The cap raised above 1 MiB: every result is kept, in the transcript until the
    # history budget drops its turn, and the scripted model says it back (1 MiB of text
    # in the replay log). The call ledger keeps no payload once the model has it.
    overrides = {"ws_max_size": 4 * MIB, "max_tool_result_size": 2 * MIB}
    async with serving(**overrides) as gateway, session(gateway.url) as (conn, _):
        tracemalloc.start()
        try:
            for _ in range(5):
                await _answer_big(conn)
            gateway.model.requests.clear()  # the test's own recording of what the model saw
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(55):
                events = await _answer_big(conn)
                assert streamed_text(events) == "A=" + BIG_OUTPUT["value"]
                gateway.model.requests.clear()
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        (driver,) = gateway.runtime.drivers.values()
        kept_calls = driver.session.state().calls
    print(f"memory grown over 55 accepted 1 MiB results: {grown} bytes")
    # The documented bound (docs/limits.md): transcript max_history_chars plus the turn in
    # progress (2 MiB: the result and its echo), replay log replay_max_size (4 MiB), the
    # ledger without payloads. Kept whole, 55 results would be 110 MiB.
    assert grown < 8 * MIB, grown
    assert all(c.output is None and not c.args for c in kept_calls if c.settled)


async def test_a_long_conversation_stays_within_the_history_budget():
    budget = 2_000
    async with serving(max_history_chars=budget) as gateway, session(gateway.url) as (conn, _):
        for turn in range(40):
            if turn % 5 == 4:  # now and then a turn with a client-function call
                calls = await say_until_calls(conn, "one")
                (call,) = calls.calls
                result = ToolResult(
                    call_id=call.call_id, tool=call.tool, output={"value": f"v{turn}"}
                )
                await conn.send(ToolResults(results=[result]))
                events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
                assert streamed_text(events) == f"A=v{turn}"
                continue
            words = " ".join(f"w{turn}x{n}" for n in range(20))
            assert streamed_text(await say(conn, f"echo {words}")) == words
        requests = gateway.model.requests
    assert len(requests) == 32 + 2 * 8  # 32 echo turns; 8 call turns of two model steps
    assert sum(items_size(r.items) for r in requests) > 10 * budget  # the budget was needed
    for request in requests:
        assert items_size(request.items) <= budget
        assert isinstance(request.items[0], UserTurn)  # whole turns only
        asked = {c.call_id for i in request.items if isinstance(i, AssistantTurn) for c in i.calls}
        answered = {i.call_id for i in request.items if isinstance(i, ToolOutcome)}
        assert answered <= asked  # no outcome without its call
    # The last request ends with the turn in progress: the call turn 39, whole.
    last = requests[-1].items
    assert last[-3] == UserTurn(text="one")
    assert isinstance(last[-2], AssistantTurn)
    assert len(last[-2].calls) == 1
    assert last[-1] == ToolOutcome(
        call_id=last[-2].calls[0].call_id, name="device_a", output={"value": "v39"}
    )
    assert len(last) < 2 * 40
