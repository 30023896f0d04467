"""Voice in the web demo, in a real headless Chromium whose microphone is a WAV file: the user
presses the microphone and says "what's my battery level?" (synthesized by the offline TTS);
their words become their bubble, the model calls get_battery_level, and the answer's audio is
scheduled to play (the page counts it in ``document.body.dataset.audioFrames``)."""

from __future__ import annotations

import wave
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import expect

from gateway.voice.offline import load_offline
from tests.browser import open_page
from tests.support import Gateway, serving

pytestmark = pytest.mark.slow  # a real Chromium and the speech engines: seconds

RATE = 16000
UTTERANCE = "what's my battery level?"


@pytest.fixture
async def demo() -> AsyncIterator[Gateway]:
    # One speech worker: the machine has two cores, and Chromium needs one.
    async with serving(agent=None, scripted_pace=0.02, voice_workers=1) as gateway:
        yield gateway


@pytest.fixture
def spoken(tmp_path: Path) -> Path:
    """The utterance as a 16 kHz mono WAV: 0.5 s of silence (the page hooks the microphone up
    meanwhile), the words, then 1 s of silence (the end of the turn)."""
    pcm = b"".join(load_offline(prime=False).tts.synthesize(UTTERANCE, RATE))
    path = tmp_path / "battery.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(bytes(RATE) + pcm + bytes(2 * RATE))
    return path


def fake_microphone(wav: Path) -> list[str]:
    """Chromium flags: a granted, fake microphone playing ``wav`` once (``%noloop``), and
    audio that plays without a gesture (headless has no speakers to ask about)."""
    return [
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav}%noloop",
        "--autoplay-policy=no-user-gesture-required",
    ]


async def test_the_user_speaks_and_hears_the_answer(demo: Gateway, spoken: Path) -> None:
    async with open_page(
        demo, "voice-battery", permissions=["microphone"], flags=fake_microphone(spoken)
    ) as page:
        mic = page.locator("#mic")
        await expect(mic).to_be_visible()  # session.created says the gateway has audio
        await mic.click()  # a click: hands-free listening (server_vad)
        await expect(mic).to_have_attribute("data-state", "listening")
        user = page.locator(".msg.user:not(.partial)").first
        await expect(user).to_contain_text("battery", ignore_case=True, timeout=30_000)
        await expect(user).to_have_attribute("data-voice", "true")
        card = page.locator('.activity[data-tool="get_battery_level"]')
        await expect(card).to_have_count(1, timeout=30_000)
        await page.wait_for_function(
            "() => Number(document.body.dataset.audioFrames || 0) > 0", timeout=30_000
        )
        assert await page.evaluate("() => Number(document.body.dataset.audioMs)") > 0
