"""Shared pytest hooks: a failed test that ran gateway processes shows their logs."""

from __future__ import annotations

from collections.abc import Generator

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None]:
    outcome = yield
    report = outcome.get_result()
    cluster = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and cluster is not None:
        report.sections.append(("gateway nodes", cluster.report()))
