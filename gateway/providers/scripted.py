"""The embedded scripted model: deterministic, no network, driven by a TOML scenario.

It is a model for development, demos and tests, not a language model: it matches
the user's last message against regex rules and answers with templated text
streamed word by word and/or templated tool calls; after tool results it answers
from per-tool result templates. See ``docs/agents.md`` for the scenario format.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from gateway.config import load_toml
from gateway.core.model import (
    ModelEvent,
    ModelFinish,
    ModelRequest,
    ModelText,
    ModelToolCall,
    ModelUsage,
)
from gateway.core.transcript import (
    CANCELLED,
    PENDING,
    AssistantTurn,
    ContextNote,
    Item,
    ToolOutcome,
    UserTurn,
    parse_completion_note,
)
from gateway.core.usage import estimate_tokens
from gateway.errors import ConfigError, ProviderError
from gateway.providers.base import Capabilities, ModelSink, Room
from gateway.providers.pacer import RESOLUTION, Pacer, pacer

__all__ = ["RULE_TEXT_MAX_CHARS", "Scenario", "ScriptedProvider", "load_scenario", "render"]

RULE_TEXT_MAX_CHARS = 1_000
"""Characters of the user's message that a rule's regex sees (its start); see docs/agents.md."""


class ScriptedCall(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A tool call a rule makes; string values in ``args`` are templates."""

    tool: str
    args: dict[str, Any] = {}


class Rule(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Answer a user message matching ``match`` (a regex, searched, not anchored)."""

    match: str
    say: str = ""
    calls: list[ScriptedCall] = []
    error: str | None = None
    """Fail the model stream with this message after ``say`` (to rehearse failures)."""
    pace: float | None = None
    """Seconds between words for this rule, overriding the scenario's pace."""


class ResultRule(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Answer the step after a call of ``tool`` came back (``results``), or the
    context note of an async call's outcome (``completions``).

    For an async tool, ``results`` see ``{"status": "pending"}``: ``when = "pending"``.
    """

    tool: str
    when: str | None = None
    """A path such as ``output.in_stock`` that must be truthy (``!`` negates) for this rule."""
    say: str = ""
    on_error: str | None = None
    """Said when the call failed; the first rule of the tool that has one is used."""
    calls: list[ScriptedCall] = []

    def applies(self, context: Mapping[str, Any]) -> bool:
        if self.when is None:
            return True
        negate = self.when.startswith("!")
        return bool(_lookup(context, self.when.lstrip("!"))) != negate


class Scenario(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    pace: float = 0.04
    """Seconds between streamed words."""
    fallback: str = "I'm a scripted demo model and have no rule for that."
    rules: list[Rule] = []
    results: list[ResultRule] = []
    completions: list[ResultRule] = []


def load_scenario(path: Path) -> Scenario:
    """Read and check a scenario file.

    Raises:
        ConfigError: the file is missing, is not valid TOML, or has a bad rule.
    """
    scenario = load_toml(path, Scenario)
    for index, rule in enumerate(scenario.rules):
        try:
            re.compile(rule.match)
        except re.error as exc:
            raise ConfigError(f"{path}: rules[{index}]: bad regex {rule.match!r}: {exc}") from exc
    if scenario.pace < 0:
        raise ConfigError(f"{path}: pace must not be negative")
    return scenario


_DEFAULT_SAY = "{display} returned {output|json}."
_DEFAULT_ON_ERROR = "Sorry, {display} did not work: {error}."
_PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_.]+)(?:\|([a-z_]+))?\}")


def _lookup(context: Mapping[str, Any], path: str) -> Any:
    value: Any = context
    for part in path.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _format(value: Any, flt: str | None) -> str:
    if flt == "percent" and isinstance(value, int | float):
        return f"{round(value * 100)}%"
    if flt == "money" and isinstance(value, int | float):
        return f"{value:.2f}"
    if flt == "json" or isinstance(value, dict | list):
        return json.dumps(value, separators=(", ", ": "))
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def render(template: str, context: Mapping[str, Any]) -> str:
    """Fill ``{path.to.value}`` and ``{path|filter}`` placeholders.

    Filters: ``percent`` (0.82 -> 82%), ``money`` (two decimals), ``json``.
    """
    return _PLACEHOLDER.sub(lambda m: _format(_lookup(context, m.group(1)), m.group(2)), template)


def _render_value(template: str, context: Mapping[str, Any]) -> Any:
    """A template that is one placeholder keeps its value's type (``int``/``float`` convert)."""
    whole = _PLACEHOLDER.fullmatch(template)
    if whole is None:
        return render(template, context)
    value = _lookup(context, whole.group(1))
    try:
        if whole.group(2) == "int":
            return int(value)
        if whole.group(2) == "float":
            return float(value)
    except (TypeError, ValueError):
        return value
    return value if whole.group(2) is None else _format(value, whole.group(2))


def _render_args(args: Any, context: Mapping[str, Any]) -> Any:
    if isinstance(args, str):
        return _render_value(args, context)
    if isinstance(args, dict):
        # An empty optional capture leaves its argument out rather than sending "".
        rendered = {key: _render_args(value, context) for key, value in args.items()}
        return {key: value for key, value in rendered.items() if value not in ("", None)}
    if isinstance(args, list):
        return [_render_args(value, context) for value in args]
    return args


_WORD = re.compile(r"\s*\S+\s*")

_YIELD_EVERY = 64
"""At pace 0, the model hands the loop over (and may be cancelled) every this many words:
the session's reader also yields on its own (``gateway.shell.model_stream``)."""


def _words(text: str) -> Iterator[str]:
    """The words of ``text``, each with the spaces around it; one blank piece for a blank
    text. Lazy: the first word of a long answer goes out without splitting the rest."""
    found = False
    for match in _WORD.finditer(text):
        found = True
        yield match.group()
    if not found and text:
        yield text


def _all_words(text: str) -> list[str]:
    """``_words``, all at once."""
    return _WORD.findall(text) or ([text] if text else [])


class ScriptedProvider:
    """A ``Provider`` that plays a ``Scenario``."""

    name = "scripted"
    capabilities = Capabilities(tools=True, parallel_tool_calls=True)

    def __init__(self, scenario: Scenario, *, pace: float | None = None) -> None:
        self._scenario = scenario
        self._pace = scenario.pace if pace is None else pace
        self._rules = [(re.compile(rule.match), rule) for rule in scenario.rules]
        self._results = _by_tool(scenario.results)
        self._completions = _by_tool(scenario.completions)

    async def aclose(self) -> None:
        """Nothing to release: no network."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Play the answer to the request's last item."""
        say, calls, error, pace = self._answer(request, {tool.name for tool in request.tools})
        loop = asyncio.get_running_loop()
        started, words = loop.time(), 0
        # Paced, each word waits its turn anyway: split them all at once. At pace 0, lazily:
        # the first word of a long answer goes out before the rest is split.
        for word in _all_words(say) if pace else _words(say):
            words += 1
            if pace:
                # On a schedule, as a model server streams: a busy gateway that takes
                # longer to pass a word on does not slow the words after it down.
                await asyncio.sleep(max(0.0, started + words * pace - loop.time()))
            elif words % _YIELD_EVERY == 1:
                await asyncio.sleep(0)  # a cancellation point
            yield ModelText(word)
        if error is not None:
            raise ProviderError(error)
        for event in _ending(request, calls, words):
            yield event

    def push(
        self, request: ModelRequest, sink: ModelSink, room: Room
    ) -> asyncio.Future[None] | None:
        """``stream``'s events for a paced answer, from the loop's ``Pacer``: no timer
        and no task switch per word. ``None`` at pace 0 (``stream`` is cheaper there: it
        gives a burst of words in one turn of the loop)."""
        say, calls, error, pace = self._answer(request, {tool.name for tool in request.tools})
        if not pace:
            return None
        play = _Play(request, _words(say), calls, error, pace, sink, room)
        play.start()
        return play.done

    def _answer(
        self, request: ModelRequest, offered: set[str]
    ) -> tuple[str, list[tuple[str, dict[str, Any]]], str | None, float]:
        items = request.items
        if items and isinstance(items[-1], ToolOutcome | ContextNote):
            return (*self._answer_results(request), None, self._pace)
        text = next((item.text for item in reversed(items) if isinstance(item, UserTurn)), "")
        # Rules are the operator's regexes and Python's re backtracks: a long message must
        # not make one run for seconds on the event loop, so rules see its start only.
        seen = text[:RULE_TEXT_MAX_CHARS]
        choice = request.tool_choice
        for pattern, rule in self._rules:
            found = pattern.search(seen)
            if found is None or any(call.tool not in offered for call in rule.calls):
                continue
            if not _honours(rule, choice):
                continue
            context: dict[str, Any] = {"text": text, "0": found.group(0)}
            context.update({str(i): g or "" for i, g in enumerate(found.groups(), start=1)})
            context.update({k: v or "" for k, v in found.groupdict().items()})
            if _mentions_last(rule):
                context["last"] = _latest_outcomes(items)
            calls = [(c.tool, _render_args(c.args, context)) for c in rule.calls]
            pace = self._pace if rule.pace is None else rule.pace
            return render(rule.say, context), calls, rule.error, pace
        if choice not in ("auto", "none"):
            wanted = "a tool" if choice == "required" else repr(choice)
            # A model told to call a tool that cannot: the step fails, saying why.
            problem = (
                f"the scenario has no rule for this message that calls {wanted},"
                f" as tool_choice {choice!r} asks"
            )
            return "", [], problem, self._pace
        return self._scenario.fallback, [], None, self._pace

    def _answer_results(
        self, request: ModelRequest
    ) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
        """Answer the tool outcomes and context notes at the end of the conversation."""
        trailing: list[ToolOutcome | ContextNote] = []
        for item in reversed(request.items):
            if not isinstance(item, ToolOutcome | ContextNote):
                break
            trailing.insert(0, item)
        args_by_call = _args_of({i.call_id for i in trailing if i.call_id}, request.items)
        texts: list[str] = []
        calls: list[tuple[str, dict[str, Any]]] = []
        settled_here = {i.call_id for i in trailing if isinstance(i, ContextNote)}
        for item in trailing:
            if isinstance(item, ToolOutcome) and (
                item.error == CANCELLED or item.call_id in settled_here
            ):
                continue  # nothing to say of a cancelled call, or a pending one now settled
            if isinstance(item, ToolOutcome):
                name, output, error = item.name, item.output, item.error
                args, rules = args_by_call.get(item.call_id, {}), self._results
            else:
                parsed = parse_completion_note(item.text)
                if parsed is None:
                    continue
                name, output, error = parsed
                args, rules = args_by_call.get(item.call_id or "", {}), self._completions
            text, more = _answer_one(rules.get(name, []), name, output, error, args)
            texts.append(text)
            calls += more
        return " ".join(text for text in texts if text), calls


def _mentions_last(rule: Rule) -> bool:
    """Whether a rule's templates use ``{last.TOOL...}`` (only then is the history read)."""
    return "{last." in rule.say + json.dumps([call.args for call in rule.calls])


def _latest_outcomes(items: Sequence[Item]) -> dict[str, dict[str, Any]]:
    """The newest outcome of each tool in the conversation, by name: ``{"output", "error"}``
    from its result or its completion's context note (``{last.TOOL.output.x}``)."""
    latest: dict[str, dict[str, Any]] = {}
    for item in reversed(items):
        if isinstance(item, ToolOutcome) and item.output != PENDING:
            latest.setdefault(item.name, {"output": item.output, "error": item.error})
        elif isinstance(item, ContextNote) and (parsed := parse_completion_note(item.text)):
            name, output, error = parsed
            latest.setdefault(name, {"output": output, "error": error})
    return latest


def _ending(
    request: ModelRequest, calls: list[tuple[str, dict[str, Any]]], words: int
) -> list[ModelEvent]:
    """What follows an answer's words: its tool calls, then the finish."""
    events: list[ModelEvent] = [ModelToolCall(name=name, args=args) for name, args in calls]
    events.append(
        ModelFinish(
            reason="tool_calls" if calls else "stop",
            usage=ModelUsage(input_tokens=_count_input(request), output_tokens=words),
        )
    )
    return events


_BATCH = 64
"""At most this many late words of one answer go to the session in one call."""


class _Play:
    """One paced answer given to a sink from the pacer's callbacks (``ScriptedProvider.push``).

    Word ``k`` (from 1) is due ``k * pace`` after the start, as ``stream`` has it. Each
    call gives the sink every word due by then: one, unless the loop fell behind; then
    the late ones go together (and so in one socket write), and the stream catches up
    rather than drifting later and later.
    """

    __slots__ = (
        "_calls",
        "_error",
        "_loop",
        "_next",
        "_pace",
        "_pacer",
        "_request",
        "_room",
        "_sent",
        "_sink",
        "_started",
        "_words",
        "done",
    )

    def __init__(
        self,
        request: ModelRequest,
        words: Iterator[str],
        calls: list[tuple[str, dict[str, Any]]],
        error: str | None,
        pace: float,
        sink: ModelSink,
        room: Room,
    ) -> None:
        self._request = request
        self._words = words
        """Split as they fall due: a long answer costs nothing up front."""
        self._next: str | None = next(words, None)
        self._calls = calls
        self._error = error
        self._pace = pace
        self._sink = sink
        self._room = room
        self._loop = asyncio.get_running_loop()
        self._pacer: Pacer = pacer()
        self._started = self._loop.time()
        self._sent = 0
        self.done: asyncio.Future[None] = self._loop.create_future()

    def start(self) -> None:
        self._pacer.call_at(self._started + self._pace, self._play)

    def _play(self) -> None:
        if self.done.done():  # cancelled, or the sink said stop
            return
        try:
            self._give_due()
        except Exception as exc:  # the sink's: the driver reports it as a crashed model
            if not self.done.done():
                self.done.set_exception(exc)

    def _give_due(self) -> None:
        # What is due within the pacer's resolution counts as due now (see gateway.pacer).
        due = int((self._loop.time() + RESOLUTION - self._started) / self._pace)
        if self._sent < due and self._next is not None:
            texts: list[ModelEvent] = []
            while self._sent < due and (word := self._next) is not None and len(texts) < _BATCH:
                self._next = next(self._words, None)
                self._sent += 1
                texts.append(ModelText(word))
            if not self._sink(texts):
                self.done.set_result(None)
                return
            if self._room.full:  # the session is busy: wait for it, then go on
                self._room.room.on_set(self._resume)
                return
            if self._sent < due and self._next is not None:  # more than a batch was due
                self._loop.call_soon(self._play)
                return
        if self._next is not None:
            self._pacer.call_at(self._started + (self._sent + 1) * self._pace, self._play)
            return
        if self._error is not None:
            self.done.set_exception(ProviderError(self._error))
            return
        self._sink(_ending(self._request, self._calls, self._sent))
        self.done.set_result(None)

    def _resume(self) -> None:
        # Called as the room flag is set, from inside the session's loop: play from a
        # callback of our own instead.
        self._loop.call_soon(self._play)


def _honours(rule: Rule, choice: str) -> bool:
    """Whether answering with ``rule`` keeps to ``tool_choice`` ``choice``."""
    if choice == "auto":
        return True
    if choice == "none":
        return not rule.calls
    if choice == "required":
        return bool(rule.calls)
    return any(call.tool == choice for call in rule.calls)


def _by_tool(rules: list[ResultRule]) -> dict[str, list[ResultRule]]:
    grouped: dict[str, list[ResultRule]] = {}
    for rule in rules:
        grouped.setdefault(rule.tool, []).append(rule)
    return grouped


def _answer_one(
    rules: list[ResultRule], name: str, output: Any, error: str | None, args: dict[str, Any]
) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    context = {
        "tool": name,
        "display": name.replace("_", " "),
        "output": output,
        "error": error,
        "args": args,
        "pending": output == PENDING,
    }
    if error is not None:
        template = next((r.on_error for r in rules if r.on_error), _DEFAULT_ON_ERROR)
        return render(template, context), []
    rule = next((r for r in rules if r.applies(context)), None)
    if rule is None:
        return render(_DEFAULT_SAY, context), []
    return render(rule.say, context), [(c.tool, _render_args(c.args, context)) for c in rule.calls]


def _args_of(call_ids: set[str], items: Sequence[Item]) -> dict[str, dict[str, Any]]:
    """The arguments of the calls ``call_ids`` named, from the newest turns back: a long
    conversation is not read whole for the last few calls."""
    found: dict[str, dict[str, Any]] = {}
    for item in reversed(items):
        if len(found) == len(call_ids):
            break
        if isinstance(item, AssistantTurn):
            found |= {c.call_id: c.args for c in item.calls if c.call_id in call_ids}
    return found


_JSON = msgspec.json.Encoder()


def _count_input(request: ModelRequest) -> int:
    """The request's tokens as the gateway's meter estimates them before a step (its JSON's
    characters / 4: instructions, history and tools), so that a scripted conversation's
    usage and its reservations agree (docs/usage.md)."""
    return estimate_tokens(len(_JSON.encode(request)))
