"""Usage metering and limits over real sockets, with the shipped Python SDK (docs/usage.md).

The gateway's meter reads a clock the tests hold (``runtime.meter.clock``): a window that
slides or a day that ends is a clock set forward, never a wait.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from client_sdk import ServerError, connect
from client_sdk.connection import connect_raw
from gateway.wire.v1 import (
    AudioDone,
    Error,
    InputSpeechStarted,
    InputSpeechStopped,
    Outbound,
    ResponseDone,
    SessionStart,
    TextDone,
    ToolStatus,
)
from tests.data.tools import gate, reset_gates
from tests.mock_llm import mock_llm
from tests.realtime_upstream import Call, RealtimeUpstream, Say
from tests.support import Gateway, serving
from tests.test_realtime_provider import AGENT as REALTIME_AGENT
from tests.test_realtime_provider import SILENCE, SPEECH, answer_battery, until
from tests.test_realtime_provider import say as say_pcm

KEY = "backend-key-0123456789abcdef"
OTHER_KEY = "other-key-0123456789abcdef"
OPS_KEY = "ops-key-0123456789abcdef0"
AUTH: dict[str, Any] = {
    "no_auth": False,
    "api_keys": f"backend:{KEY},other:{OTHER_KEY},ops:{OPS_KEY}",
    "token_secret": "s" * 40,
}
T0 = 1_796_472_000.5  # 2026-12-05 12:00:00.5 UTC


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def limited(tmp_path: Path, limits: str, **overrides: Any) -> AsyncIterator[Gateway]:
    path = tmp_path / "limits.toml"
    path.write_text(limits + '\n[usage]\nreaders = ["ops"]\n')
    async with serving(**{**AUTH, "limits": str(path), **overrides}) as gw:
        gw.runtime.meter.clock = Clock()
        yield gw


def clock(gw: Gateway) -> Clock:
    held = gw.runtime.meter.clock
    assert isinstance(held, Clock)
    return held


def http(gw: Gateway) -> httpx.AsyncClient:
    base = gw.url.replace("ws://", "http://").removesuffix("/v1/realtime")
    return httpx.AsyncClient(base_url=base, trust_env=False)


async def mint(gw: Gateway, user: dict[str, Any], key: str = KEY) -> str:
    async with http(gw) as client:
        answer = await client.post(
            "/v1/sessions", json={"user": user}, headers={"authorization": f"Bearer {key}"}
        )
    assert answer.status_code == 201, answer.text
    token: str = answer.json()["token"]
    return token


async def usage(gw: Gateway, as_key: str = OPS_KEY, **query: str) -> httpx.Response:
    await gw.runtime.meter.drain()  # the writes after each step, in the background
    async with http(gw) as client:
        return await client.get(
            "/v1/usage",
            params={"start": str(T0 - 3600), "end": str(T0 + 7 * 86_400), **query},
            headers={"authorization": f"Bearer {as_key}"},
        )


async def answer(conv: Any, text: str) -> str:
    return "".join([delta async for delta in conv.say(text)])


async def refused(conv: Any, text: str) -> ServerError:
    with pytest.raises(ServerError) as caught:
        await answer(conv, text)
    return caught.value


async def test_a_key_over_its_tokens_per_minute_is_refused_until_the_window_slides(tmp_path):
    async with (
        limited(tmp_path, "[keys.backend]\ntokens_per_minute = 10\n") as gw,
        connect(gw.url, api_key=KEY) as conv,
    ):
        events = conv.events()
        assert await answer(conv, "echo one two three") == "one two three"
        error = await refused(conv, "echo again")  # the first step's tokens fill the window
        assert error.code == "rate_limited"
        assert error.retryable
        assert error.event.limit is not None
        assert (error.event.limit.scope, error.event.limit.name) == ("key", "tokens_per_minute")
        # The window's oldest second, floor(T0), leaves it at floor(T0) + 60.
        assert error.retry_after == pytest.approx(math.floor(T0) + 60 - T0, abs=0.001)
        done = [e async for e in until_done(events, error.event.response_id)]
        assert done[-1].status == "failed"
        clock(gw).now += error.retry_after - 0.01
        assert (await refused(conv, "echo still")).code == "rate_limited"
        clock(gw).now += 0.02
        assert await answer(conv, "echo back") == "back"
        # The user's words were kept: the model had them all along.
        assert "echo again" in repr(gw.model.requests[-1].items)


async def until_done(events: Any, response_id: str | None) -> AsyncIterator[ResponseDone]:
    async for event in events:
        if isinstance(event, ResponseDone) and event.response_id == response_id:
            yield event
            return


PRICED = """
[prices.scripted]
input = 1000.0
output = 1000.0
"""


async def test_an_end_user_over_a_daily_cost_cap_is_refused_while_another_goes_on(tmp_path):
    limits = PRICED + "[keys.backend.end_users]\ncost_per_day = 0.01\n"
    async with limited(tmp_path, limits) as gw:
        alice = await mint(gw, {"id": "alice"})
        bob = await mint(gw, {"id": "bob"})
        async with connect(gw.url, token=alice) as conv:
            await answer(conv, "echo a b c d e f g h i j k l")  # some 30 tokens: 0.03
            error = await refused(conv, "echo more")
            assert error.code == "budget_exceeded"
            assert error.event.limit is not None
            assert error.event.limit.scope == "end_user"
            assert error.event.limit.name == "cost_per_day"
            midnight = (math.floor(T0 / 86_400) + 1) * 86_400
            assert error.retry_after == pytest.approx(midnight - T0, abs=0.01)
        async with connect(gw.url, token=bob) as conv:
            assert await answer(conv, "echo fine") == "fine"
        clock(gw).now = midnight + 1  # a new day
        async with connect(gw.url, token=alice) as conv:
            assert await answer(conv, "echo morning") == "morning"


async def test_a_token_may_carry_its_users_own_limits(tmp_path):
    limits = PRICED + "[keys.backend.end_users]\ncost_per_day = 100.0\n"
    async with limited(tmp_path, limits) as gw:
        token = await mint(gw, {"id": "carol", "limits": {"requests_per_minute": 1}})
        async with connect(gw.url, token=token) as conv:
            await answer(conv, "echo hi")
            error = await refused(conv, "echo hi")
            assert (error.code, error.event.limit.name) == (  # type: ignore[union-attr]
                "rate_limited",
                "requests_per_minute",
            )


async def test_an_agents_limit_holds_every_key(tmp_path):
    async with limited(tmp_path, "[agents.test]\nrequests_per_minute = 2\n") as gw:
        async with connect(gw.url, api_key=KEY) as conv:
            await answer(conv, "echo one")
        async with connect(gw.url, api_key=OTHER_KEY) as conv:
            await answer(conv, "echo two")
            error = await refused(conv, "echo three")
        assert error.event.limit is not None
        assert (error.code, error.event.limit.scope) == ("rate_limited", "agent")
        async with connect(gw.url, api_key=KEY) as conv:
            assert (await refused(conv, "echo four")).code == "rate_limited"


async def test_concurrent_sessions_of_an_end_user_are_capped(tmp_path):
    async with limited(tmp_path, "[keys.backend.end_users]\nconcurrent_sessions = 1\n") as gw:
        token = await mint(gw, {"id": "dave"})
        async with connect(gw.url, token=token) as conv:
            await answer(conv, "echo here")
            async with connect_raw(gw.url, token=token) as second:
                await second.send(SessionStart())
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await asyncio.wait_for(second.recv(), 10)
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 4029
            assert closed.value.rcvd.reason == "too many sessions: at most 1 for this user"
        other = await mint(gw, {"id": "erin"})  # another end user has a cap of their own
        async with connect(gw.url, token=other) as conv:
            assert await answer(conv, "echo mine") == "mine"


async def test_scripted_usage_read_back_matches_what_the_responses_reported(tmp_path):
    async with limited(tmp_path, PRICED) as gw:
        token = await mint(gw, {"id": "erin"})
        reported = {"input_tokens": 0, "output_tokens": 0, "cost": 0.0, "responses": 0}
        async with connect(gw.url, token=token) as conv:
            events = conv.events()
            for text in ("echo first answer", "echo a second one", "fallback please"):
                msg = await conv.post(text)
                async for event in events:
                    if isinstance(event, ResponseDone):
                        assert event.usage is not None
                        assert event.usage.cost is not None
                        reported["input_tokens"] += event.usage.input_tokens
                        reported["output_tokens"] += event.usage.output_tokens
                        reported["cost"] += event.usage.cost
                        reported["responses"] += 1
                        break
                assert msg
        read = await usage(gw, group_by="key,end_user,agent,model")
        assert read.status_code == 200, read.text
        (row,) = read.json()["rows"]
        assert (row["key"], row["end_user"], row["agent"], row["model"]) == (
            "backend",
            "erin",
            "test",
            "scripted",
        )
        assert row["steps"] == 3
        assert row["input_tokens"] == reported["input_tokens"]
        assert row["output_tokens"] == reported["output_tokens"]
        assert row["cost"] == pytest.approx(reported["cost"], abs=1e-6)
        assert read.json()["total"]["cost"] == row["cost"]


async def test_openai_usage_against_llmock_is_read_back_and_an_unknown_price_is_null(tmp_path):
    agent = Path(__file__).parent / "data" / "provider_agent.toml"
    async with mock_llm() as llm:
        await llm.script({"type": "reply", "text": "Hello from the mock."})
        async with limited(
            tmp_path,
            "[keys.backend]\nrequests_per_minute = 100\n",
            agent=str(agent),
            model="openai:mock-model",
            base_url=llm.base_url("openai"),
        ) as gw:
            async with connect(gw.url, api_key=KEY) as conv:
                events = conv.events()
                await conv.post("hi")
                done = [e async for e in first_done(events)].pop()
            assert done.usage is not None
            assert done.usage.cost is None  # mock-model has no price: unknown, not 0
            read = await usage(gw, group_by="model")
            (row,) = read.json()["rows"]
            assert row["model"] == "mock-model"
            assert (row["input_tokens"], row["output_tokens"]) == (
                done.usage.input_tokens,
                done.usage.output_tokens,
            )
            assert row["input_tokens"] > 0
            assert (row["cost"], row["unpriced_steps"]) == (None, 1)


async def first_done(events: Any) -> AsyncIterator[ResponseDone]:
    async for event in events:
        if isinstance(event, ResponseDone):
            yield event
            return


async def test_reading_usage_needs_a_key_and_a_key_reads_only_its_own(tmp_path):
    async with limited(tmp_path, PRICED) as gw:
        async with connect(gw.url, api_key=KEY) as conv:
            await answer(conv, "echo mine")
        async with connect(gw.url, api_key=OTHER_KEY) as conv:
            await answer(conv, "echo theirs")
        async with http(gw) as client:
            assert (await client.get("/v1/usage")).status_code == 401
        own = await usage(gw, as_key=OTHER_KEY, group_by="key")
        assert [row["key"] for row in own.json()["rows"]] == ["other"]
        assert (await usage(gw, as_key=OTHER_KEY, key="backend")).status_code == 403
        everyone = await usage(gw, group_by="key")  # the ops key reads them all
        assert [row["key"] for row in everyone.json()["rows"]] == ["backend", "other"]
        for query in (
            {"group_by": "colour"},
            {"start": "nan"},
            {"end": "inf"},
            {"start": "yesterday"},
            {"start": "2026-12-01T00:00:00"},  # no zone
            {"start": str(T0 - 100 * 86_400)},  # over 93 days
            {"start": str(T0 + 8 * 86_400)},  # after the end
        ):
            bad = await usage(gw, **query)
            assert (bad.status_code, bad.json()["code"]) == (400, "bad_query"), query
        iso = await usage(gw, start="2026-12-05T00:00:00Z", end="2026-12-06T00:00:00+00:00")
        assert iso.json()["total"]["steps"] == 2


REALTIME_PRICES = """
[prices.gpt-realtime]
input = 4.0
output = 16.0
input_audio = 32.0
output_audio = 64.0
"""


async def test_a_voice_conversations_usage_is_read_back_with_its_audio(tmp_path):
    """A speech-to-speech model (the scripted OpenAI Realtime upstream): audio tokens priced
    at the audio rate, the client function and the seconds heard and spoken counted."""
    reset_gates()
    script = [Call("get_battery_level", {}), Say("Your battery is at 82 percent.")]
    agent = tmp_path / "agent.toml"
    agent.write_text(REALTIME_AGENT.read_text())
    async with RealtimeUpstream(script, transcripts=["what is my battery level"]) as upstream:
        base = upstream.openai_url.removesuffix("/realtime")
        async with (
            limited(tmp_path, REALTIME_PRICES, agent=str(agent), base_url=base) as gw,
            connect(gw.url, api_key=KEY, audio={"input_rate": 16000, "output_rate": 24000}) as conv,
        ):
            answer_battery(conv)
            await conv.start()
            events, seen = conv.events(), list[Outbound]()
            await say_pcm(conv, SILENCE[:8000] + SPEECH + SILENCE)
            spoken = await until(events, AudioDone, seen)
            done = next(e for e in seen if isinstance(e, ResponseDone))
            heard = [e for e in seen if isinstance(e, InputSpeechStarted | InputSpeechStopped)]
            read = await usage(gw, group_by="key,model")
    assert done.usage is not None
    assert done.usage.output_audio_tokens > 0
    assert done.usage.cost is not None
    (row,) = read.json()["rows"]
    assert (row["key"], row["model"]) == ("backend", "gpt-realtime")
    for name in ("input_tokens", "output_tokens", "input_audio_tokens", "output_audio_tokens"):
        assert row[name] == getattr(done.usage, name), name
    assert row["cost"] == pytest.approx(done.usage.cost, abs=1e-6)
    assert row["tool_calls"] == {"client": 1}
    assert row["audio_out_seconds"] == spoken.audio_ms / 1000
    started, stopped = heard[0], heard[1]
    assert isinstance(started, InputSpeechStarted)
    assert isinstance(stopped, InputSpeechStopped)
    assert row["audio_in_seconds"] == (stopped.offset_ms - started.offset_ms) / 1000


@pytest.mark.parametrize("provider", ["openai-realtime", "gemini-live"])
async def test_a_refused_spoken_turn_is_never_answered_by_a_later_one(tmp_path, provider):
    """A speech-to-speech step over its limit: the answer an upstream that answers speech on
    its own (Gemini Live) began anyway is dropped, so the next turn gets its own answer."""
    reset_gates()
    script = [Say("first"), Say("second"), Say("third")]
    text = REALTIME_AGENT.read_text()
    if provider == "gemini-live":
        text = text.replace('"openai-realtime"', '"gemini-live"').replace("gpt-realtime", "live")
    agent = tmp_path / "agent.toml"
    agent.write_text(text)
    async with RealtimeUpstream(script, transcripts=["one", "two", "three"]) as upstream:
        base = (
            upstream.gemini_url
            if provider == "gemini-live"
            else upstream.openai_url.removesuffix("/realtime")
        )
        limits = "[agents.realtime_test]\nrequests_per_minute = 1\n"
        async with (
            limited(tmp_path, limits, agent=str(agent), base_url=base) as gw,
            connect(gw.url, api_key=KEY, audio={"input_rate": 16000, "output_rate": 24000}) as conv,
        ):
            await conv.start()
            events = conv.events()

            async def spoken_turn() -> list[Outbound]:
                seen: list[Outbound] = []
                await say_pcm(conv, SILENCE[:8000] + SPEECH + SILENCE)
                await until(events, ResponseDone, seen)
                return seen

            first = await spoken_turn()
            refused_turn = await spoken_turn()
            clock(gw).now += 61
            third = await spoken_turn()
    assert [e.text for e in first if isinstance(e, TextDone)] == ["first"]
    error = next(e for e in refused_turn if isinstance(e, Error))
    assert error.code == "rate_limited"
    assert [e.status for e in refused_turn if isinstance(e, ResponseDone)] == ["failed"]
    assert not [e for e in refused_turn if isinstance(e, TextDone)]
    # OpenAI Realtime is asked for each answer: the refused turn's was never asked for.
    expected = "third" if provider == "gemini-live" else "second"
    assert [e.text for e in third if isinstance(e, TextDone)] == [expected]


@pytest.mark.parametrize("redis", [True], indirect=True, ids=["aof"])  # data kept on restart
async def test_a_limit_that_cannot_be_checked_refuses_the_step_and_the_session_lives(
    tmp_path, redis
):
    """The usage ledger on Redis, Redis gone: the step is not started (a budget is not
    waived), the client is told, and once Redis is back the same session goes on."""
    async with (
        limited(tmp_path, "[keys.backend]\nrequests_per_minute = 100\n", store=redis.url) as gw,
        connect(gw.url, api_key=KEY) as conv,
    ):
        assert await answer(conv, "echo before") == "before"
        redis.stop()
        error = await refused(conv, "echo during")
        assert (error.code, error.retryable) == ("usage_unavailable", True)
        redis.start()
        assert await answer(conv, "echo after") == "after"


async def test_a_tool_in_flight_is_not_interrupted_by_a_refused_step(tmp_path):
    """The step after an async tool's pending answer is refused: the response fails, the
    tool runs on and its completion still reaches the client."""
    reset_gates()
    async with (
        limited(tmp_path, "[keys.backend]\nrequests_per_minute = 1\n") as gw,
        connect(gw.url, api_key=KEY) as conv,
    ):
        events = conv.events()
        await conv.post("order A1")
        seen: list[Outbound] = []
        await until(events, ResponseDone, seen)
        pending = [e for e in seen if isinstance(e, ToolStatus)]
        assert [e.status for e in pending] == ["pending"]
        errors = [e.code for e in seen if isinstance(e, Error)]
        assert errors == ["rate_limited"]
        gate("order:A1").set()
        completed = await until(events, ToolStatus, seen)
        assert completed.status == "completed"
        assert completed.result == {"order_id": "A1", "status": "shipped"}
