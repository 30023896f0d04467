"""The tasks a conversation runs in the background (its reader, client functions, sends)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from client_sdk.exceptions import ClientError

__all__ = ["Background"]


class Background:
    """Holds every task it started until the task is done (the loop keeps only weak
    references), and reports a task's failure that is a bug to the loop's exception
    handler; the conversation's end (a ``ClientError``) reaches the app another way."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run ``work`` as a task named ``client_sdk:<name>``."""
        task = asyncio.get_running_loop().create_task(work, name=f"client_sdk:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._reap)
        return task

    async def cancel(self) -> None:
        """Cancel every task (but the caller's own) and wait until they are done."""
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _reap(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return  # close() (or the loop's shutdown) cancelled it: nothing to report
        error = task.exception()
        if error is not None and not isinstance(error, ClientError):
            task.get_loop().call_exception_handler(
                {"message": f"{task.get_name()} failed", "exception": error, "task": task}
            )
