"""Voice sessions: how long a speech synthesizer waits for its first segment.

A real socket to the gateway (in-process, the test agent's scripted model streaming word by
word at ``pace`` seconds a word, about as fast as a hosted model writes), with ``segments``
on. For each answer of a set of typical assistant answers: the time from the first
``text.delta`` to the first ``text.segment``, and how many characters that segment holds.
Then the segmenter alone: its CPU cost per character, over the same answers fed a word at a
time. Prints figures; asserts nothing.

    .venv/bin/python -m bench.first_segment [pace] [rounds]
"""

from __future__ import annotations

import asyncio
import re
import statistics
import sys
import time

from client_sdk import connect
from gateway.core.segments import Segmenter
from gateway.logging import configure_logging
from gateway.wire.v1 import ResponseDone, TextDelta, TextSegment
from tests.support import serving

__all__: list[str] = []

ANSWERS = [
    "Sure, I can help with that. Your order 1234 shipped on Monday and should arrive by Friday.",
    "The nearest store is Vista Mall, 2.5 km away. It opens at 9 a.m. and closes at 9 p.m.",
    "Your battery is at 82% and charging. At this rate it will be full in about 40 minutes.",
    "Dr. Smith's office called to confirm your appointment on Jan. 5 at 3:30 p.m. Shall I add"
    " it to your calendar?",
    "Headphones are in stock: we have 7 left at $129.00. Would you like me to reserve a pair"
    " for pickup today?",
    "I couldn't find that order. Could you check the number on your receipt, e.g. 1234 or"
    " 5678, and try again?",
    "Here is what I found: the charger works with every phone we sell, including the older"
    " models, and ships free.",
    "Okay! I've opened the display settings for you.",
]


async def through_the_gateway(pace: float, rounds: int) -> None:
    async with serving(scripted_pace=pace) as gateway, connect(gateway.url, segments=True) as conv:
        waits: list[float] = []
        sizes: list[int] = []
        for _ in range(rounds):
            for answer in ANSWERS:
                events = conv.events()
                await conv.post(f"echo {answer}")
                first_delta = first_segment = None
                async for event in events:
                    now = time.perf_counter()
                    if isinstance(event, TextDelta) and first_delta is None:
                        first_delta = now
                    elif isinstance(event, TextSegment) and first_segment is None:
                        first_segment = now
                        sizes.append(len(event.text))
                    elif isinstance(event, ResponseDone):
                        break
                await events.aclose()
                assert first_delta is not None
                assert first_segment is not None
                waits.append((first_segment - first_delta) * 1000)
    waits.sort()
    print(
        f"first delta -> first segment, pace {pace * 1000:g} ms a word, {len(waits)} answers:"
        f" median {statistics.median(waits):.0f} ms, p90 {waits[int(len(waits) * 0.9)]:.0f} ms,"
        f" max {waits[-1]:.0f} ms; first segment {min(sizes)}-{max(sizes)} characters"
        f" (median {statistics.median(sizes):.0f})"
    )


def segmenter_alone(rounds: int) -> None:
    words = [re.findall(r"\S+\s*", answer) for answer in ANSWERS]
    chars = sum(len(answer) for answer in ANSWERS) * rounds
    start = time.perf_counter()
    for _ in range(rounds):
        for pieces in words:
            segmenter = Segmenter()
            for piece in pieces:
                segmenter.feed(piece)
            segmenter.flush()
    elapsed = time.perf_counter() - start
    print(f"segmenter alone: {elapsed / chars * 1e9:.0f} ns per character ({chars} characters)")


def main() -> None:
    pace = float(sys.argv[1]) if len(sys.argv) > 1 else 0.03
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    configure_logging("warning")
    asyncio.run(through_the_gateway(pace, rounds))
    segmenter_alone(rounds * 200)


if __name__ == "__main__":
    main()
