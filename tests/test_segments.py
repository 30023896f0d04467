"""Segmenter: speakable segments of streamed text, the same however the text is cut."""

# ruff: noqa: RUF001 (CJK punctuation is the point of these texts)
from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from gateway.core.segments import Segmenter

FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # man, ZWJ, woman, ZWJ, girl
JAPAN = "\U0001f1ef\U0001f1f5"  # regional indicators J P
FRANCE = "\U0001f1eb\U0001f1f7"
THUMBS_UP = "\U0001f44d\U0001f3fd"  # thumbs up, medium skin tone
WAVE = "\U0001f44b\U0001f3ff"


def segment(text: str, **options: Any) -> list[str]:
    """The segments of ``text`` fed whole, then flushed."""
    segmenter = Segmenter(**options)
    segments = segmenter.feed(text)
    rest = segmenter.flush()
    return segments if rest is None else [*segments, rest]


def segment_in_pieces(text: str, cuts: list[int], **options: Any) -> list[str]:
    """The segments of ``text`` fed as the deltas between ``cuts``, then flushed."""
    segmenter = Segmenter(**options)
    bounds = [0, *cuts, len(text)]
    segments = [s for a, b in itertools.pairwise(bounds) for s in segmenter.feed(text[a:b])]
    rest = segmenter.flush()
    return segments if rest is None else [*segments, rest]


CASES = [
    pytest.param(
        "Hello there. How are you? I am fine.",
        ["Hello there. ", "How are you? ", "I am fine."],
        {},
        id="plain-sentences",
    ),
    pytest.param(
        "Really?! Yes. No way!?",
        ["Really?! ", "Yes. ", "No way!?"],
        {},
        id="mark-runs",
    ),
    pytest.param(
        'He said "Go." Then left.',
        ['He said "Go." ', "Then left."],
        {},
        id="quote-after-period",
    ),
    pytest.param(
        '"Stop!" she said. (It worked.) "Why?" he asked.',
        ['"Stop!" she said. ', "(It worked.) ", '"Why?" he asked.'],
        {},
        id="closers-and-lowercase-after-quote",
    ),
    pytest.param(
        "Pi is 3.14 and e is 2.718. Both are 1,000.50 times smaller. Ok.",
        ["Pi is 3.14 and e is 2.718. ", "Both are 1,000.50 times smaller. ", "Ok."],
        {},
        id="numbers",
    ),
    pytest.param(
        "It costs $1,299.99. That is a lot.",
        ["It costs $1,299.99. ", "That is a lot."],
        {},
        id="money",
    ),
    pytest.param(
        "Growth was 10.5%. Next year it is 12%.",
        ["Growth was 10.5%. ", "Next year it is 12%."],
        {},
        id="percentages",
    ),
    pytest.param(
        "Update to v2.0.1. It fixes bugs in 1.9.3 and 2.0.0.",
        ["Update to v2.0.1. ", "It fixes bugs in 1.9.3 and 2.0.0."],
        {},
        id="versions",
    ),
    pytest.param(
        "Dr. Smith is in. Mr. and Mrs. Jones are out. Prof. Lee vs. Dr. Who.",
        ["Dr. Smith is in. ", "Mr. and Mrs. Jones are out. ", "Prof. Lee vs. Dr. Who."],
        {},
        id="title-abbreviations",
    ),
    pytest.param(
        "Use a tool, e.g. this one. It helps, i.e. It works.",
        ["Use a tool, e.g. this one. ", "It helps, i.e. It works."],
        {},
        id="e.g.-and-i.e.",
    ),
    pytest.param(
        "The U.S. economy grew. The U.S. Army marched.",
        ["The U.S. economy grew. ", "The U.S. Army marched."],
        {},
        id="U.S.",
    ),
    pytest.param(
        "J. R. R. Tolkien wrote it. He was British.",
        ["J. R. R. Tolkien wrote it. ", "He was British."],
        {},
        id="initials",
    ),
    pytest.param(
        "We meet at 9 a.m. tomorrow. Or at 10 a.m. Eastern time. Fine.",
        ["We meet at 9 a.m. tomorrow. ", "Or at 10 a.m. Eastern time. ", "Fine."],
        {},
        id="a.m.",
    ),
    pytest.param(
        "Apples, pears, etc. Then more. Jan. Smith left.",
        ["Apples, pears, etc. Then more. ", "Jan. Smith left."],
        {},
        id="etc.-before-capital-is-an-abbreviation",
    ),
    pytest.param(
        "See No. 5 here. No. That is wrong.",
        ["See No. 5 here. ", "No. ", "That is wrong."],
        {},
        id="No.-only-before-a-digit",
    ),
    pytest.param(
        "See https://example.com/a.b?c=d. Then reload.",
        ["See https://example.com/a.b?c=d. ", "Then reload."],
        {},
        id="url-with-trailing-period",
    ),
    pytest.param(
        "Visit example.com today! Write to ada@example.org. She answers.",
        ["Visit example.com today! ", "Write to ada@example.org. ", "She answers."],
        {},
        id="domain-and-email",
    ),
    pytest.param(
        "Open report.pdf and notes.v2.txt. Then save.",
        ["Open report.pdf and notes.v2.txt. ", "Then save."],
        {},
        id="file-names",
    ),
    pytest.param(
        "Call `a.b()` first. Then `x. Y? Z` runs.",
        ["Call `a.b()` first. ", "Then `x. Y? Z` runs."],
        {},
        id="inline-code",
    ),
    pytest.param(
        "Here:\n```python\nx = 1. Y = 2\n\nprint(x)\n```\nDone. Bye.",
        ["Here:\n", "```python\nx = 1. Y = 2\n\nprint(x)\n```\n", "Done. ", "Bye."],
        {},
        id="fenced-code-block",
    ),
    pytest.param(
        "```\ncode. More\n",
        ["```\ncode. More\n"],
        {},
        id="unclosed-fence-is-the-rest",
    ),
    pytest.param(
        "Wait... what was that? Hmm... Let me think.",
        ["Wait... what was that? ", "Hmm... ", "Let me think."],
        {},
        id="ellipsis-mid-sentence",
    ),
    pytest.param(
        "I wonder\u2026 Maybe later...",
        ["I wonder\u2026 ", "Maybe later..."],
        {},
        id="ellipsis-at-the-end",
    ),
    pytest.param(
        f"We are {FAMILY}! {FAMILY} is a family. Ok.",
        [f"We are {FAMILY}! ", f"{FAMILY} is a family. ", "Ok."],
        {},
        id="zwj-emoji",
    ),
    pytest.param(
        f"I live in {JAPAN}. {FRANCE} is next!",
        [f"I live in {JAPAN}. ", f"{FRANCE} is next!"],
        {},
        id="flags",
    ),
    pytest.param(
        f"Nice {THUMBS_UP}. Thanks {WAVE}! {THUMBS_UP} Bye.",
        [f"Nice {THUMBS_UP}. ", f"Thanks {WAVE}! ", f"{THUMBS_UP} Bye."],
        {},
        id="skin-tones",
    ),
    pytest.param(
        "你好。今天天气很好！我们去公园吧？好的。",
        ["你好。", "今天天气很好！", "我们去公园吧？", "好的。"],
        {},
        id="chinese",
    ),
    pytest.param(
        "こんにちは。元気ですか？はい、元気です！「本当？」",
        ["こんにちは。", "元気ですか？", "はい、元気です！", "「本当？」"],
        {},
        id="japanese",
    ),
    pytest.param(
        "我喜欢 Python 3.12。It is fast. 真的！Yes!",
        ["我喜欢 Python 3.12。", "It is fast. ", "真的！", "Yes!"],
        {},
        id="mixed-cjk-latin",
    ),
    pytest.param(
        "Steps:\n- Open it\n* Close it\n\n1. First\n2. Second",
        ["Steps:\n", "- Open it\n", "* Close it\n\n", "1. First\n", "2. Second"],
        {},
        id="markdown-list",
    ),
    pytest.param(
        "# Title\nSome text here.\n## Next\nMore.",
        ["# Title\nSome text here.\n", "## Next\nMore."],
        {},
        id="headings",
    ),
    pytest.param(
        "First paragraph\n\nsecond paragraph\nstill second",
        ["First paragraph\n\n", "second paragraph\nstill second"],
        {},
        id="paragraph",
    ),
    pytest.param(
        "It is ok. and then more. I have 3. Then 4.",
        ["It is ok. and then more. ", "I have 3. ", "Then 4."],
        {},
        id="lowercase-after-period-and-number-at-sentence-end",
    ),
    pytest.param(
        "one two three, four five six seven, eight nine ten eleven twelve thirteen fourteen",
        [
            "one two three, four five six seven, ",
            "eight nine ten eleven twelve thirteen ",
            "fourteen",
        ],
        {"max_chars": 40, "first_min_chars": None},
        id="max-chars-clause-split",
    ),
    pytest.param(
        "aaaa bbbb cccc dddd eeee ffff gggg hhhh",
        ["aaaa bbbb ", "cccc dddd ", "eeee ffff ", "gggg hhhh"],
        {"max_chars": 12},
        id="max-chars-whitespace-split",
    ),
    pytest.param(
        "Go to https://example.com/a/very/long/path/x.html now please.",
        ["Go to ", "https://example.com/a/very/long/path/x.html ", "now please."],
        {"max_chars": 20},
        id="max-chars-never-inside-a-url",
    ),
    pytest.param(
        "Run `some.long.code(call, here)` now, ok then we go on and on.",
        ["Run ", "`some.long.code(call, here)` ", "now, ", "ok then we go on and ", "on."],
        {"max_chars": 20},
        id="max-chars-never-inside-code",
    ),
    pytest.param(
        "Sure, I can help with that, and here is the rest, as usual. Done.",
        ["Sure, I can help with that, ", "and here is the rest, as usual. ", "Done."],
        {},
        id="first-segment-early-at-comma",
    ),
    pytest.param(
        "Yes, it is. More, and more, and more, and even more here.",
        ["Yes, it is. ", "More, and more, and more, and even more here."],
        {},
        id="short-first-sentence-not-cut-at-comma",
    ),
    pytest.param(
        "Here is the thing I wanted \u2014 it works now.",
        ["Here is the thing I wanted \u2014 ", "it works now."],
        {},
        id="first-segment-early-at-dash",
    ),
    pytest.param(
        "这是一个非常非常长的开头句子，我们需要尽快开始说话，然后继续。",
        ["这是一个非常非常长的开头句子，", "我们需要尽快开始说话，然后继续。"],
        {"first_min_chars": 10},
        id="first-segment-early-at-cjk-comma",
    ),
    pytest.param(
        "  Hello. World.  ",
        ["  Hello. ", "World.  "],
        {},
        id="outer-whitespace-stays",
    ),
]


@pytest.mark.parametrize(("text", "expected", "options"), CASES)
def test_segments_of_tricky_texts(text: str, expected: list[str], options: dict[str, Any]):
    assert segment(text, **options) == expected


EXTRA_TEXTS = [
    "A `stray backtick. Then\nNew line. Ok.",
    "Code ``a ` b``. Then ok.",
    "Text before\n  ```js\nlet a = 1;\n  ```   \n\n  After.",
    "Numbers:\n10. Ten\n11) Eleven\n2024 was a year. Yes.",
    "Long one; with clauses: many, many, many \u2013 dashes \u2014 and more words to hold "
    "back until the limit comes and goes, again and again, without any end at all",
    "很长的句子，没有句号；还有更多、更多的字：结束。「对！」好",
    "Mixed\r\n\r\nline ends.\r\n- item\r\n",
    f"Edge {FAMILY}{FAMILY}. {JAPAN}{FRANCE}! Wave {WAVE}? {THUMBS_UP}",
    "   \n  ",
    "",
]
FRAGMENTS = [
    *("Word", "word", "Dr.", "e.g.", "U.S.", "J.", "etc.", "No.", "3.14", "$1,299.99", "v2.0.1"),
    *("https://example.com/a.b?c=d", "ada@example.org", "report.pdf", "1.", "12)", "- ", "# "),
    *(".", "!", "?", "?!", "...", "\u2026", ",", ";", ":", " \u2014 ", '"', "'", ")", "("),
    *(" ", " ", " ", "  ", "\n", "\n\n", "\t", "`", "``", "```", "\n```\n", "\n```py\n"),
    *("你好", "。", "！", "？", "，", "、", "」", "「", FAMILY, JAPAN, THUMBS_UP, "\u0301"),
]


def random_text(seed: int) -> str:
    """A text of tricky fragments in random order: what no table would think of."""
    rng = random.Random(seed)
    return "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 80)))


TEXTS = [(p.values[0], p.values[2]) for p in CASES] + [(t, {}) for t in EXTRA_TEXTS]
TEXTS += [(random_text(seed), {}) for seed in range(40)]
TEXTS += [(t, {"max_chars": 15, "first_min_chars": 5}) for t, _ in TEXTS]


def cuttings(text: str, seed: int) -> list[list[int]]:
    """Ways to cut ``text`` into deltas: character by character, word by word, at random."""
    rng = random.Random(seed)
    inner = range(1, len(text))
    ways = [list(inner), [i + 1 for i, char in enumerate(text[:-1]) if char.isspace()]]
    for _ in range(25):
        ways.append(sorted(rng.sample(inner, min(len(inner), rng.randint(1, 12)))))
    return ways


@pytest.mark.parametrize(("text", "options"), TEXTS)
def test_segments_do_not_depend_on_how_the_text_is_cut(text: str, options: dict[str, Any]):
    whole = segment(text, **options)
    for cuts in cuttings(text, seed=len(text)):
        assert segment_in_pieces(text, cuts, **options) == whole, cuts


@pytest.mark.parametrize(("text", "options"), TEXTS)
def test_segments_join_back_into_the_text(text: str, options: dict[str, Any]):
    segments = segment(text, **options)
    if not text.strip():
        assert segments == []
        return
    assert "".join(segments) == text
    assert not any(s.isspace() for s in segments)
    assert not any(s[0].isspace() for s in segments[1:])


GRAPHEME_TEXTS = [
    f"We are {FAMILY}! {FAMILY} is a family.{FAMILY} Ok.",
    f"I live in {JAPAN}. {FRANCE}{JAPAN} is next!{FRANCE}",
    f"Nice {THUMBS_UP}. Thanks {WAVE}!{WAVE} {THUMBS_UP} Bye.",
    "好。\u0301 Cafe\u0301. E\u0301t\u00e9! \u0301Ok",
]


@pytest.mark.parametrize("text", GRAPHEME_TEXTS)
@pytest.mark.parametrize("options", [{}, {"max_chars": 3, "first_min_chars": 0}])
def test_no_segment_starts_inside_a_grapheme(text: str, options: dict[str, Any]):
    segments = segment(text, **options)
    assert len(segments) > 1
    for piece in segments[1:]:
        assert piece[0] not in "\u200d\u0301\U0001f3fb\U0001f3fc\U0001f3fd\U0001f3fe\U0001f3ff"
        assert piece[:2] not in (JAPAN[1] + FRANCE[0], FRANCE[1] + JAPAN[0])


def test_a_sentence_goes_out_with_the_first_character_of_the_next():
    segmenter = Segmenter()
    assert segmenter.feed("Hello there.") == []
    assert segmenter.feed("  ") == []
    assert segmenter.feed("N") == ["Hello there.  "]
    assert segmenter.flush() == "N"


def test_the_first_clause_goes_out_before_its_sentence_ends():
    segmenter = Segmenter()
    assert segmenter.feed("Sure, I can help with that, ") == []
    assert segmenter.feed("b") == ["Sure, I can help with that, "]
    assert segmenter.feed("ut first, a question about the details, please. ") == []
    assert segmenter.feed("Ok") == ["but first, a question about the details, please. "]


def test_a_fenced_block_goes_out_when_it_closes():
    segmenter = Segmenter()
    assert segmenter.feed("Try:\n``") == []
    assert segmenter.feed("`sh\nls. Now\n\n") == ["Try:\n"]
    assert segmenter.feed("```\n") == []
    assert segmenter.feed("Ok.") == ["```sh\nls. Now\n\n```\n"]
    assert segmenter.flush() == "Ok."


def test_a_list_item_waits_for_its_marker():
    segmenter = Segmenter()
    assert segmenter.feed("Options:\n12") == []
    assert segmenter.feed(". A") == ["Options:\n"]
    assert segmenter.feed("\n2024 was") == []
    assert segmenter.flush() == "12. A\n2024 was"


def test_flush_keeps_whitespace_only_rest_for_the_next_step():
    segmenter = Segmenter()
    assert segmenter.flush() is None
    assert segmenter.feed(" \n") == []
    assert segmenter.flush() is None
    assert segmenter.feed("Hi.") == []
    assert segmenter.flush() == " \nHi."
    assert segmenter.flush() is None


def test_only_the_first_segment_of_an_answer_is_cut_early():
    segmenter = Segmenter()
    assert segmenter.feed("Let me check.") == []
    assert segmenter.flush() == "Let me check."  # end of a model step
    text = "Found it, the answer is long enough, yes. Ok"
    assert segmenter.feed(text) == ["Found it, the answer is long enough, yes. "]


def test_no_limits_wait_for_a_sentence_end():
    text = "word, " * 100 + "end. Next"
    assert segment(text, max_chars=None, first_min_chars=None) == [text[:-4], "Next"]


def test_empty_delta_returns_nothing():
    segmenter = Segmenter()
    assert segmenter.feed("") == []
    assert segmenter.flush() is None


@pytest.mark.parametrize(
    "options", [{"max_chars": 0}, {"first_min_chars": -1}], ids=["max_chars", "first_min_chars"]
)
def test_bad_limits_are_rejected(options: dict[str, Any]):
    with pytest.raises(ValueError, match="must"):
        Segmenter(**options)
