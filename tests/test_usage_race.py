"""The race LiteLLM's users met: concurrent first requests of a new end user overspending
a budget. Here 50 sessions of one new end user, spread over three gateway processes on one
redis-server, all start a turn at once against a daily cost cap; the reservation before
each step is one Redis script over all the limits, so the total spent may pass the cap by
at most one step's estimate per node (docs/usage.md, "How a step is checked").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from client_sdk import Conversation, ServerError, connect
from gateway.auth.limits import Budgets
from gateway.shell.meter import step_estimate
from tests.cluster import CLUSTER_AGENT, Cluster
from tests.redis_server import RedisServer
from tests.support import serving

pytestmark = pytest.mark.slow

KEY = "backend-key-0123456789abcdef"
SECRET = "usage-race-token-secret-0123456789abcdef"
SESSIONS = 50
MESSAGE = "echo a reply of seven words right here"
LIMITS = """
[prices.scripted]
input = 10.0        # per million tokens: 0.00001 a token
output = 10.0

[estimate]
output_tokens = 8   # near the scripted reply's, so that the estimate means something

[keys.backend.end_users]
cost_per_day = 0.05
"""


@pytest.fixture
async def nodes(redis: RedisServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    limits = tmp_path / "limits.toml"
    limits.write_text(LIMITS)
    keys = tmp_path / "keys.txt"
    keys.write_text(f"backend:{KEY}\n")
    auth = ["--api-keys-file", str(keys), "--token-secret", SECRET]
    cluster = Cluster(tmp_path, redis.url, auth=auth, args=["--limits", str(limits)])
    try:
        await cluster.start()
        yield cluster
    finally:
        cluster.stop()


async def one_step_estimate(tmp_path: Path) -> int:
    """The reservation of one turn's step, as a node makes it: the same agent asked the
    same message in this process, its request estimated by the meter's own function."""
    async with serving(agent=str(CLUSTER_AGENT)) as gw:
        async with connect(gw.url) as conv:
            async for _ in conv.say(MESSAGE):
                pass
        request = gw.model.requests[0]
    path = tmp_path / "limits.toml"
    path.write_text(LIMITS)
    budgets = Budgets.load(path)
    _, cost = step_estimate(request, budgets.spec.estimate.output_tokens, budgets.price("scripted"))
    return cost


async def test_fifty_sessions_of_a_new_end_user_on_three_nodes_overspend_by_at_most_an_estimate(
    nodes: Cluster, tmp_path: Path
):
    async with httpx.AsyncClient(base_url=nodes.nodes[0].url, trust_env=False) as client:
        minted = await client.post(
            "/v1/sessions",
            json={"user": {"id": "new-user"}},
            headers={"authorization": f"Bearer {KEY}"},
        )
        assert minted.status_code == 201, minted.text
        token = minted.json()["token"]
    outcomes: Counter[str] = Counter()
    async with contextlib.AsyncExitStack() as stack, asyncio.timeout(60):
        convs = [
            await stack.enter_async_context(
                connect(f"ws://127.0.0.1:{nodes.nodes[i % 3].port}/v1/realtime", token=token)
            )
            for i in range(SESSIONS)
        ]
        await asyncio.gather(*(conv.start() for conv in convs))
        go = asyncio.Event()

        async def turn(conv: Conversation) -> None:
            await go.wait()
            try:
                text = "".join([d async for d in conv.say(MESSAGE)])
            except ServerError as exc:
                outcomes[exc.code] += 1
            else:
                assert text == MESSAGE.removeprefix("echo ")
                outcomes["answered"] += 1

        turns = [asyncio.create_task(turn(conv)) for conv in convs]
        go.set()  # every session's turn at once
        await asyncio.gather(*turns)
    assert set(outcomes) <= {"answered", "budget_exceeded"}, (outcomes, nodes.report())
    async with httpx.AsyncClient(base_url=nodes.nodes[1].url, trust_env=False) as client:

        async def read_back() -> dict[str, Any]:
            read = await client.get(
                "/v1/usage",
                params={"group_by": "end_user"},
                headers={"authorization": f"Bearer {KEY}"},
            )
            assert read.status_code == 200, read.text
            (row,) = read.json()["rows"]
            return row  # type: ignore[no-any-return]

        # Each node writes a step's usage just after its response.done: no event to wait on.
        async with asyncio.timeout(10):
            while (row := await read_back())["steps"] < outcomes["answered"]:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    spent = row["cost"]
    estimate = await one_step_estimate(tmp_path) / 1_000_000
    cap = 0.05
    over = spent - cap
    print(
        f"\n{SESSIONS} sessions of one new end user on 3 nodes, cap {cap}: "
        f"{outcomes['answered']} answered, {outcomes['budget_exceeded']} refused; "
        f"spent {spent:.6f} ({over:+.6f} against the cap); one step's estimate {estimate:.6f}, "
        f"its real cost {spent / max(outcomes['answered'], 1):.6f}"
    )
    assert row["steps"] == outcomes["answered"]
    assert outcomes["budget_exceeded"] > 0  # the cap was reached: the race was run
    assert spent <= cap + 3 * estimate
