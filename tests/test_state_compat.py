"""A state saved by an earlier gateway restores and carries on in this one.

During a rolling deploy a session moves from a node running the old code to one running the
new: the new code must read the state the old one saved (``STATE_VERSION`` is unchanged)
and carry on from it. ``SAVED`` was written by the session core before it held its state as
one value (issue 30): a voice session mid-answer, with a settled client call, a pending
async server tool, a queued message and remembered message ids.
"""

from __future__ import annotations

import base64
import itertools

from gateway.core.event import CallModel, ModelOutput, ToolFinished
from gateway.core.model import ModelFinish, ModelText
from gateway.core.session import Session
from gateway.core.state import Phase, decode_state, encode_state
from gateway.core.transcript import AssistantTurn, UserTurn
from gateway.wire.v1 import (
    ResponseCreated,
    ResponseDone,
    TextDelta,
    TextDone,
    TextSegment,
    ToolStatus,
)
from tests.test_session import Harness

SAVED = base64.b64decode(
    "3gAYp3ZlcnNpb24BqnNlc3Npb25faWSmc2Vzc18xpXBoYXNlpG9wZW6pcHJpbmNpcGFsiaRuYW1lqWFub255bW91"
    "c6RraW5kqWFub255bW91c6hrZXlfbmFtZcCndXNlcl9pZMCmc2NvcGVzkKZjbGFpbXOAsGNsaWVudF9mdW5jdGlv"
    "bnPApWFnZW50wKZvcmlnaW7ArGluc3RydWN0aW9uc7FiZSBuaWNlCgpiZSBicmllZrBjbGllbnRfZnVuY3Rpb25z"
    "kYekbmFtZad2aWJyYXRlq2Rlc2NyaXB0aW9uqFZpYnJhdGUurGlucHV0X3NjaGVtYYKkdHlwZaZvYmplY3SqcHJv"
    "cGVydGllc4Ctb3V0cHV0X3NjaGVtYcCsZGlzcGxheV9uYW1lwKd0aW1lb3V0wKZ3aWRnZXTAqG1ldGFkYXRhgaNh"
    "cHCkZGVtb6NzZXEQp2hpc3RvcnmWgqR0eXBlpHVzZXKkdGV4dKdsYW1wIG9ug6R0eXBlqWFzc2lzdGFudKR0ZXh0"
    "plN1cmUuIKVjYWxsc5KDp2NhbGxfaWSmY2FsbF8zpG5hbWWkbGFtcKRhcmdzgaJvbsODp2NhbGxfaWSmY2FsbF80"
    "pG5hbWWldHJhY2ukYXJnc4CFpHR5cGWsdG9vbF9vdXRjb21lp2NhbGxfaWSmY2FsbF8zpG5hbWWkbGFtcKZvdXRw"
    "dXSBom9rw6VlcnJvcsCFpHR5cGWsdG9vbF9vdXRjb21lp2NhbGxfaWSmY2FsbF80pG5hbWWldHJhY2umb3V0cHV0"
    "gaZzdGF0dXOncGVuZGluZ6VlcnJvcsCDpHR5cGWpYXNzaXN0YW50pHRleHSlRG9uZS6lY2FsbHOQgqR0eXBlpHVz"
    "ZXKkdGV4dLBhbmQgdGhlIHdlYXRoZXI/q3R1cm5fc3RhcnRzkgAFpW5vdGVzkKVxdWV1ZZGHpHR5cGWsdXNlci5t"
    "ZXNzYWdlpHRleHSmdGhhbmtzq3Rvb2xfY2hvaWNlwKV0b29sc8CpbWF4X3N0ZXBzwKl0b29sX21vZGXAomlkom0z"
    "q21lc3NhZ2VfaWRzk6JtMaJtMqJtM6hyZXNwb25zZd4AEKtyZXNwb25zZV9pZKZyZXNwXzalc3RlcHMBp3N0ZXBf"
    "aWSmc3RlcF83pHRleHSSp0xldCBtZSCrc2VlLiBJdCBpcyCpcmVxdWVzdGVkkKVjYWxsc5CldXNhZ2WCrGlucHV0"
    "X3Rva2VucwCtb3V0cHV0X3Rva2VucwCrdW5jb25maXJtZWSgq3Rvb2xfY2hvaWNlpGF1dG+ldG9vbHPAqW1heF9z"
    "dGVwcwOpdG9vbF9tb2RlpGF1dG+pc2VnbWVudGVkDKhzZWdtZW50cwGldm9pY2XDq2luX3JlcGx5X3Rvom0ypWNh"
    "bGxzkt4AEqdjYWxsX2lkpmNhbGxfM6R0b29spGxhbXCsZGlzcGxheV9uYW1lpExhbXCka2luZKZjbGllbnSkYXJn"
    "c4CrcmVzcG9uc2VfaWSmcmVzcF8xqGRlYWRsaW5ly0CPkAAAAAAAqWV4ZWN1dGlvbqRzeW5jqGRlbGl2ZXJ5qXdo"
    "ZW5faWRsZaVzdGF0Zaljb21wbGV0ZWSqZGlzcGF0Y2hlZMOpZWxzZXdoZXJlwqZvdXRwdXTApWVycm9ywKRjb2Rl"
    "wKZtYW51YWzCqmNvbmZpcm1pbmfCpndpZGdldMDeABKnY2FsbF9pZKZjYWxsXzSkdG9vbKV0cmFja6xkaXNwbGF5"
    "X25hbWWlVHJhY2uka2luZKZzZXJ2ZXKkYXJnc4CrcmVzcG9uc2VfaWSmcmVzcF8xqGRlYWRsaW5ly0CQkAAAAAAA"
    "qWV4ZWN1dGlvbqVhc3luY6hkZWxpdmVyeal3aGVuX2lkbGWlc3RhdGWncGVuZGluZ6pkaXNwYXRjaGVkw6llbHNl"
    "d2hlcmXCpm91dHB1dMClZXJyb3LApGNvZGXApm1hbnVhbMKqY29uZmlybWluZ8Kmd2lkZ2V0wKt0b29sX2Nob2lj"
    "ZaRhdXRvqW1heF9zdGVwcwOpdG9vbF9tb2RlpGF1dG+pdGltZV96b25lrEV1cm9wZS9QYXJpc6ZlbmRpbmfApWFn"
    "ZW50pHRlc3SzY2xpZW50X2luc3RydWN0aW9uc6hiZSBicmllZq9sYXRlc3RfcmVzcG9uc2WmcmVzcF82qHNlZ21l"
    "bnRzww=="
)


def restored() -> Harness:
    h = Harness()
    counter = itertools.count(100)
    h.new_id = lambda prefix: f"{prefix}_{next(counter)}"
    h.session = Session.restore(h.settings, decode_state(SAVED), new_id=h.new_id)
    return h


def test_a_state_an_earlier_gateway_saved_reads_as_it_was_written():
    state = decode_state(SAVED)
    assert (state.phase, state.seq, state.message_ids) == (Phase.OPEN, 16, ["m1", "m2", "m3"])
    assert state.response is not None
    assert state.response.step_id == "step_7"
    h = restored()
    assert h.session.state() == decode_state(SAVED)
    assert decode_state(encode_state(h.session.state())) == decode_state(SAVED)
    assert (h.session.last_seq, h.session.metadata, h.session.time_zone) == (
        16,
        {"app": "demo"},
        "Europe/Paris",
    )


def test_a_state_an_earlier_gateway_saved_carries_on_where_it_stopped():
    h = restored()
    sent = h.feed(ModelOutput("step_7", ModelText("sunny.")))
    sent += h.feed(ModelOutput("step_7", ModelFinish()))
    assert [(type(m), m.seq) for m in sent] == [
        (TextDelta, 17),
        (TextSegment, 18),
        (TextDone, 19),
        (ResponseDone, 20),
        (ResponseCreated, 21),
    ]
    assert isinstance(sent[1], TextSegment)
    assert sent[1].text == "It is sunny."
    assert isinstance(sent[2], TextDone)
    assert sent[2].text == "Let me see. It is sunny."
    assert isinstance(sent[4], ResponseCreated)
    assert sent[4].in_reply_to == "m3"
    (step,) = [e for e in h.other if isinstance(e, CallModel)]
    assert step.request.instructions == "be nice\n\nbe brief"
    assert step.request.items[-2:] == (
        AssistantTurn(text="Let me see. It is sunny."),
        UserTurn(text="thanks"),
    )
    # The async call that was pending when the state was saved settles here.
    (status,) = h.feed(ToolFinished(call_id="call_4", output={"status": "shipped"}))
    assert isinstance(status, ToolStatus)
    assert (status.status, status.response_id) == ("completed", "resp_1")
