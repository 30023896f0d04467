"""The scripted model: rules, templates, result rules, streaming, scenario errors."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest

from gateway.core.model import (
    ModelEvent,
    ModelFinish,
    ModelRequest,
    ModelText,
    ModelToolCall,
    ToolSchema,
)
from gateway.core.transcript import AssistantTurn, RequestedCall, ToolOutcome, UserTurn
from gateway.errors import ConfigError, ProviderError
from gateway.providers.pacer import pacer
from gateway.providers.scripted import (
    RULE_TEXT_MAX_CHARS,
    ResultRule,
    Rule,
    Scenario,
    ScriptedCall,
    ScriptedProvider,
    load_scenario,
    render,
)
from gateway.shell.flag import Flag

SCENARIO = Scenario(
    pace=0,
    fallback="no idea",
    rules=[
        Rule(
            match=r"(?i)store near (?P<zip>\d{5})", calls=[ScriptedCall("find", {"zip": "{zip}"})]
        ),
        Rule(
            match=r"^add (\d+) (\d+)$",
            calls=[ScriptedCall("add", {"a": "{1|int}", "b": "{2|int}"})],
        ),
        Rule(match=r"^say (.*)$", say="You said: {1}"),
        Rule(match=r"^fail$", say="half", error="cut"),
    ],
    results=[
        ResultRule(tool="find", when="output.open", say="{output.name} is open."),
        ResultRule(tool="find", say="{output.name} is closed.", on_error="No store: {error}"),
    ],
)
TOOLS = (
    ToolSchema(name="find", description="d", input_schema={}),
    ToolSchema(name="add", description="d", input_schema={}),
)


async def play(request: ModelRequest, scenario: Scenario = SCENARIO) -> list[ModelEvent]:
    return [event async for event in ScriptedProvider(scenario).stream(request)]


def user(text: str) -> ModelRequest:
    return ModelRequest(instructions="", items=(UserTurn(text=text),), tools=TOOLS)


async def test_text_streams_word_by_word_and_rebuilds_exactly():
    events = await play(user("say  hello   there "))
    words = [e.text for e in events if isinstance(e, ModelText)]
    assert words == ["You ", "said:  ", "hello   ", "there "]
    assert "".join(words) == "You said:  hello   there "
    assert isinstance(events[-1], ModelFinish)
    assert events[-1].reason == "stop"


async def test_named_capture_templates_the_call_arguments():
    events = await play(user("Is there a store near 92031?"))
    assert events[0] == ModelToolCall(name="find", args={"zip": "92031"})
    assert isinstance(events[-1], ModelFinish)
    assert events[-1].reason == "tool_calls"


async def test_int_filter_gives_typed_arguments():
    events = await play(user("add 2 40"))
    assert events[0] == ModelToolCall(name="add", args={"a": 2, "b": 40})


async def test_rules_whose_tools_are_not_offered_are_skipped():
    request = ModelRequest(instructions="", items=(UserTurn(text="store near 12345"),), tools=())
    events = await play(request)
    assert "".join(e.text for e in events if isinstance(e, ModelText)) == "no idea"


async def test_result_rules_pick_by_when_and_template_the_output():
    def after(output: object = None, error: str | None = None) -> ModelRequest:
        return ModelRequest(
            instructions="",
            items=(
                UserTurn(text="store near 92031"),
                AssistantTurn(
                    calls=(RequestedCall(call_id="c1", name="find", args={"zip": "92031"}),)
                ),
                ToolOutcome(call_id="c1", name="find", output=output, error=error),
            ),
            tools=TOOLS,
        )

    def text(events: list[ModelEvent]) -> str:
        return "".join(e.text for e in events if isinstance(e, ModelText))

    assert text(await play(after({"name": "Vista", "open": True}))) == "Vista is open."
    assert text(await play(after({"name": "Vista", "open": False}))) == "Vista is closed."
    assert text(await play(after(error="offline"))) == "No store: offline"


async def test_error_rule_streams_then_raises_provider_error():
    seen: list[ModelEvent] = []

    async def consume() -> None:
        async for event in ScriptedProvider(SCENARIO).stream(user("fail")):
            seen.append(event)

    with pytest.raises(ProviderError, match="cut"):
        await consume()
    assert seen == [ModelText("half")]


def test_render_filters_and_missing_values():
    context = {"output": {"level": 0.823, "price": 5, "on": True, "list": [1, 2]}}
    assert render("{output.level|percent}", context) == "82%"
    assert render("${output.price|money}", context) == "$5.00"
    assert render("{output.on} {output.list} {output.missing}!", context) == "yes [1, 2] !"


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("pace = 'fast'", "pace"),
        ("[[rules]]\nmatch = '('", "bad regex"),
        ("[[rules]]\nsay = 'no match key'", "match"),
        ("[[rules]]\nmatch = 'x'\nunknown = 1", "unknown"),
        ("not toml at all ===", "TOML"),
    ],
)
def test_bad_scenario_files_name_the_file_and_the_problem(tmp_path: Path, content, words):
    path = tmp_path / "scenario.toml"
    path.write_text(content)
    with pytest.raises(ConfigError) as raised:
        load_scenario(path)
    assert str(path) in str(raised.value)
    assert words in str(raised.value)


def test_the_demo_scenario_loads():
    demo = Path(__file__).parents[1] / "gateway" / "demo" / "scenario.toml"
    assert len(load_scenario(demo).rules) > 5


async def test_rules_see_only_the_start_of_a_long_message():
    scenario = Scenario(
        pace=0,
        fallback="no match",
        rules=[Rule(match=r"^(a+)+$", say="all a"), Rule(match=r"tail", say="saw the tail")],
    )
    # ^(a+)+$ backtracks exponentially on "aaa...b"; on the capped text it has no b to hit,
    # and a word past the cap is not seen at all.
    text = "a" * RULE_TEXT_MAX_CHARS + "b tail"
    events = await play(user(text), scenario)
    assert "".join(e.text for e in events if isinstance(e, ModelText)) == "all a"


# ----------------------------------------------------------- pushed (paced) answers


class _Room:
    """What the session's model backlog offers a provider that pushes."""

    def __init__(self) -> None:
        self.full = False
        self.room = Flag(True)


def paced(pace: float = 0.001) -> ScriptedProvider:
    return ScriptedProvider(msgspec.structs.replace(SCENARIO, pace=pace))


async def pushed(provider: ScriptedProvider, request: ModelRequest) -> list[ModelEvent]:
    seen: list[ModelEvent] = []

    def sink(events: list[ModelEvent]) -> bool:
        seen.extend(events)
        return True

    played = provider.push(request, sink, _Room())
    assert played is not None
    await asyncio.wait_for(played, 10)
    return seen


@pytest.mark.parametrize("text", ["say  hello   there ", "store near 92031", "nothing matches"])
async def test_a_paced_answer_pushed_is_the_answer_streamed(text: str):
    provider = paced()
    assert await pushed(provider, user(text)) == [e async for e in provider.stream(user(text))]


async def test_at_pace_zero_the_model_streams_instead():
    assert ScriptedProvider(SCENARIO).push(user("say hi"), lambda events: True, _Room()) is None


async def test_a_pushed_error_rule_gives_its_words_then_fails():
    seen: list[ModelEvent] = []

    def sink(events: list[ModelEvent]) -> bool:
        seen.extend(events)
        return True

    played = paced().push(user("fail"), sink, _Room())
    assert played is not None
    with pytest.raises(ProviderError, match="cut"):
        await asyncio.wait_for(played, 10)
    assert seen == [ModelText("half")]


async def test_a_sink_that_says_stop_gets_nothing_more():
    calls: list[list[ModelEvent]] = []

    def sink(events: list[ModelEvent]) -> bool:
        calls.append(events)
        return False  # the step failed

    played = paced().push(user("say one two three"), sink, _Room())
    assert played is not None
    await asyncio.wait_for(played, 10)
    assert len(calls) == 1
    assert calls[0][0] == ModelText("You ")


async def test_cancelling_a_pushed_answer_stops_its_words():
    seen: list[ModelEvent] = []
    first = asyncio.get_running_loop().create_future()

    def sink(events: list[ModelEvent]) -> bool:
        seen.extend(events)
        if not first.done():
            first.set_result(None)
        return True

    played = paced(0.01).push(user("say " + "word " * 50), sink, _Room())
    assert isinstance(played, asyncio.Future)
    await asyncio.wait_for(first, 10)
    played.cancel()
    after_cancel = len(seen)
    # The words were due every 10 ms: wait for the pacer to pass several of their turns.
    passed = asyncio.get_running_loop().create_future()
    pacer_of_loop = pacer()
    pacer_of_loop.call_at(asyncio.get_running_loop().time() + 0.1, lambda: passed.set_result(None))
    await asyncio.wait_for(passed, 10)
    assert len(seen) == after_cancel == 1


async def test_a_pushed_answer_waits_while_the_session_has_no_room():
    room = _Room()
    seen: list[ModelEvent] = []
    first = asyncio.get_running_loop().create_future()

    def sink(events: list[ModelEvent]) -> bool:
        seen.extend(events)
        if not first.done():
            room.full = True  # the session's backlog of the model's events is full
            room.room.clear()
            first.set_result(len(seen))
        return True

    played = paced().push(user("say " + "word " * 20), sink, room)
    assert played is not None
    given = await asyncio.wait_for(first, 10)
    passed = asyncio.get_running_loop().create_future()
    pacer().call_at(asyncio.get_running_loop().time() + 0.05, lambda: passed.set_result(None))
    await asyncio.wait_for(passed, 10)
    assert len(seen) == given < 22  # the rest was due long ago, and waits
    room.full = False
    room.room.set()
    await asyncio.wait_for(played, 10)
    assert len([e for e in seen if isinstance(e, ModelText)]) == 22
    assert isinstance(seen[-1], ModelFinish)


async def test_words_due_together_reach_the_session_in_one_call():
    """A stream that fell behind (the loop was busy) catches up: its late words are given
    at once, and so go out in one socket write."""
    calls: list[list[ModelEvent]] = []

    def sink(events: list[ModelEvent]) -> bool:
        calls.append(events)
        return True

    provider = paced(0.001)
    played = provider.push(user("say " + "word " * 20), sink, _Room())
    assert played is not None
    # The event loop held up (blocking it is the point): about ten words fall due meanwhile.
    time.sleep(0.010)  # noqa: ASYNC251
    await asyncio.wait_for(played, 10)
    texts = [e for events in calls for e in events if isinstance(e, ModelText)]
    assert len(texts) == 22
    assert max(len(events) for events in calls) > 1


async def test_tool_choice_picks_the_rules_that_keep_to_it():
    def asking(text: str, choice: str) -> ModelRequest:
        return msgspec.structs.replace(user(text), tool_choice=choice)

    scenario = msgspec.structs.replace(
        SCENARIO,
        rules=[
            Rule(match="^both", say="Just words."),
            *SCENARIO.rules[:2],
            Rule(match="^both", calls=[ScriptedCall("add", {"a": 1, "b": 2})]),
        ],
    )
    # "none": a rule that calls a tool is passed over, as is the fallback's silence.
    events = await play(asking("store near 92031", "none"), scenario)
    assert [e.text for e in events if isinstance(e, ModelText)] == ["no ", "idea"]
    # "required" and a tool's name: only rules that call (that) tool answer.
    events = await play(asking("both", "required"), scenario)
    assert events[0] == ModelToolCall(name="add", args={"a": 1, "b": 2})
    events = await play(asking("both", "add"), scenario)
    assert events[0] == ModelToolCall(name="add", args={"a": 1, "b": 2})
    events = await play(asking("both", "auto"), scenario)
    assert isinstance(events[0], ModelText)
    # A forced choice no rule keeps to fails the step, saying why.
    with pytest.raises(ProviderError, match="no rule for this message that calls 'find'"):
        await play(asking("both", "find"), scenario)
