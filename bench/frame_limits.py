"""What a costly frame costs the other sessions: their ping round trips meanwhile.

Runs the gateway in-process on a free port with the test agent; client and server share one
event loop and one core (figures include both ends). For each case, one session sends a
``session.update`` while another pings one ping at a time until the update is answered.
Prints the time to the answer and the victim's round trips; asserts nothing.

    .venv/bin/python -m bench.frame_limits
"""

from __future__ import annotations

import asyncio
import json
import statistics
from typing import Any

from client_sdk import Connection
from gateway.logging import configure_logging
from gateway.schema_worker import SchemaWorker
from tests.support import running_gateway, session

__all__: list[str] = []


def _frame(schema: dict[str, Any], functions: int = 1) -> str:
    declared = [
        {"name": f"f_{n}", "description": "d", "input_schema": schema} for n in range(functions)
    ]
    return json.dumps({"type": "session.update", "client_functions": declared})


def _at_limit(salt: int) -> dict[str, Any]:
    # 500 nodes of empty subschemas, made distinct so the cache does not answer.
    return {"type": "object", "allOf": [{}] * 496 + [{"title": f"v{salt}"}]}


CASES: list[tuple[str, Any]] = [
    ("costly allOf 40k (refused)", lambda n: {"type": "object", "allOf": [{}] * 40_000}),
    ("100 deep (refused)", lambda n: _deep(100)),
    ("500 nodes, new (checked)", _at_limit),
]


def _deep(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


async def _measure(
    victim: Connection, client: Connection, frame: str, frame_kind: str
) -> tuple[float, list[float]]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    await client.send_raw(frame)
    answer = asyncio.ensure_future(client.recv(within=120))
    took = 0.0
    rtts = []
    while True:
        sent = loop.time()
        await victim.send_raw(json.dumps({"type": "ping"}))
        await victim.recv(within=120)
        rtts.append(loop.time() - sent)
        if answer.done():
            took = took or loop.time() - started
            break
    kind = type(await answer).__name__
    assert kind == ("SessionUpdated" if "checked" in frame_kind else "Error"), kind
    return took, rtts


async def main() -> None:
    for offload in (True, False):
        async with running_gateway() as url:
            if not offload:
                SchemaWorker.check = _no_offload  # type: ignore[method-assign]
            async with session(url) as (victim, _), session(url) as (client, _):
                for name, build in CASES:
                    samples = [
                        await _measure(victim, client, _frame(build(n)), name) for n in range(5)
                    ]
                    took = statistics.median(t for t, _ in samples)
                    rtts = [r for _, rs in samples for r in rs]
                    where = "worker" if offload else "event loop"
                    print(
                        f"{name:<28} check on {where:<13} answer p50 {took * 1000:7.1f} ms"
                        f"  victim ping n={len(rtts):<4} p50 {statistics.median(rtts) * 1000:6.1f}"
                        f" ms  max {max(rtts) * 1000:6.1f} ms"
                    )
    SchemaWorker.check = _ORIGINAL  # type: ignore[method-assign]


_ORIGINAL = SchemaWorker.check


async def _no_offload(self: SchemaWorker, schemas: list[dict[str, Any]]) -> None:
    """The core checks new schemas itself, on the event loop (as before the worker)."""


if __name__ == "__main__":
    configure_logging("warning")
    asyncio.run(main())
