"""Shared pytest hooks: a failed test that ran gateway processes shows their logs, and under
CI (the environment variable ``CI`` set, as ``.ci/run`` runs) a skipped test fails: what
``make test`` installs is there, so a skip means a test that did not run."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import shared_browser  # noqa: F401 - the browser tests' fixture
from tests.redis_server import RedisServer, redis_server


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None]:
    outcome = yield
    report = outcome.get_result()
    cluster = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and cluster is not None:
        report.sections.append(("gateway nodes", cluster.report()))
    if report.skipped and not hasattr(report, "wasxfail") and _under_ci():
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped while CI is set, which fails the run: {reason}"


def _under_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


@pytest.fixture(scope="session")
def tts() -> Any:
    """The offline synthesizer (piper), loaded once: the voice tests speak the user's part."""
    from gateway.voice.offline import PiperTTS

    return PiperTTS()


@pytest.fixture(scope="session")
def stt(tts: Any) -> Any:
    """The offline recognizer (pocketsphinx), primed as ``load_offline`` primes it (a cold
    decoder hears "or smile or" for "where is my order"): the voice tests transcribe what
    the gateway said."""
    from gateway.voice.offline import PRIMING_TEXT, PocketsphinxSTT

    stt = PocketsphinxSTT()
    stt.prime(b"".join(tts.synthesize(PRIMING_TEXT, stt.sample_rate)))
    return stt


@pytest.fixture
def redis(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own (Debian's, on a unix socket); with AOF when the test
    parametrizes this fixture with ``True`` (``indirect=True``)."""
    with redis_server(tmp_path, appendonly=getattr(request, "param", False)) as server:
        yield server
