"""Checks new client-function schemas in a worker process, off the event loop.

jsonschema's ``check_schema`` costs up to about 0.6 ms per node of a schema; a declaration
at the limits (``max_schema_nodes``) takes a few hundred milliseconds. Run on the event
loop, or in a thread (which takes the GIL from the loop for 5 ms at a time), that would
hold up every session's pings and streams meanwhile. So the driver hands the schemas of a
``session.start`` or ``session.update`` that are not cached yet to one worker process,
stores the verdicts in the ``SchemaGuard`` cache, and only then gives the message to the
session core, which finds every schema checked.

The worker is shared by the whole gateway process and started on first use. Declarations
wait for it one after another: a costly one can delay another session's new schemas, not
its other events, nor sessions whose schemas are cached.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import structlog

from gateway.core.schema_guard import SchemaGuard, check_schemas

__all__ = ["SchemaWorker"]

log = structlog.get_logger("gateway.schema_worker")


class _Pool:
    """The one worker process, started on first use."""

    executor: ProcessPoolExecutor | None = None
    failed = False
    """The worker could not start or died: the core checks schemas itself from then on."""

    @classmethod
    def get(cls) -> ProcessPoolExecutor:
        if cls.executor is None:
            # spawn: forking a process that runs an event loop and threads is unsafe.
            context = multiprocessing.get_context("spawn")
            cls.executor = ProcessPoolExecutor(max_workers=1, mp_context=context)
        return cls.executor

    @classmethod
    def fail(cls) -> None:
        cls.failed = True
        if cls.executor is not None:
            cls.executor.shutdown(wait=False, cancel_futures=True)
        cls.executor = None


class SchemaWorker:
    """Checks declarations for ``guard`` in the worker process (see the module docstring)."""

    def __init__(self, guard: SchemaGuard) -> None:
        self._guard = guard

    async def check(self, schemas: list[dict[str, Any]]) -> None:
        """Check the schemas of one declaration that are new; cache the verdicts.

        Should the worker fail to start or die (say a program embedding the gateway
        without an ``if __name__ == "__main__"`` guard, which ``spawn`` needs), the core
        checks schemas itself, on the loop, within the same limits.
        """
        guard = self._guard
        unchecked = guard.unchecked(schemas)
        if not unchecked or _Pool.failed:
            return
        loop = asyncio.get_running_loop()
        try:
            verdicts = await loop.run_in_executor(
                _Pool.get(), check_schemas, unchecked, guard.limits
            )
        except (BrokenProcessPool, OSError, RuntimeError) as exc:
            log.error("schema_worker_failed", error=type(exc).__name__, schemas=len(unchecked))
            _Pool.fail()
            return
        guard.store(unchecked, verdicts)  # no await after this: the core finds them cached
