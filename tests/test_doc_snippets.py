"""Every Python snippet of the README, of docs/client-sdk.md and of the SDK's docstring,
saved as a file and run as a reader would, against a real gateway serving the demo agent:
it must print what the text says it prints (the ```text block right after it)."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest

from tests.support import serving

ROOT = Path(__file__).parents[1]
PAGES = ["README.md", "docs/client-sdk.md", "client_sdk/client.py"]
DOCUMENTED_URL = "ws://127.0.0.1:8000/v1/realtime"
# A python block, then (after some prose) the text block of what it prints.
SNIPPET = re.compile(
    r"```python\n(?P<code>.*?)```(?:(?:(?!```).)*?```text\n(?P<out>.*?)```)?", re.S
)


def snippets() -> list[tuple[str, str, str | None]]:
    found = []
    for page in PAGES:
        for index, match in enumerate(SNIPPET.finditer((ROOT / page).read_text())):
            found.append((f"{page}#{index + 1}", match["code"], match["out"]))
    return found


@pytest.mark.parametrize(("where", "code", "expected"), snippets(), ids=[s[0] for s in snippets()])
async def test_a_doc_snippet_runs_as_shown(tmp_path, where, code, expected):
    assert expected is not None, f"{where}: say what the snippet prints in a ```text block"
    assert DOCUMENTED_URL in code, f"{where}: snippets talk to {DOCUMENTED_URL}"
    async with serving(agent=None, scripted_pace=0.0) as demo:
        script = tmp_path / "snippet.py"
        script.write_text(code.replace(DOCUMENTED_URL, demo.url))  # the only change
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(30):
            out, err = await process.communicate()
    assert (process.returncode, err.decode()) == (0, "")
    assert out.decode() == expected


def test_every_page_has_snippets():
    pages = {where.split("#")[0] for where, _, _ in snippets()}
    assert pages == set(PAGES)
