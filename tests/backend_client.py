"""A synchronous raw ZMQ client for tests: talks to a backend socket like a frontend would."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import zmq

from protocol.codec import frontend_codec
from protocol.poc import PocArtifactsReply, PocArtifactsRequest


class RawBackend:
    def __init__(self, address: str) -> None:
        self.codec = frontend_codec()
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self._ids = itertools.count(1)
        self._pending: dict[str, object] = {}

    def close(self) -> None:
        self.sock.close(0)

    def send(self, msg) -> None:
        self.sock.send(self.codec.encode(msg))

    def wait_for(self, rid: str, timeout_s: float = 120.0, watch: Callable[[], None] | None = None):
        """The reply to `rid`; `watch` is called every second meanwhile and raises to give up early (a backend
        that died or stopped making progress: Proc.check)."""
        deadline = time.monotonic() + timeout_s
        while rid not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no reply for {rid}")
            if not self.sock.poll(int(min(left, 1.0) * 1000) + 1):
                if watch is not None:
                    watch()
                continue
            msg = self.codec.decode(self.sock.recv())
            if hasattr(msg, "rid"):
                self._pending[msg.rid] = msg
        return self._pending.pop(rid)

    def submit_artifacts(self, nonces, seq_len: int = 64, block_hash: str = "TEST_BLOCK",
                         public_key: str = "test_pub_keys", k_dim: int = 12, stronger_rng: bool = False) -> str:
        rid = f"poc-{next(self._ids)}"
        self.send(PocArtifactsRequest(rid=rid, block_hash=block_hash, public_key=public_key, nonces=list(nonces),
                                      seq_len=seq_len, k_dim=k_dim, stronger_rng=stronger_rng))
        return rid

    def artifacts(self, nonces, **kw) -> PocArtifactsReply:
        return self.wait_for(self.submit_artifacts(nonces, **kw))
