"""The OpenAI-compatible codec's audio, alone (``gateway.wire.openai.audio`` and the codec):
settings mapped onto v1's, the order of an answer's frames, G.711 both ways."""

from __future__ import annotations

import base64
import json
import math
from array import array
from typing import Any

import msgspec
import pytest

from gateway.core.audio import AudioRequest
from gateway.voice import g711
from gateway.wire.audio_frame import encode_answer_audio
from gateway.wire.openai.audio import SessionAudio, audio_update
from gateway.wire.openai.codec import OpenAIRealtimeCodec
from gateway.wire.openai.inbound import AudioConfig, Refused
from gateway.wire.v1 import (
    AudioDone,
    AudioFlush,
    Error,
    InputSpeechStarted,
    InputSpeechStopped,
    InputTranscript,
    ResponseCreated,
    ResponseDone,
    SessionCreated,
    SessionUpdated,
    TextDelta,
    TextDone,
    TextSegment,
    ToolCalls,
)
from gateway.wire.v1 import ClientCall as Call

VOICES = ("joe", "amy")


def convert_config(raw: dict[str, Any]) -> AudioConfig:
    return msgspec.convert(raw, AudioConfig)


def texts(frames: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(frame) for frame in frames]


def kinds(frames: list[bytes]) -> list[str]:
    return [event["type"] for event in texts(frames)]


def spoken_codec(fmt: str = "audio/pcm") -> OpenAIRealtimeCodec:
    """A codec whose session speaks, as the core confirmed."""
    codec = OpenAIRealtimeCodec(model="m", converters=lambda law, rate, inbound: _Law(law))
    created = SessionCreated(
        session_id="s", resume_token="r", agent="a", protocol_version=1, voices=list(VOICES)
    )
    codec.encode(created, b"")
    audio = {"input": {"format": {"type": fmt}}, "output": {"format": {"type": fmt}}}
    update = {"output_modalities": ["audio"], "audio": audio}
    (message,), _ = codec.decode(
        json.dumps({"type": "session.update", "event_id": "u1", "session": update})
    )
    assert message.audio is not None
    codec.encode(SessionUpdated(in_reply_to="u1"), b"")
    return codec


class _Law:
    """Stands in for a G.711 converter: one byte a sample, no resampling."""

    def __init__(self, law: str) -> None:
        self.law = law

    def feed(self, data: bytes, *, last: bool = False) -> bytes:
        return g711.encode("pcmu", data) if len(data) % 2 == 0 else data


def frame(seq: int, offset_ms: int, samples: int, *, last: bool = False) -> bytes:
    return encode_answer_audio("r1", seq, offset_ms, b"\x01\x00" * samples, last=last)


def seq_of(codec: OpenAIRealtimeCodec, msg: Any, seq: int) -> list[bytes]:
    msg.seq = seq
    return codec.encode(msg, b"")


def test_settings_map_onto_v1_audio_and_refuse_what_the_gateway_lacks():
    config = convert_config(
        {
            "input": {"format": {"type": "audio/pcmu"}, "turn_detection": None},
            "output": {"voice": "amy"},
        }
    )
    audio, request = audio_update(SessionAudio(), ["audio"], config, voices=VOICES, g711=True)
    assert request == AudioRequest(
        input_rate=16000, output_rate=24000, voice="amy", turn_detection="manual"
    )
    assert (audio.spoken, audio.input_format, audio.turn_detection) == (True, "audio/pcmu", None)
    # OpenAI's voice names the gateway has not: its own voice speaks.
    ash = convert_config({"output": {"voice": "ash"}})
    assert audio_update(audio, None, ash, voices=VOICES, g711=True)[0].voice == "amy"
    # Back to text: off.
    assert audio_update(audio, ["text"], None, voices=VOICES, g711=True)[1] is False
    vad = convert_config(
        {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 50}}}
    )
    assert audio_update(audio, None, vad, voices=VOICES, g711=True)[1].silence_ms == 100
    for config, modalities, g711_ok, code in [
        (
            convert_config({"input": {"format": {"type": "audio/opus"}}}),
            None,
            True,
            "invalid_message",
        ),
        (
            convert_config({"input": {"format": {"type": "audio/pcm", "rate": 16000}}}),
            None,
            True,
            "invalid_message",
        ),
        (convert_config({"input": {"format": {"type": "audio/pcma"}}}), None, False, "unsupported"),
        (
            convert_config({"input": {"turn_detection": {"type": "push"}}}),
            None,
            True,
            "invalid_message",
        ),
        (None, ["text", "audio"], True, "invalid_message"),
    ]:
        with pytest.raises(Refused) as refused:
            audio_update(SessionAudio(), modalities, config, voices=VOICES, g711=g711_ok)
        assert refused.value.code == code


def test_an_items_closing_waits_for_its_audio_and_the_response_for_the_item():
    codec = spoken_codec()
    codec.encode(ResponseCreated(response_id="r1"), b"")
    started = kinds(codec.encode(TextDelta(response_id="r1", delta="Hi there. "), b""))
    assert started[-1] == "response.output_audio_transcript.delta"
    assert seq_of(codec, TextSegment(response_id="r1", text="Hi there. "), 7) == []  # not asked
    # The text is done, the core response too: nothing closes while the audio comes.
    assert codec.encode(TextDone(response_id="r1", text="Hi there. "), b"") == []
    assert codec.encode(ResponseDone(response_id="r1", status="completed"), b"") == []
    (delta,) = texts(codec.encode_audio(frame(7, 0, 2400)))
    assert delta["type"] == "response.output_audio.delta"
    assert base64.b64decode(delta["delta"]) == b"\x01\x00" * 2400
    last = codec.encode_audio(frame(7, 100, 0, last=True))  # the segment's end, empty
    assert kinds(last) == [
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    done = texts(last)[-1]["response"]
    assert done["output"][0]["status"] == "completed"
    assert done["output"][0]["content"] == [{"type": "output_audio", "transcript": "Hi there. "}]
    assert texts(last)[1]["transcript"] == "Hi there. "


def test_a_function_call_after_speech_waits_for_the_speech_and_barge_in_cuts_it():
    codec = spoken_codec()
    codec.encode(ResponseCreated(response_id="r1"), b"")
    codec.encode(TextDelta(response_id="r1", delta="Let me check. "), b"")
    seq_of(codec, TextSegment(response_id="r1", text="Let me check. "), 3)
    codec.encode(TextDone(response_id="r1", text="Let me check. "), b"")
    calls = ToolCalls(
        response_id="r1",
        calls=[Call(call_id="c1", tool="f", display_name="F", args={}, deadline=0.0, timeout=30.0)],
    )
    assert codec.encode(calls, b"") == []  # after the speech
    # The user speaks over it: the speech stops (no last frame), all of it closes.
    flushed = codec.encode(AudioFlush(response_id="r1"), b"")
    assert flushed == []
    out = codec.encode(AudioDone(response_id="r1", audio_ms=0, status="interrupted"), b"")
    assert kinds(out)[0] == "response.output_audio.done"
    assert "response.function_call_arguments.done" in kinds(out)
    done = texts(out)[-1]
    assert done["type"] == "response.done"
    assert done["response"]["output"][0]["status"] == "incomplete"


def test_the_users_turn_is_an_item_committed_at_the_end_of_speech_then_transcribed():
    codec = spoken_codec()
    started = texts(codec.encode(InputSpeechStarted(offset_ms=320), b""))
    stopped = texts(codec.encode(InputSpeechStopped(offset_ms=1820), b""))
    item_id = started[0]["item_id"]
    assert [e["type"] for e in stopped] == [
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
    ]
    assert all(e.get("item_id", item_id) == item_id for e in stopped)
    final = texts(codec.encode(InputTranscript(text="hello", final=True, message_id="m1"), b""))
    assert final[0]["type"] == "conversation.item.input_audio_transcription.completed"
    assert (final[0]["item_id"], final[0]["transcript"]) == (item_id, "hello")
    assert final[0]["usage"] == {"type": "duration", "seconds": 1.5}
    assert final[1]["item"]["content"] == [{"type": "input_audio", "transcript": "hello"}]
    # The client's response.create for that turn asks for the answer the core gives.
    messages, replies = codec.decode(json.dumps({"type": "response.create"}))
    assert (messages, replies) == ([], [])


def test_an_append_is_cut_into_pieces_at_the_sessions_rate():
    codec = spoken_codec()
    pcm = b"\x02\x00" * 24000  # 1 s at 24 kHz
    audio = base64.b64encode(pcm).decode()
    pieces, _ = codec.decode(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
    assert len(pieces) == 10
    assert b"".join(pieces) == pcm  # type: ignore[arg-type]


@pytest.mark.parametrize("law", ["pcmu", "pcma"])
def test_g711_round_trips_within_its_quantization(law: g711.Law):
    tone = array("h", (int(12000 * math.sin(i / 4)) for i in range(800))).tobytes()
    codes = g711.encode(law, tone)
    assert len(codes) == 800
    back = array("h", g711.decode(law, codes))
    worst = max(abs(a - b) / max(abs(a), 256) for a, b in zip(array("h", tone), back, strict=True))
    assert worst < 0.07
    # The codes of silence, as every G.711 implementation writes them.
    assert g711.encode(law, b"\0\0") == (b"\xff" if law == "pcmu" else b"\xd5")


def test_g711_converters_take_8_khz_to_the_sessions_rate_and_back():
    up = g711.converter("pcmu", 16000, inbound=True)
    tone = array("h", (int(8000 * math.sin(i / 3)) for i in range(8000))).tobytes()  # 1 s
    pcm = up.feed(g711.encode("pcmu", tone), last=True)
    assert abs(len(pcm) - 32000) <= 64  # 1 s at 16 kHz
    down = g711.converter("pcmu", 16000, inbound=False)
    assert abs(len(down.feed(pcm, last=True)) - 8000) <= 32


@pytest.mark.parametrize("inbound", [True, False])
def test_g711_conversion_gives_the_same_bytes_for_the_same_audio(inbound: bool) -> None:
    # soxr's own PCM16 dither is seeded from the clock: the same speech came out different
    # each run, and pocketsphinx heard different words in it (gateway/voice/resample.py).
    tone = array("h", (int(8000 * math.sin(i / 7)) for i in range(16000))).tobytes()
    audio = g711.encode("pcmu", tone) if inbound else tone
    frames = [audio[at : at + 640] for at in range(0, len(audio), 640)]

    def converted() -> bytes:
        stream = g711.converter("pcmu", 16000, inbound=inbound)
        return b"".join(stream.feed(f, last=i == len(frames) - 1) for i, f in enumerate(frames))

    assert converted() == converted() == converted()


def test_a_commit_makes_one_item_when_the_core_has_the_turn_and_none_when_it_refuses():
    codec = spoken_codec()
    (_commit,), replies = codec.decode(json.dumps({"type": "input_audio_buffer.commit"}))
    assert replies == []  # not before the core has the turn
    codec.encode(InputSpeechStarted(offset_ms=0), b"")
    stopped = kinds(codec.encode(InputSpeechStopped(offset_ms=900), b""))
    assert stopped.count("input_audio_buffer.committed") == 1
    final = kinds(codec.encode(InputTranscript(text="hi", final=True, message_id="m1"), b""))
    assert final.count("conversation.item.done") == 1
    # A commit with nothing to commit: the core's error, no item, and a response.create
    # after it is an error too (nothing to answer).
    (empty,), _ = codec.decode(json.dumps({"type": "input_audio_buffer.commit", "event_id": "c2"}))
    (error,) = texts(
        codec.encode(Error(code="invalid_audio", message="nothing", in_reply_to=empty.id), b"")
    )
    assert error["error"]["event_id"] == "c2"
    _, (refused,) = codec.decode(json.dumps({"type": "response.create"}))
    assert json.loads(refused)["type"] == "error"
