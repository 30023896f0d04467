"""Agent builders test a tool by itself: GET /v1/tools and POST /v1/tools/{name}/test."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support import serving


@pytest.fixture
async def http():
    async with serving() as gateway:
        base = gateway.url.replace("ws://", "http://").removesuffix("/v1/realtime")
        async with httpx.AsyncClient(base_url=base) as client:
            yield client


async def test_tools_are_listed_with_their_schemas(http):
    answer = (await http.get("/v1/tools")).json()
    tools = {t["name"]: t for t in answer["tools"]}
    assert answer["agent"] == "test"
    assert tools["add"]["kind"] == "server"
    assert tools["add"]["input_schema"]["required"] == ["a", "b"]
    assert tools["lookup_order"]["execution"] == "async"
    assert tools["device_a"]["kind"] == "client"


@pytest.mark.parametrize(
    ("tool", "body", "status", "key", "words"),
    [
        ("add", b'{"a": 2, "b": 40}', 200, "output", {"total": 42}),
        ("add", b'{"a": "two"}', 422, "error", "invalid input"),
        ("add", b"{nope", 400, "error", "not JSON"),
        ("explode", b"{}", 200, "error", "ValueError: kaboom"),
        ("wrong_shape", b"{}", 200, "error", "output schema"),
        ("device_a", b"{}", 400, "error", "client function"),
        ("teleport", b"{}", 404, "error", "no tool"),
        ("hang", b"{}", 200, "error", "tool_timeout: no result within 0.3 s"),
    ],
)
async def test_running_a_tool_by_itself(http, tool, body, status, key, words):
    started = time.perf_counter()
    response = await http.post(f"/v1/tools/{tool}/test", content=body)
    took_ms = (time.perf_counter() - started) * 1000
    assert response.status_code == status
    answer = response.json()
    if isinstance(words, dict):
        assert answer[key] == words
    else:
        assert words in answer[key]
    if status != 200:  # the tool never ran: nothing was timed
        assert set(answer) == {"error"}
        return
    # The tool ran: the answer says how long, in ms to a tenth, within the request's time.
    assert set(answer) == {key, "duration_ms"}
    assert isinstance(answer["duration_ms"], float)
    assert 0 <= answer["duration_ms"] <= took_ms
    if tool == "hang":  # timed out at its own timeout (0.3 s): the run lasted that long
        assert answer["duration_ms"] >= 300


async def test_the_web_demo_and_the_sdk_are_served(http):
    page = await http.get("/")
    assert page.status_code == 200
    assert "<html" in page.text.lower()
    assert (await http.get("/sdk/protocol.schema.json")).status_code == 200
