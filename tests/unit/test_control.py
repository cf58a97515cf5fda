"""Unit tests for backend/transport/control.py's frontend registry: Hello registers, forget drops, a ping brings one
back."""

from __future__ import annotations

from backend.transport import control as control_module
from backend.transport.control import ControlPlane
from protocol.common import Fingerprint
from protocol.control import HelloRequest, PingRequest
from protocol.version import PROTOCOL_VERSION

A, B = b"fe-a", b"fe-b"


def _control() -> ControlPlane:
    c = ControlPlane("inst")
    c.fingerprint = Fingerprint(protocol_version=PROTOCOL_VERSION, served_model_name="tiny", model_path="/m",
                                max_model_len=2048, block_size=16, dtype="bfloat16", vllm_version="0.26.0",
                                engine_device="cpu", poc_code_version="poc-v2")
    return c


def _hello(c: ControlPlane, identity: bytes, name: str) -> None:
    assert c.on_hello(identity, HelloRequest(protocol_version=PROTOCOL_VERSION, frontend_id=name)) is not None


def _num_frontends(c: ControlPlane, identity: bytes) -> int:
    return c.on_ping(identity, PingRequest(ping_id=1), num_rejected_frames=0, outbox_depth=0).stats.link.num_frontends


def test_control_forget_drops_frontend_and_returns_its_id():
    c = _control()
    _hello(c, A, "fe-1")
    _hello(c, B, "fe-2")
    assert c.forget(A) == "fe-1"
    assert c.frontends == {B: "fe-2"}
    assert c.forget(b"probe") == ""  # a peer that never said Hello


def test_control_forgotten_frontend_counted_again_on_its_next_ping():
    c = _control()
    _hello(c, A, "fe-1")
    c.forget(A)
    assert _num_frontends(c, B) == 0  # another peer's ping does not bring A back
    assert _num_frontends(c, A) == 1
    assert c.frontends == {A: "fe-1"}


def test_control_ping_from_unknown_peer_does_not_register_it():
    c = _control()
    assert _num_frontends(c, b"probe") == 0 and c.frontends == {}


def test_control_hello_after_forget_registers_once():
    c = _control()
    _hello(c, A, "fe-1")
    c.forget(A)
    _hello(c, A, "fe-1b")
    c.forget(B)
    assert _num_frontends(c, A) == 1 and c.frontends == {A: "fe-1b"}


def test_control_remembers_a_bounded_number_of_lost_frontends():
    c = _control()
    n = control_module._MAX_REMEMBERED_LOST
    for i in range(n + 10):
        _hello(c, b"fe-%d" % i, f"name-{i}")
        c.forget(b"fe-%d" % i)
    assert len(c._lost) == n
    assert _num_frontends(c, b"fe-0") == 0  # the oldest were dropped: it counts again after a Hello
    assert _num_frontends(c, b"fe-%d" % (n + 9)) == 1
