"""Many voice sessions at once: N sessions each say a phrase at the same moment, paced as a
microphone, while another session pings every 50 ms.

The gateway runs in this process (one event loop, so on one core) with the demo agent and
the offline speech engines in ``workers`` worker processes; the N clients (the Python SDK)
share its loop. Per round it prints: the ping round trips (the event loop's responsiveness
to a session that is not speaking), each speaker's time from ``input_audio.speech_stopped``
to its first audio frame (the speech workers' queue shows here: N turns end at once), and the
CPU time of the gateway's process (the event loop: sockets, sessions, the clients too) and of
the workers, per second of conversation audio. Prints figures; asserts nothing.

    .venv/bin/python -m bench.voice_sessions [sessions] [workers] [rounds]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

from bench.voice_turn import pct, proc_cpu, self_cpu
from client_sdk import connect
from gateway.agent.file import DEMO_AGENT
from gateway.logging import configure_logging
from gateway.voice.offline import PiperTTS
from gateway.wire.v1 import AudioDone, InputSpeechStopped, Ping, Pong
from tests.support import serving, session
from tests.voice_support import DEMO_PHRASES, answer_as_the_demo_device, say_in_real_time

__all__: list[str] = []

RATE = 16000


async def speaker(url: str, clip: bytes, go: asyncio.Event) -> tuple[float, int]:
    """Say ``clip`` once ``go`` is set; (speech_stopped to first audio s, answer ms)."""
    async with connect(url, audio={}) as conv:
        answer_as_the_demo_device(conv)
        await conv.start()
        events, audio = conv.events(), conv.audio()
        stopped, first = 0.0, 0.0

        async def first_audio() -> None:
            nonlocal first
            async for _ in audio:
                first = time.perf_counter()
                return

        async def until_done() -> AudioDone:
            nonlocal stopped
            async for event in events:
                if isinstance(event, InputSpeechStopped) and not stopped:
                    stopped = time.perf_counter()
                if isinstance(event, AudioDone):
                    return event
            raise AssertionError("the session ended")

        await go.wait()
        heard = asyncio.create_task(first_audio())
        done = asyncio.create_task(until_done())
        await say_in_real_time(conv, clip, RATE)
        answer = await asyncio.wait_for(done, 120)
        await heard
        return first - stopped, answer.audio_ms


async def pinger(url: str, rtts: list[float]) -> None:
    async with session(url) as (conn, _):
        while True:
            sent = time.perf_counter()
            await conn.send(Ping(ts=sent))
            await conn.recv_until(lambda e: isinstance(e, Pong))
            rtts.append(time.perf_counter() - sent)
            await asyncio.sleep(0.05)


async def main(sessions: int, processes: int, rounds: int) -> None:
    configure_logging("warning")
    tts = PiperTTS()
    silence = b"\0\0" * RATE
    clips = [
        silence[: RATE * 6 // 10] + b"".join(tts.synthesize(p, RATE)) + silence
        for p in DEMO_PHRASES
        if p != "hello"
    ]
    async with serving(agent=str(DEMO_AGENT), voice_workers=processes) as gateway:
        pids = (await gateway.runtime.voice.workers()).pids
        for round_ in range(rounds):
            go, rtts = asyncio.Event(), list[float]()
            probe = asyncio.create_task(pinger(gateway.url, rtts))
            talks = [
                asyncio.create_task(speaker(gateway.url, clips[n % len(clips)], go))
                for n in range(sessions)
            ]
            await asyncio.sleep(1.0)  # the sessions start, the pinger warms up
            own, workers = self_cpu(), sum(proc_cpu(pid) for pid in pids)
            began = time.perf_counter()
            go.set()
            results = await asyncio.gather(*talks)
            wall = time.perf_counter() - began
            own, workers = self_cpu() - own, sum(proc_cpu(pid) for pid in pids) - workers
            probe.cancel()
            latencies = [1000 * r[0] for r in results]
            audio_s = sum(r[1] for r in results) / 1000 + sum(
                len(clips[n % len(clips)]) / (2 * RATE) for n in range(sessions)
            )
            print(
                f"round {round_ + 1}: {sessions} sessions speaking at once, {processes} speech"
                f" worker(s): all answered in {wall:.1f} s"
            )
            print(
                f"  other session's ping: {len(rtts)} pings, p50"
                f" {1000 * statistics.median(rtts):.1f} ms, max {1000 * max(rtts):.1f} ms"
            )
            print(
                f"  speech_stopped -> first audio: p50 {statistics.median(latencies):.0f} ms,"
                f" p90 {pct(latencies, 0.9):.0f} ms, max {max(latencies):.0f} ms"
            )
            print(
                f"  CPU per s of conversation audio ({audio_s:.0f} s): gateway process"
                f" {own / audio_s:.3f} s (clients included), workers {workers / audio_s:.3f} s"
            )


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(*(args + [20, 2, 2][len(args) :])))
