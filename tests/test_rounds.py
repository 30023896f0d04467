"""The driver's count of event-loop rounds and its work budget per round."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.shell.rounds import ROUND_BUDGET as _ROUND_BUDGET
from gateway.shell.rounds import Rounds as _Rounds


class _Loop:
    """What ``_Rounds`` uses of a loop: a clock and ``call_soon`` (run by ``end_round``)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.soon: list[Callable[[], None]] = []

    def time(self) -> float:
        return self.now

    def call_soon(self, callback: Callable[[], None], *args: Any) -> None:
        self.soon.append(callback)

    def end_round(self) -> None:
        due, self.soon = self.soon, []
        for callback in due:
            callback()


def test_the_round_moves_on_once_per_round_for_all_who_ask():
    rounds, loop = _Rounds(), _Loop()
    first = rounds.current(loop)  # type: ignore[arg-type]
    assert rounds.current(loop) == first  # type: ignore[arg-type]
    assert len(loop.soon) == 1  # one callback for everyone
    loop.end_round()
    assert rounds.current(loop) == first + 1  # type: ignore[arg-type]


def test_a_round_is_over_budget_once_its_work_took_longer_than_the_budget():
    rounds, loop = _Rounds(), _Loop()
    assert not rounds.over_budget(loop)  # type: ignore[arg-type]  # the first to ask
    loop.now += _ROUND_BUDGET / 2
    assert not rounds.over_budget(loop)  # type: ignore[arg-type]
    loop.now += _ROUND_BUDGET
    assert rounds.over_budget(loop)  # type: ignore[arg-type]  # hand the loop over
    loop.end_round()  # the next round starts afresh
    assert not rounds.over_budget(loop)  # type: ignore[arg-type]
