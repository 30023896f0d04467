"""Server tools of tests/data/cluster_agent.toml, for gateways run as processes.

Each run appends one line to the file named by ``$CLUSTER_RUNS`` (O_APPEND: lines from
several processes never interleave), so a test counts the runs of a call across nodes.
The async tool finishes when the test creates ``release-<parcel>`` next to that file.
"""

from __future__ import annotations

import asyncio
import os
import zlib
from pathlib import Path

import msgspec

from gateway.tools.python import tool

__all__ = [
    "ORDER_TIMEOUT",
    "RUNS_ENV",
    "TRACK_TIMEOUT",
    "order",
    "pids_file",
    "release_file",
    "tally",
    "track",
]

RUNS_ENV = "CLUSTER_RUNS"
TRACK_TIMEOUT = 3.0
"""Seconds ``track`` may run: a test whose node died waits this long for the failure."""
_POLL = 0.02
"""Seconds between looks for the release file (another process creates it)."""


def _record(line: str) -> None:
    runs_file = os.environ[RUNS_ENV]
    with open(runs_file, "a") as runs:
        runs.write(line + "\n")
    with open(pids_file(Path(runs_file)), "a") as pids:  # which process ran it
        pids.write(f"{line}\t{os.getpid()}\n")


def pids_file(runs: Path) -> Path:
    """The file beside ``runs`` that has each run with the pid of the node that ran it."""
    return runs.with_name(runs.name + ".pids")


def release_file(runs: Path, parcel: str) -> Path:
    """The file whose creation lets ``track`` of ``parcel`` finish."""
    return runs.with_name(f"release-{parcel}")


class Tally(msgspec.Struct):
    a: int
    b: int
    tag: str


class Total(msgspec.Struct):
    total: int


class Parcel(msgspec.Struct):
    parcel: str


class ParcelStatus(msgspec.Struct):
    parcel: str
    status: str


@tool()
def tally(query: Tally) -> Total:
    """Add two integers (a sync server tool)."""
    _record(f"tally {query.tag}")
    return Total(total=query.a + query.b)


@tool(execution="async", timeout=TRACK_TIMEOUT)
async def track(query: Parcel) -> ParcelStatus:
    """Track a parcel (an async server tool: done when the test releases it)."""
    _record(f"track {query.parcel}")
    release = release_file(Path(os.environ[RUNS_ENV]), query.parcel)
    # Another process (the test) creates the file: no asyncio.Event spans processes.
    while not release.exists():  # noqa: ASYNC110
        await asyncio.sleep(_POLL)
    return ParcelStatus(parcel=query.parcel, status="delivered")


class OrderQuery(msgspec.Struct):
    tag: str


class OrderStatus(msgspec.Struct):
    tag: str
    status: str


ORDER_TIMEOUT = 10.0
"""Seconds ``order`` may run: one left on a killed node fails this long after it started."""


@tool(execution="async", timeout=ORDER_TIMEOUT)
async def order(query: OrderQuery) -> OrderStatus:
    """Look an order up (an async server tool that finishes by itself, 0.2 to 0.8 s later, by
    its tag: the same call takes as long wherever it runs)."""
    _record(f"order {query.tag}")
    await asyncio.sleep(0.2 + (zlib.crc32(query.tag.encode()) % 600) / 1000)
    return OrderStatus(tag=query.tag, status="shipped")
