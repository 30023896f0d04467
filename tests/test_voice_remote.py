"""The remote speech engines (gateway/voice/remote.py) against aimock, a real third-party server.

aimock (``@copilotkit/aimock``, which ``make test`` installs into ``.aimock/``) serves
``/v1/audio/transcriptions`` and ``/v1/audio/speech`` from the fixtures in
``tests/data/aimock/voice.json``: a transcription's text, a tone as raw PCM (the same
``TONE`` as here, base64), the same tone labelled MP3, and error statuses. Its journal keeps
only the model and the text of each request, so the tests also read the request as it left the
client (an httpx event hook): the form's fields and the WAV, the speech body's voice and format.

Streaming (audio out before the body is read, samples cut in half between chunks) is checked
against an httpx mock transport: aimock sends its audio in one piece.
"""

from __future__ import annotations

import array
import asyncio
import io
import json
import wave
from collections.abc import Iterator
from email.message import EmailMessage
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

import httpx
import pytest

from client_sdk import connect
from gateway.agent.file import DEMO_AGENT
from gateway.errors import ProviderError
from gateway.voice.base import Transcript
from gateway.voice.offline import PiperTTS
from gateway.voice.remote import OpenAISpeechToText, OpenAITextToSpeech
from gateway.wire.audio_frame import AnswerAudio
from gateway.wire.v1 import AudioDone, InputTranscript
from tests import test_aimock
from tests.support import serving
from tests.test_aimock import aimock
from tests.voice_support import chunks

needs_aimock = test_aimock.pytestmark  # skipped where aimock is not installed (not in CI)

KEY = "sk-test-secret-key"
TONE = array.array("h", (12000 - abs(t % 48 - 24) * 1000 for t in range(2400))).tobytes()
"""0.1 s of a 500 Hz triangle at 24 kHz: what the speech fixture sends (exact integers)."""


def recording_client() -> tuple[httpx.Client, list[httpx.Request]]:
    """A client that keeps each request it sends, as it went out."""
    sent: list[httpx.Request] = []
    return httpx.Client(event_hooks={"request": [sent.append]}), sent


def form_parts(request: httpx.Request) -> dict[str, bytes]:
    """A multipart/form-data request's parts by name."""
    head = f"content-type: {request.headers['content-type']}\r\n\r\n".encode()
    message = BytesParser(policy=HTTP).parsebytes(head + request.read())
    assert isinstance(message, EmailMessage)
    parts = {}
    for part in message.iter_parts():
        assert isinstance(part, EmailMessage)
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        assert isinstance(name, str)
        assert isinstance(payload, bytes)
        parts[name] = payload
    return parts


async def journal(url: str) -> list[dict[str, Any]]:
    """What aimock recorded of the requests it served."""
    async with httpx.AsyncClient() as client:
        entries = (await client.get(url + "/__aimock/journal")).json()
    assert isinstance(entries, list)
    return entries


@needs_aimock
async def test_a_transcription_sends_a_wav_of_the_utterance_and_returns_the_servers_text():
    client, sent = recording_client()
    speech = array.array("h", (t % 200 - 100 for t in range(8000))).tobytes()  # 0.5 s at 16 kHz
    async with aimock(chunk_size=20) as url:
        engine = OpenAISpeechToText(url + "/v1/", KEY, language="en", client=client)
        stream = engine.stream()
        assert [stream.feed(speech[i : i + 3200]) for i in range(0, len(speech), 3200)] == [
            None
        ] * 5  # the API is not streaming: no partials
        transcript = await asyncio.to_thread(stream.finish)
        [entry] = await journal(url)
    client.close()

    assert (transcript.text, transcript.final) == ("Where is my order?", True)
    assert entry["path"] == "/v1/audio/transcriptions"
    assert entry["body"]["model"] == "whisper-1"  # as aimock parsed the form
    [request] = sent
    assert request.headers["authorization"] == f"Bearer {KEY}"  # aimock journals it redacted
    parts = form_parts(request)
    assert (parts["model"], parts["response_format"], parts["language"]) == (
        b"whisper-1",
        b"json",
        b"en",
    )
    with wave.open(io.BytesIO(parts["file"])) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 16000)
        assert wav.getnframes() == len(speech) // 2
        assert wav.readframes(wav.getnframes()) == speech


@needs_aimock
async def test_speech_comes_through_sample_for_sample_at_24k_and_resampled_at_16k():
    client, sent = recording_client()
    text = "Your package is on the way."
    async with aimock(chunk_size=20) as url:
        engine = OpenAITextToSpeech(url + "/v1", KEY, voice="nova", client=client)
        at_24k = await asyncio.to_thread(lambda: b"".join(engine.synthesize(text, 24000)))
        at_16k = await asyncio.to_thread(lambda: b"".join(engine.synthesize(text, 16000)))
        entries = await journal(url)
    client.close()

    assert at_24k == TONE
    assert abs(len(at_16k) // 2 - 1600) <= 4  # 2400 samples * 16000 / 24000
    for entry in entries:
        assert entry["path"] == "/v1/audio/speech"
        assert entry["response"]["status"] == 200
        assert entry["body"]["model"] == "tts-1"
        assert entry["body"]["messages"] == [{"role": "user", "content": text}]
    assert len(entries) == len(sent) == 2
    assert json.loads(sent[0].read()) == {
        "model": "tts-1",
        "input": text,
        "voice": "nova",
        "response_format": "pcm",
    }


@needs_aimock
async def test_error_statuses_raise_with_the_status_and_the_servers_message_not_the_key():
    async with aimock(chunk_size=20) as url:
        tts = OpenAITextToSpeech(url + "/v1", KEY)
        with pytest.raises(ProviderError) as busy:
            await asyncio.to_thread(lambda: list(tts.synthesize("Too busy to speak.", 24000)))
        stt = OpenAISpeechToText(url + "/v1", KEY, model="whisper-locked")
        stream = stt.stream()
        stream.feed(b"\0\0" * 1600)
        with pytest.raises(ProviderError) as refused:
            await asyncio.to_thread(stream.finish)
        with pytest.raises(ProviderError) as mp3:
            await asyncio.to_thread(lambda: list(tts.synthesize("Say it as an MP3.", 24000)))
        tts.close()
        stt.close()

    assert "HTTP 503" in str(busy.value)
    assert "The voice server is overloaded" in str(busy.value)
    assert busy.value.retryable
    assert busy.value.code == "provider_error"
    assert "HTTP 403" in str(refused.value)
    assert "This model is not available to you" in str(refused.value)
    assert not refused.value.retryable
    assert "audio/mpeg, not raw PCM" in str(mp3.value)
    for error in (busy.value, refused.value, mp3.value):
        assert KEY not in str(error)


def test_speech_streams_each_chunk_as_it_arrives_and_keeps_samples_whole():
    pulled: list[int] = []  # how many chunks had come out when each piece of the body was read
    out: list[bytes] = []

    def body() -> Iterator[bytes]:
        for start in range(0, len(TONE), 7):  # 7 bytes: cuts samples in half
            pulled.append(len(out))
            yield TONE[start : start + 7]

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "audio/pcm"}, content=body())

    client = httpx.Client(transport=httpx.MockTransport(answer))
    for chunk in OpenAITextToSpeech("http://speech.test/v1", client=client).synthesize(
        "Hi.", 24000
    ):
        assert len(chunk) % 2 == 0
        out.append(chunk)
    assert b"".join(out) == TONE
    assert pulled == list(range(len(pulled)))  # each piece read only after the last came out


def test_a_lost_server_raises_without_the_key():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client = httpx.Client(transport=httpx.MockTransport(refuse))
    with pytest.raises(ProviderError) as lost:
        list(
            OpenAITextToSpeech("http://speech.test/v1", KEY, client=client).synthesize("Hi.", 16000)
        )
    assert "request to http://speech.test/v1/audio/speech failed" in str(lost.value)
    assert lost.value.retryable
    assert KEY not in str(lost.value)


def test_odd_length_or_too_much_audio_is_refused_and_the_stream_goes_on():
    engine = OpenAISpeechToText("http://speech.test/v1", max_seconds=0.01)  # 160 samples
    stream = engine.stream()
    with pytest.raises(ValueError, match="odd length"):
        stream.feed(b"\0\0\0")
    assert stream.feed(b"\0\0" * 100) is None
    with pytest.raises(ValueError, match=r"cap of 0\.01 s"):
        stream.feed(b"\0\0" * 61)
    assert stream.feed(b"\0\0" * 60) is None  # up to the cap exactly
    assert engine.stream().finish() == Transcript("", final=True)  # no audio: no request
    with pytest.raises(ValueError, match="positive"):
        OpenAITextToSpeech("http://speech.test/v1").synthesize("Hi.", 0)
    engine.close()


# ----------------------------------------------------------------- a session on them


@needs_aimock
@pytest.mark.slow
async def test_a_session_hears_and_speaks_through_the_remote_engines():
    """``voice=remote``: the speech workers run the remote engines against aimock (Silero
    finds the turn in the worker; aimock's transcription says "Where is my order?" to any
    audio, and its speech is the fixture's tone, which comes back sample for sample)."""
    words = b"".join(PiperTTS().synthesize("where is my order", 16000))
    silence = b"\0\0" * 16000
    async with (
        aimock(chunk_size=4096) as url,
        serving(
            agent=str(DEMO_AGENT),
            scripted_pace=0.0,
            voice="remote",
            voice_url=url + "/v1",
            voice_api_key=KEY,
            voice_workers=1,
        ) as gateway,
        connect(gateway.url, audio={}) as conv,
    ):
        created = await conv.start()
        events, frames = conv.events(), list[AnswerAudio]()

        async def collect() -> None:
            async for frame in conv.audio():
                frames.append(frame)

        reading = asyncio.create_task(collect())
        for chunk in chunks(silence[:9600] + words + silence, 16000, 20):
            await conv.send_audio(chunk)
        final, done = None, None
        async with asyncio.timeout(60):
            async for event in events:
                if isinstance(event, InputTranscript) and event.final:
                    final = event
                if isinstance(event, AudioDone):
                    done = event
                    break
        reading.cancel()
    assert created.voices == ["alloy"]
    assert final is not None
    assert final.text == "Where is my order?"
    assert done is not None
    assert done.status == "completed"
    assert frames[0].pcm == TONE  # 0.1 s at 24 kHz: the server's audio, as it sent it
