"""What a speech-to-speech model's audio costs through the gateway: first audio byte, and CPU.

The upstream is the scripted realtime model of the tests (``tests/realtime_upstream``,
OpenAI Realtime protocol), in this process; the gateway runs as a process of its own
(``bench.server_process``) with an agent whose model is that upstream (``openai-realtime``).
Each turn is a typed question and a spoken answer of ``ANSWER`` (tones, in 20 ms deltas,
sent as fast as the upstream makes them):

- straight: a client of the upstream sends the question (``conversation.item.create``,
  ``response.create``) and times its first ``response.output_audio.delta``;
- through the gateway: a v1 client with audio on sends ``user.message`` and times the first
  binary frame of the answer's audio. The gateway gives the question to the upstream, asks
  for the response, and relays each delta as a frame.

Turns alternate between the two; the difference of the p50s is what the gateway adds. The
gateway process's CPU over its turns, per 20 ms delta relayed, is the relay's cost (with the
question and the text events of the answer counted in it).

    .venv/bin/python -m bench.realtime_relay [--turns 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from bench.figure import percentile
from bench.server_process import cpu_seconds, gateway, pin_self
from client_sdk import connect
from client_sdk.client import Conversation
from gateway.wire.audio_frame import AnswerAudio
from gateway.wire.v1 import AudioDone, Outbound
from tests.realtime_upstream import RealtimeUpstream, Say

ANSWER = "The relay speaks this sentence, about three seconds of audio, in many deltas."
CHUNK_MS = 20


async def straight(ws: ClientConnection) -> float:
    """Seconds from the question to the first audio delta, straight from the upstream."""
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}
    start = time.perf_counter()
    await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
    await ws.send(json.dumps({"type": "response.create"}))
    first = None
    async for frame in ws:
        event = json.loads(frame)
        if first is None and event["type"] == "response.output_audio.delta":
            first = time.perf_counter() - start
        if event["type"] == "response.done":
            assert first is not None
            return first
    raise RuntimeError("the upstream closed")


async def through(
    conv: Conversation,
    events: AsyncIterator[Outbound],
    audio: AsyncIterator[AnswerAudio],
    spoken: set[str],
) -> float:
    """Seconds from the question to the first frame of audio through the gateway (the
    turn is read to its ``audio.done``)."""
    start = time.perf_counter()
    await conv.post("go")
    while (await anext(audio)).response_id in spoken:
        pass  # frames of the turns before, read now (this counts them against the gateway)
    first = time.perf_counter() - start
    async for event in events:
        if isinstance(event, AudioDone):
            spoken.add(event.response_id)
            return first
    raise RuntimeError("the gateway closed")


async def main(turns: int) -> None:
    pin_self()
    script = [Say(ANSWER)] * (2 * turns + 4)
    async with RealtimeUpstream(script, chunk_ms=CHUNK_MS) as upstream:
        base = upstream.openai_url.removesuffix("/realtime")
        with tempfile.TemporaryDirectory() as folder:
            agent = Path(folder) / "agent.toml"
            agent.write_text(
                'name = "relay"\ninstructions = "Speak."\n[model]\n'
                f'provider = "openai-realtime"\nmodel = "bench"\nbase_url = "{base}"\n'
            )
            with gateway(agent) as served:
                url = f"ws://127.0.0.1:{served.port}/v1/realtime"
                async with (
                    ws_connect(upstream.openai_url) as ws,
                    connect(url, audio={"output_rate": 24000}) as conv,
                ):
                    await ws.recv()  # session.created
                    await conv.start()
                    events, audio = conv.events(), conv.audio()
                    await straight(ws)  # warm both paths
                    spoken: set[str] = set()
                    await through(conv, events, audio, spoken)
                    direct: list[float] = []
                    relayed: list[float] = []
                    cpu = 0.0
                    for _ in range(turns):
                        direct.append(await straight(ws))
                        before = cpu_seconds(served.pid)
                        relayed.append(await through(conv, events, audio, spoken))
                        cpu += cpu_seconds(served.pid) - before
    deltas = len(ANSWER) * 60 // CHUNK_MS  # the scripted voice: 60 ms a character
    print(
        f"turns={turns}  answer={len(ANSWER) * 60} ms of audio in {deltas} deltas of {CHUNK_MS} ms"
    )
    for label, samples in (
        ("straight from the upstream", direct),
        ("through the gateway", relayed),
    ):
        cells = "  ".join(f"p{p}={percentile(samples, p) * 1000:6.2f}" for p in (50, 90, 99))
        print(f"first audio byte, {label:<28} {cells} ms")
    added = percentile(relayed, 50) - percentile(direct, 50)
    print(f"added by the gateway (p50 difference): {added * 1000:.2f} ms")
    per_delta = cpu * 1e6 / (turns * deltas)
    print(
        f"gateway CPU: {cpu * 1000 / turns:.1f} ms a turn, {per_delta:.0f} µs"
        f" per {CHUNK_MS} ms delta relayed (the turn's other work included)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--turns", type=int, default=40)
    asyncio.run(main(parser.parse_args().turns))
