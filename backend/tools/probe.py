"""Operator's probe: talks to a backend socket like a frontend and prints what it sees.

    python -m backend.tools.probe --address ipc:///tmp/pocserve/backend.ipc           # one report
    python -m backend.tools.probe --watch --interval-s 2                                # refresh
    python -m backend.tools.probe --once --timeout-s 3                                  # healthcheck: exit 0/1

Against a CURVE backend give it a key pair the backend authorises, with the frontend's flags or variables
(--curve-client-secret-key-file, --curve-server-public-key-file).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec
import zmq

from backend.startup.settings import DEFAULT_ADDRESS
from common.config import SettingsError, load, option, setting
from common.curve import KeyFile, check_client_keys, client_key_setting, server_key_setting, set_client_keys
from common.process import refuse
from common.sockets import make_socket
from protocol.codec import frontend_codec
from protocol.common import BackendStats, Fingerprint
from protocol.control import HelloRequest, PingRequest, PongReply, ReadyReply
from protocol.version import PROTOCOL_VERSION


@dataclass(frozen=True)
class ProbeSettings:
    address: str = setting("POCSERVE_BACKEND_ADDRESS", DEFAULT_ADDRESS, "ZMQ address of the backend")
    # The frontend's CURVE settings (same flags and variables): the probe connects like a frontend.
    curve_client_secret_key_file: KeyFile | None = client_key_setting()
    curve_server_public_key_file: KeyFile | None = server_key_setting()
    timeout_s: float = setting("POCSERVE_PROBE_TIMEOUT_S", 2.0, "how long to wait for each answer")
    watch: bool = setting("POCSERVE_PROBE_WATCH", False, "refresh until interrupted")
    interval_s: float = setting("POCSERVE_PROBE_INTERVAL_S", 2.0, "refresh period with --watch")
    once: bool = setting("POCSERVE_PROBE_ONCE", False, "healthcheck: print one line, exit 0 if ready")


def load_settings(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> ProbeSettings:
    s = load(ProbeSettings, "pocserve-probe", __doc__.splitlines()[0], argv, environ)
    check_client_keys(s.curve_client_secret_key_file, s.curve_server_public_key_file, s.address,
                      option(ProbeSettings, "address").names)
    if s.timeout_s <= 0 or s.interval_s <= 0:
        raise SettingsError("--timeout-s and --interval-s must be positive")
    return s


class Probe:
    def __init__(self, address: str, timeout_s: float, curve: tuple[KeyFile, KeyFile] | None = None) -> None:
        self.codec = frontend_codec()
        self.sock = make_socket(zmq.Context.instance(), zmq.DEALER)
        if curve is not None:
            set_client_keys(self.sock, *curve)
        self.sock.connect(address)
        self.timeout_ms = int(timeout_s * 1000)
        self.next_id = 1

    def _await(self, kind: type, match=lambda m: True):
        deadline = time.monotonic() + self.timeout_ms / 1000
        while (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(left * 1000) + 1):
                break
            try:
                msg = self.codec.decode(self.sock.recv())
            except msgspec.DecodeError:
                continue
            if isinstance(msg, kind) and match(msg):
                return msg
        return None

    def ping(self) -> tuple[BackendStats | None, float]:
        ping_id, self.next_id = self.next_id, self.next_id + 1
        started = time.perf_counter()
        self.sock.send(self.codec.encode(PingRequest(ping_id=ping_id)))
        pong = self._await(PongReply, lambda m: m.ping_id == ping_id)
        return (pong.stats if pong else None), time.perf_counter() - started

    def hello(self) -> ReadyReply | None:
        self.sock.send(self.codec.encode(HelloRequest(protocol_version=PROTOCOL_VERSION,
                                                      frontend_id=f"probe-{os.getpid()}")))
        return self._await(ReadyReply)


def render(address: str, stats: BackendStats | None, rtt_s: float, ready: ReadyReply | None) -> str:
    if stats is None:
        return f"{address}: no answer within the timeout"
    link = stats.link
    lines = [f"backend {address}  instance {link.instance_id[:12]}  rtt {rtt_s * 1000:.2f} ms  "
             f"uptime {link.uptime_s:.0f} s  engine {'ready' if link.is_engine_ready else 'loading'}  "
             f"heartbeat age {link.engine_heartbeat_age_s:.2f} s"]
    if ready is not None and ready.refusal:
        lines.append(f"  handshake REFUSED: {ready.refusal}")
    elif ready is not None and ready.fingerprint is not None:
        fp: Fingerprint = ready.fingerprint
        lines.append(f"  model {fp.served_model_name} ({fp.model_path})  vllm {fp.vllm_version} on "
                     f"{fp.engine_device}  dtype {fp.dtype}  max_model_len {fp.max_model_len}  "
                     f"block {fp.block_size}  protocol {fp.protocol_version}  poc {fp.poc_code_version}  "
                     f"mode {fp.scheduling_mode}")
    if (engine := stats.engine) is not None:
        lines.append(f"  requests running {engine.num_running}  waiting {engine.num_waiting}  "
                     f"aborted {engine.num_aborted_requests}  kv {engine.kv_cache_usage * 100:.1f}%  "
                     f"engine steps {engine.num_engine_steps}  inbox {engine.inbox_depth}")
    if (chat := stats.chat) is not None:
        lines.append(f"  chat finished {chat.num_finished_requests}  prompt tokens {chat.num_prompt_tokens}  "
                     f"generated {chat.num_generation_tokens}")
    if (poc := stats.poc) is not None:
        lines.append(f"  poc {'mining' if poc.is_mining else 'idle'}  nonces {poc.num_nonces}  "
                     f"validations {poc.num_validations}  queued job nonces {poc.num_queued_job_nonces}")
    lines.append(f"  frontends {link.num_frontends}  outbox {link.outbox_depth}  "
                 f"rejected frames {link.num_rejected_frames}  curve refusals {link.num_curve_refusals}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    try:
        args = load_settings(argv)
    except SettingsError as e:
        sys.exit(refuse("pocserve-probe", e))
    keys, server_key = args.curve_client_secret_key_file, args.curve_server_public_key_file
    probe = Probe(args.address, args.timeout_s, (keys, server_key) if keys is not None and server_key else None)
    if args.once:
        stats, rtt = probe.ping()
        ok = stats is not None and stats.link.is_engine_ready
        print("ready" if ok else ("loading" if stats else "unreachable"), f"rtt_ms={rtt * 1000:.2f}")
        sys.exit(0 if ok else 1)
    while True:
        stats, rtt = probe.ping()
        ready = probe.hello() if stats is not None and stats.link.is_engine_ready else None
        if args.watch:
            print("\033[2J\033[H", end="")
        print(render(args.address, stats, rtt, ready), flush=True)
        if not args.watch:
            sys.exit(0 if stats is not None else 1)
        time.sleep(args.interval_s)


if __name__ == "__main__":
    main()
