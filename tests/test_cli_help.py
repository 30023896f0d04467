"""`--help` says what every flag does: each command's flags, and the commands themselves.

The serve flags come from `Config`: each field's `Meta(description=...)` is its help line.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Iterator

import msgspec
import pytest

from gateway.__main__ import _description, _help_phrase, _parser
from gateway.config import Config

GATEWAY = [sys.executable, "-m", "gateway"]
_DEFAULT_PART = re.compile(r"\s*\(default: [^()]*\)\s*$")
"""What the help says beyond what a flag does: its default (and a serve flag's variable)."""
_MIN_WORDS = 3


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command and subcommand of ``parser``, with the words that run it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


COMMANDS = dict(_commands(_parser()))
"""``()`` is ``gateway`` itself; ``("serve",)``, ``("tools", "list")``..."""


def _flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        action
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
    ]


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    return [
        name
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
    ]


def _what_it_does(help_text: str) -> str:
    return _DEFAULT_PART.sub("", help_text).strip()


def _run_help(path: tuple[str, ...]) -> str:
    # A wide terminal: one entry's help is then on one line, not wrapped.
    env = {**os.environ, "COLUMNS": "1000"}
    done = subprocess.run(
        [*GATEWAY, *path, "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _entries(help_output: str) -> dict[str, str]:
    """``--flag`` (or a positional's name) -> its help, from argparse's output."""
    entries: dict[str, str] = {}
    current = None
    for line in help_output.splitlines():
        start = re.match(r"^  (\S.*?)(?:\s{2,}(\S.*))?$", line)
        if start:
            invocation, text = start.groups()
            longs = re.findall(r"--[\w-]+", invocation)
            current = longs[-1] if longs else invocation.split()[0]
            entries[current] = text or ""
        elif current and line.startswith("   ") and line.strip():
            entries[current] = f"{entries[current]} {line.strip()}".strip()
        elif not line.strip():
            current = None
    return entries


@pytest.mark.parametrize("path", [path for path in COMMANDS if path], ids=" ".join)
def test_every_flag_says_what_it_does_and_its_default(path: tuple[str, ...]):
    parser = COMMANDS[path]
    for action in _flags(parser):
        name = action.option_strings[-1] if action.option_strings else action.dest
        assert action.help, f"gateway {' '.join(path)} {name}: no help"
        assert len(_what_it_does(action.help).split()) >= _MIN_WORDS, (
            f"gateway {' '.join(path)} {name}: the help says only {action.help!r}"
        )
        if action.option_strings:  # a positional is required: it has no default
            assert "(default: " in action.help, f"gateway {' '.join(path)} {name}: no default"


@pytest.mark.parametrize("path", list(COMMANDS), ids=lambda path: " ".join(("gateway", *path)))
def test_help_output_lists_every_flag_with_what_it_does(path: tuple[str, ...]):
    entries = _entries(_run_help(path))
    flags = _flags(COMMANDS[path])
    for action in flags:
        name = action.option_strings[-1] if action.option_strings else action.dest
        assert name in entries, f"gateway {' '.join(path)} --help: no {name}"
        assert len(_what_it_does(entries[name]).split()) >= _MIN_WORDS, entries[name]
        if action.option_strings:
            assert "(default: " in entries[name], entries[name]


@pytest.mark.parametrize(
    "path",
    [path for path, parser in COMMANDS.items() if _subcommands(parser)],
    ids=lambda path: " ".join(("gateway", *path)),
)
def test_help_lists_each_subcommand_with_a_line(path: tuple[str, ...]):
    output = _run_help(path)
    for name in _subcommands(COMMANDS[path]):
        line = re.search(rf"^ {{4}}{name} +(\S.*)$", output, re.MULTILINE)
        assert line, f"gateway {' '.join(path)} --help does not list {name}:\n{output}"
        assert len(line.group(1).split()) >= _MIN_WORDS, line.group(0)


def test_gateway_help_lists_every_command():
    output = _run_help(())
    assert set(_subcommands(COMMANDS[()])) >= {"serve", "chat", "schema", "tools"}
    for name in ("serve", "chat", "schema", "tools"):
        assert re.search(rf"^ +{name} +\w+ \w+ \w+", output, re.MULTILINE), output


def test_serve_help_gives_each_setting_its_description_default_and_variable():
    entries = _entries(_run_help(("serve",)))
    for field in msgspec.structs.fields(Config):
        flag = f"--{field.name.replace('_', '-')}"
        description = _description(field.type)
        assert description, f"Config.{field.name} has no Meta(description=...)"
        assert entries[flag].startswith(_help_phrase(description) + " (default: "), entries[flag]
        assert f"env GATEWAY_{field.name.upper()}" in entries[flag]
    assert entries["--max-sessions"].endswith(
        "(default: 20000; env GATEWAY_MAX_SESSIONS, null disables)"
    )
    assert entries["--agent"].endswith("(default: unset; env GATEWAY_AGENT)")
    assert entries["--no-auth"].endswith("(default: off; env GATEWAY_NO_AUTH)")
    assert entries["--log-level"].endswith("(default: info; env GATEWAY_LOG_LEVEL)")


@pytest.mark.parametrize("field", msgspec.structs.fields(Config), ids=lambda f: f.name)
def test_each_setting_is_described_in_one_short_sentence(field: msgspec.structs.FieldInfo):
    description = _description(field.type)
    assert description.endswith("."), description
    assert ". " not in description, f"more than one sentence: {description!r}"
    assert len(description) <= 80, description


def test_flags_still_parse_as_before():
    args = _parser().parse_args(
        ["serve", "--max-sessions", "5", "--lease-ttl", "0.5", "--log-level", "debug", "--no-auth"]
    )
    assert (args.max_sessions, args.lease_ttl, args.log_level, args.no_auth) == (
        5,
        0.5,
        "debug",
        True,
    )
    assert args.port is None  # unset flags leave the GATEWAY_* variables in charge
    # The choices are shown, not enforced by argparse: from_env names a bad value.
    assert _parser().parse_args(["serve", "--log-level", "loud"]).log_level == "loud"
