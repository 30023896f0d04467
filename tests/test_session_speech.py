"""Voice turns in the pure session core (gateway/core/speech.py): the audio settings, a final
transcript as the user's message, the answer's segments spoken, and barge-in. No sockets, no
engines: the events the shell's voice pipeline would feed (every test runs live and with the
session persisted and restored after every event, as in tests/test_session.py)."""

from __future__ import annotations

from gateway.core.audio import AudioRequest, SpokenAudio, heard_chars, word_end
from gateway.core.event import (
    ClearAudio,
    CommitAudio,
    EndSpeech,
    Listen,
    SegmentSpoken,
    Speak,
    SpeechDone,
    SpeechStarted,
    StopSpeaking,
    Transcribed,
)
from gateway.core.model import ModelFinish, ModelText, ModelToolCall
from gateway.core.transcript import AssistantTurn, ToolOutcome, UserTurn
from gateway.wire.v1 import (
    AudioDone,
    AudioFlush,
    Error,
    InputAudioClear,
    InputAudioCleared,
    InputAudioCommit,
    InputTranscript,
    ResponseCreated,
    ResponseDone,
    ResponseTruncate,
    ResponseTruncated,
    SessionUpdate,
    SessionUpdated,
    TextSegment,
    ToolResult,
    ToolResults,
    UserMessage,
)
from tests.test_session import Harness, persisted  # noqa: F401

VOICES = ("joe", "amy")


def voiced() -> Harness:
    """A started session with its audio on."""
    h = Harness(voices=VOICES)
    created = h.start(audio=AudioRequest())
    assert created.audio is not None
    return h


def spoken_turn(h: Harness, text: str = "what's up") -> str:
    """The user says ``text``; the id of the response that answers it."""
    h.feed(Transcribed(text, final=True))
    return [m for m in h.sent if isinstance(m, ResponseCreated)][-1].response_id


# ----------------------------------------------------------------- settings


def test_audio_settings_are_applied_whole_and_told_to_the_pipeline():
    h = Harness(voices=VOICES)
    created = h.start(audio=AudioRequest(input_rate=24000))
    assert created.voices == ["joe", "amy"]
    assert created.audio is not None
    assert (created.audio.input_rate, created.audio.output_rate, created.audio.voice) == (
        24000,
        24000,
        "joe",
    )
    assert h.other[-1] == Listen(created.audio)
    (updated,) = h.feed(SessionUpdate(id="u1", audio=AudioRequest(voice="amy", silence_ms=800)))
    assert isinstance(updated, SessionUpdated)
    assert updated.audio is not None
    assert (updated.audio.voice, updated.audio.silence_ms, updated.audio.input_rate) == (
        "amy",
        800,
        24000,  # kept
    )
    (off,) = h.feed(SessionUpdate(id="u2", audio=False))
    assert isinstance(off, SessionUpdated)
    assert off.audio is None
    assert h.other[-1] == Listen(None)


def test_a_voice_the_gateway_lacks_or_no_engines_at_all_are_refused_and_nothing_changes():
    h = Harness(voices=VOICES)
    h.start()
    (error,) = h.feed(SessionUpdate(id="u1", audio=AudioRequest(voice="zed"), max_steps=2))
    assert isinstance(error, Error)
    assert (error.code, error.in_reply_to) == ("invalid_message", "u1")
    assert "joe, amy" in error.message
    assert not [e for e in h.other if isinstance(e, Listen)]
    bare = Harness()
    bare.start()
    (unavailable,) = bare.feed(SessionUpdate(id="u3", audio=AudioRequest()))
    assert isinstance(unavailable, Error)
    assert unavailable.code == "audio_unavailable"


def test_commit_and_clear_need_audio_on():
    h = Harness(voices=VOICES)
    h.start()
    for msg in (InputAudioCommit(id="c"), InputAudioClear(id="x")):
        (error,) = h.feed(msg)
        assert isinstance(error, Error)
        assert (error.code, error.in_reply_to) == ("invalid_audio", msg.id)
    h = voiced()
    assert h.feed(InputAudioCommit(id="c")) == []
    assert isinstance(h.other[-1], CommitAudio)
    (cleared,) = h.feed(InputAudioClear(id="x"))
    assert isinstance(cleared, InputAudioCleared)
    assert cleared.in_reply_to == "x"
    assert isinstance(h.other[-1], ClearAudio)


# ----------------------------------------------------------------- the user's turn


def test_a_final_transcript_is_the_users_message_and_a_blank_one_nothing():
    h = voiced()
    (partial,) = h.feed(Transcribed("what's", final=False))
    assert isinstance(partial, InputTranscript)
    assert (partial.text, partial.final, partial.message_id) == ("what's", False, None)
    final, created = h.feed(Transcribed(" what's my battery level ", final=True))[:2]
    assert isinstance(final, InputTranscript)
    assert isinstance(created, ResponseCreated)
    assert final.text == "what's my battery level"
    assert final.message_id is not None
    assert created.in_reply_to == final.message_id
    assert h.last_model_call().request.items[-1] == UserTurn(text="what's my battery level")
    h.model(ModelText("Fine."), ModelFinish())
    (nothing,) = h.feed(Transcribed("  ", final=True))
    assert isinstance(nothing, InputTranscript)
    assert nothing.message_id is None
    assert not any(isinstance(m, ResponseCreated) for m in h.sent[-1:])


# ----------------------------------------------------------------- the answer's audio


def test_each_segment_is_spoken_with_its_seq_and_audio_done_follows_the_last():
    h = voiced()
    response_id = spoken_turn(h)
    h.model(ModelText("Your battery is at 82%. "), ModelText("It is charging."), ModelFinish())
    segments = [m for m in h.sent if isinstance(m, TextSegment)]
    speaks = [e for e in h.other if isinstance(e, Speak)]
    assert [(s.seq, s.text) for s in speaks] == [(m.seq, m.text) for m in segments]
    assert len(speaks) == 2
    assert isinstance(h.other[-1], EndSpeech)
    assert any(isinstance(m, ResponseDone) for m in h.sent)
    h.feed(SegmentSpoken(response_id, len(speaks[0].text), 1500))
    h.feed(SegmentSpoken(response_id, len(speaks[1].text), 900))
    (done,) = h.feed(SpeechDone(response_id, audio_ms=2400))
    assert isinstance(done, AudioDone)
    assert (done.response_id, done.audio_ms, done.status) == (response_id, 2400, "completed")


def test_truncate_by_audio_keeps_the_words_that_played():
    h = voiced()
    response_id = spoken_turn(h)
    first, second = "Your battery is at 82 percent. ", "It is charging now."
    h.model(ModelText(first + second), ModelFinish())
    h.feed(SegmentSpoken(response_id, len(first), 2000))
    h.feed(SegmentSpoken(response_id, len(second), 1000))
    h.feed(SpeechDone(response_id, audio_ms=3000))
    # Half of the second segment's audio: "It is charg" would be half; a whole word is kept.
    (truncated,) = h.feed(ResponseTruncate(id="t", response_id=response_id, audio_end_ms=2500))
    assert isinstance(truncated, ResponseTruncated)
    assert (first + second)[: truncated.heard_chars] == first + "It is"
    h.feed(Transcribed("and tomorrow", final=True))
    assert h.last_model_call().request.items[1] == AssistantTurn(text=first + "It is")


def test_truncate_wants_one_measure_and_a_spoken_response():
    h = voiced()
    response_id = spoken_turn(h)
    h.model(ModelText("Hi there."), ModelFinish())
    for msg in (
        ResponseTruncate(id="a", response_id=response_id),
        ResponseTruncate(id="b", response_id=response_id, heard_chars=2, audio_end_ms=5),
    ):
        (error,) = h.feed(msg)
        assert isinstance(error, Error)
        assert error.code == "invalid_message"
    plain = Harness()
    plain.start()
    plain.feed(UserMessage(text="hi"))
    rid = [m for m in plain.sent if isinstance(m, ResponseCreated)][-1].response_id
    plain.model(ModelText("Hello."), ModelFinish())
    (error,) = plain.feed(ResponseTruncate(id="c", response_id=rid, audio_end_ms=100))
    assert isinstance(error, Error)
    assert "not spoken" in error.message


# ----------------------------------------------------------------- barge-in


def test_barge_in_stops_the_answer_and_never_runs_a_settled_call_again():
    h = voiced()
    response_id = spoken_turn(h, "turn on the lamp and tell me a story")
    h.model(ModelToolCall(name="lamp", args={"on": True}), ModelFinish())
    call = h.session.state().calls[-1]
    h.feed(
        ToolResults(results=[ToolResult(call_id=call.call_id, tool="lamp", output={"ok": True})])
    )
    story = "Once upon a time there was a lamp. It shone all night long. "
    h.model(ModelText(story))  # the step still streams
    h.feed(SegmentSpoken(response_id, len("Once upon a time there was a lamp. "), 2000))
    before = len(h.other)
    sent = h.feed(SpeechStarted(4000, interrupting=True, played_ms=1000))
    kinds = [type(m) for m in sent]
    assert AudioFlush in kinds
    assert kinds.index(AudioFlush) < kinds.index(ResponseDone)
    done = next(m for m in sent if isinstance(m, ResponseDone))
    assert done.status == "cancelled"
    assert StopSpeaking(response_id) in h.other[before:]
    assert not any(type(e).__name__ == "RunTool" for e in h.other[before:])
    assert h.session.call(call.call_id) is not None
    assert h.session.call(call.call_id).state.value == "completed"  # type: ignore[union-attr]
    # The next turn: the call's outcome once, the story cut to what played (1 s of 2 s).
    h.feed(Transcribed("stop", final=True))
    items = h.last_model_call().request.items
    assert sum(isinstance(i, ToolOutcome) for i in items) == 1
    told = [i for i in items if isinstance(i, AssistantTurn) and i.text]
    assert told[-1].text == "Once upon a time"


def test_speech_that_is_not_over_an_answer_stops_nothing():
    h = voiced()
    spoken_turn(h)
    h.model(ModelText("Done."), ModelFinish())
    sent = h.feed(SpeechStarted(9000))
    assert [type(m).__name__ for m in sent] == ["InputSpeechStarted"]


# ----------------------------------------------------------------- the arithmetic


def test_heard_chars_shares_each_segment_by_its_audio_and_word_end_keeps_whole_words():
    spoken = SpokenAudio(response_id="r")
    spoken.add(10, 1000)
    spoken.add(20, 1000)
    assert [heard_chars(spoken, ms) for ms in (0, 500, 1000, 1500, 2000, 9000)] == [
        0,
        5,
        10,
        20,
        30,
        30,
    ]
    text = "Hello there world"
    assert [word_end(text, n) for n in (0, 3, 5, 6, 8, 11, 17, 99)] == [0, 0, 5, 5, 5, 11, 17, 17]
