"""v1 as JSON text frames next to ``gateway.v1.msgpack``: bytes per turn, and CPU per frame.

The gateway runs as its own process (``bench.server_process``) with the test agent's
scripted model, unpaced; one client per framing, alternating, sends ``TURNS`` questions on
one session each (``echo`` and twelve words back: ``response.created``, twelve
``text.delta``, ``text.done``, ``response.done``, and the ack every 64 events), and counts
the bytes of every frame both ways (WebSocket payloads: the headers are the same two to four
bytes a frame either way). The gateway's CPU over each client's turns, divided by the frames
it sent, is its cost per frame.

    .venv/bin/python -m bench.msgpack_frames [--turns 400]
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import msgspec
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from bench.server_process import cpu_seconds, gateway, pin_self
from gateway.wire.msgpack import SUBPROTOCOL_MSGPACK

AGENT = Path(__file__).resolve().parent.parent / "tests" / "data" / "agent.toml"
WORDS = "one two three four five six seven eight nine ten eleven twelve"


class Tally:
    def __init__(self) -> None:
        self.up = self.down = self.frames = 0
        self.cpu = 0.0


async def turns(ws: ClientConnection, msgpack: bool, count: int, tally: Tally, pid: int) -> None:
    def encode(msg: dict[str, Any]) -> bytes | str:
        return msgspec.msgpack.encode(msg) if msgpack else msgspec.json.encode(msg).decode()

    def decode(frame: bytes | str) -> Any:
        if isinstance(frame, bytes) and msgpack:
            return msgspec.msgpack.decode(frame)
        return msgspec.json.decode(frame)

    async def send(msg: dict[str, Any]) -> None:
        frame = encode(msg)
        tally.up += len(frame.encode() if isinstance(frame, str) else frame)
        await ws.send(frame)

    await send({"type": "session.start"})
    decode(await ws.recv())
    last_seq = 0
    before = cpu_seconds(pid)
    for n in range(count):
        await send({"type": "user.message", "id": f"m{n}", "text": f"echo {WORDS}"})
        while True:
            frame = await ws.recv()
            tally.down += len(frame.encode() if isinstance(frame, str) else frame)
            tally.frames += 1
            event = decode(frame)
            last_seq = event.get("seq", last_seq) or last_seq
            if event["type"] == "response.done":
                break
        if n % 4 == 3:  # an ack every few turns, as the SDK does every 64 events
            await send({"type": "ack", "seq": last_seq})
    tally.cpu += cpu_seconds(pid) - before


async def main(count: int) -> None:
    pin_self()
    tallies = {"json": Tally(), "msgpack": Tally()}
    with gateway(AGENT, "--scripted-pace", "0") as served:
        url = f"ws://127.0.0.1:{served.port}/v1/realtime"
        for _round in range(4):  # alternating, so that neither gets the warmer process
            for name, tally in tallies.items():
                protocol = SUBPROTOCOL_MSGPACK if name == "msgpack" else "gateway.v1"
                async with ws_connect(url, subprotocols=[protocol]) as ws:  # type: ignore[list-item]
                    await turns(ws, name == "msgpack", count // 4, tally, served.pid)
    print(f"{count} turns each (echo of {len(WORDS.split())} words: 15 events a turn)")
    json_tally = tallies["json"]
    for name, tally in tallies.items():
        per_turn = (tally.up + tally.down) / count
        saved = 1 - (tally.up + tally.down) / (json_tally.up + json_tally.down)
        print(
            f"{name:<8} {per_turn:7.0f} bytes a turn ({tally.up / count:.0f} up,"
            f" {tally.down / count:.0f} down; {saved:5.1%} less than JSON),"
            f" gateway CPU {tally.cpu * 1e6 / tally.frames:5.1f} µs per frame sent"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--turns", type=int, default=400)
    asyncio.run(main(parser.parse_args().turns))
