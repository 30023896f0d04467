"""Server tools of tests/data/cluster_agent.toml, for gateways run as processes.

Each run appends one line to the file named by ``$CLUSTER_RUNS`` (O_APPEND: lines from
several processes never interleave), so a test counts the runs of a call across nodes.
The async tool finishes when the test creates ``release-<parcel>`` next to that file.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import msgspec

from gateway.server_tool import tool

__all__ = ["RUNS_ENV", "TRACK_TIMEOUT", "release_file", "tally", "track"]

RUNS_ENV = "CLUSTER_RUNS"
TRACK_TIMEOUT = 3.0
"""Seconds ``track`` may run: a test whose node died waits this long for the failure."""
_POLL = 0.02
"""Seconds between looks for the release file (another process creates it)."""


def _record(line: str) -> None:
    with open(os.environ[RUNS_ENV], "a") as runs:
        runs.write(line + "\n")


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
