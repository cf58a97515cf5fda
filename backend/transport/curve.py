"""The ROUTER's CURVE gate: the server options, the ZAP handler that admits authorised public keys, and the
monitor that reports handshakes failing before ZAP is asked (plaintext peers, peers holding another server key).

Run by the io thread (its two sockets are used by that thread alone) between its other polls: libzmq holds a
peer's handshake until the ZAP reply, which this gives at once. Every refused handshake is counted and logged with
what libzmq tells: public key and IP for a ZAP refusal; only the reason for an earlier failure (the monitor does
not name the peer). A peer refused by ZAP is not retried by libzmq; a plaintext peer may retry every
RECONNECT_IVL (a race in libzmq decides), which is why logging is rate-limited.

The clients directory is read again every few seconds: a key dropped in is admitted at the refused frontend's
next retry. A key removed is refused at once on every connection: ZAP only runs at the handshake, so each
admitted peer's key is its ZAP user id, which libzmq attaches to every frame, and the io thread checks it per
frame (`admits`) and drops what a revoked key sends; that frontend's pings go unanswered and its /health turns
red. A directory that cannot be read, or holds a bad file, keeps the last good set and is logged.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import structlog
import zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from backend.startup.settings import reload_curve_clients
from common.config import SettingsError
from common.curve import KeyFile, PublicKeys
from common.sockets import make_socket

log = structlog.get_logger(__name__)

# RFC 27 fixes the endpoint: one ZAP handler per zmq.Context.
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"pocserve"
_FAILURE_REASONS: dict[int, str] = {
    zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH: "peer does not speak CURVE (a frontend without CURVE settings?)",
    zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC: "CURVE handshake failed (peer holds another server public key?)",
}
# Each refused key is logged once (up to this many keys), then only every 100th refusal: a flood of peers or
# keys must not flood the log.
_MAX_KEYS_LOGGED = 1000
RELOAD_INTERVAL_S = 5.0


class CurveGate:
    """Admits the peers whose public key is in `clients`; refuses, logs and counts every other one."""

    def __init__(self, keys: KeyFile, clients: PublicKeys, *, reload_interval_s: float = RELOAD_INTERVAL_S) -> None:
        assert keys.secret_key is not None, "the server needs its secret key"
        self._keys = keys
        self._clients = clients
        self._reload_interval_s = reload_interval_s
        self._reloaded_at = time.monotonic()
        self._reload_error: str | None = None
        self.num_curve_refusals = 0
        self._logged_keys: set[bytes] = set()
        self._zap: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None

    @property
    def num_client_keys(self) -> int:
        return len(self._clients.keys)

    def open(self, ctx: zmq.Context, router: zmq.Socket) -> list[zmq.Socket]:
        """Makes `router` a CURVE server behind this handler. Call before it binds; poll the sockets returned."""
        self._zap = make_socket(ctx, zmq.REP)
        self._zap.bind(ZAP_ENDPOINT)
        router.curve_server = True
        router.curve_secretkey = self._keys.secret_key
        router.curve_publickey = self._keys.public_key
        router.zap_domain = ZAP_DOMAIN
        # Fail closed: without a reachable ZAP handler a peer is refused, never waved through.
        router.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        self._monitor = router.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
        return [self._zap, self._monitor]

    def on_events(self, events: dict) -> None:
        if self._zap is not None and self._zap in events:
            self._on_zap_request(self._zap.recv_multipart())
        if self._monitor is not None and self._monitor in events:
            self._on_handshake_failed(recv_monitor_message(self._monitor))
        if time.monotonic() - self._reloaded_at >= self._reload_interval_s:
            self._reloaded_at = time.monotonic()
            self._reload()

    def _reload(self) -> None:
        try:
            clients = reload_curve_clients(self._clients)
        except SettingsError as e:
            if str(e) != self._reload_error:  # once per distinct problem, not every few seconds
                log.error("curve_clients_unreadable", error=str(e), num_client_keys_kept=self.num_client_keys)
            self._reload_error = str(e)
            return
        self._reload_error = None
        added, removed = clients.keys - self._clients.keys, self._clients.keys - clients.keys
        if added or removed:
            self._clients = clients
            self._logged_keys -= added
            log.info("curve_clients_reloaded", added=sorted(k.decode() for k in added),
                     removed=sorted(k.decode() for k in removed), num_client_keys=self.num_client_keys)

    def close(self) -> None:
        """After the router is closed: no handshake can wait on the handler any more."""
        for sock in (self._zap, self._monitor):
            if sock is not None:
                sock.close(linger=0)

    def _on_zap_request(self, frames: list[bytes]) -> None:
        # RFC 27: version, request id, domain, address, routing id, mechanism, then the credentials.
        if len(frames) != 7 or frames[0] != b"1.0" or frames[5] != b"CURVE" or len(frames[6]) != 32:
            # Only libzmq reaches this inproc endpoint, so this is a surprise: refuse rather than guess.
            log.error("zap_request_malformed", num_frames=len(frames))
            self._reply(frames[1] if len(frames) > 1 else b"", b"500", b"malformed ZAP request")
            return
        request_id, address, key = frames[1], frames[3].decode(errors="replace"), z85.encode(frames[6])
        if key in self._clients.keys:
            log.info("curve_peer_accepted", public_key=key.decode(), address=address)
            self._reply(request_id, b"200", b"OK", user_id=key)
            return
        self.num_curve_refusals += 1
        if self._is_logged(key):
            log.warning("curve_peer_refused", public_key=key.decode(), address=address,
                        reason=f"public key not in {self._clients.path}", num_refused=self.num_curve_refusals)
        self._reply(request_id, b"400", b"unknown public key")

    def _on_handshake_failed(self, event: Mapping[str, Any]) -> None:
        self.num_curve_refusals += 1
        if self._is_logged(None):
            value: int = event["value"]
            log.warning("curve_handshake_failed", reason=_FAILURE_REASONS.get(value, f"ZMTP error {value:#x}"),
                        endpoint=event["endpoint"].decode(errors="replace"),
                        num_refused=self.num_curve_refusals)

    def _is_logged(self, key: bytes | None) -> bool:
        if key is not None and key not in self._logged_keys and len(self._logged_keys) < _MAX_KEYS_LOGGED:
            self._logged_keys.add(key)
            return True
        n = self.num_curve_refusals
        return n <= 10 or n % 100 == 0

    def _reply(self, request_id: bytes, status: bytes, text: bytes, user_id: bytes = b"") -> None:
        # version, request id, status code, status text, user id, metadata
        assert self._zap is not None, "replies only answer requests read from the handler's socket"
        self._zap.send_multipart([b"1.0", request_id, status, text, user_id, b""])

    def admits(self, frame: zmq.Frame) -> bool:
        """Whether the key `frame` came with (its connection's ZAP user id) is still authorised."""
        key = str(frame.get("User-Id")).encode()
        if key in self._clients.keys:
            return True
        self.num_curve_refusals += 1
        if self._is_logged(key):
            log.warning("curve_peer_revoked", public_key=key.decode(), num_refused=self.num_curve_refusals,
                        reason=f"public key no longer in {self._clients.path}")
        return False
