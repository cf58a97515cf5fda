"""Multi-host: the backend and two frontends in separate network namespaces, over TCP; the link is cut and
restored, and every process must notice and recover by itself.

Topology (made by the `net` fixture, removed afterwards even on failure):

    root ns: bridge <subnet>.1 (the test process talks HTTP to the frontends through it)
      ├─ veth ── ns "-be"  <subnet>.2   backend  (ROUTER on tcp://<subnet>.2:5600)
      ├─ veth ── ns "-fe1" <subnet>.3   frontend (HTTP on <subnet>.3:8000)
      └─ veth ── ns "-fe2" <subnet>.4   frontend (HTTP on <subnet>.4:8000)

The cut disables the backend's bridge port: every frame to or from the backend is dropped in the middle of
the network while both ends keep their link up. Packets vanish, nobody gets a RST or an ICMP error, and the
kernels keep the TCP connections open and retransmitting: what a dead switch or a partition looks like.
Needs root (ip netns, veth, bridge); skipped with the reason where that is not allowed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from bench.prom import totals
from tests.stack import REPO, Proc, backend_args, frontend_args

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="network namespaces are Linux-only")]

BACKEND_PORT = 5600
HTTP_PORT = 8000
# The frontends' liveness settings, passed explicitly so that the bounds below follow from them.
PING_INTERVAL_S = 0.5
BACKEND_TIMEOUT_S = 1.5
BACKEND_WAIT_S = 1.0
BREAKER_MISSES = 3
RECONNECT_IVL_MAX_S = 1.0  # the frontend's zmq.RECONNECT_IVL_MAX
# Slack for 2 shared cores running engine steps beside two frontends.
SLACK_S = 3.0
# A ping goes unanswered for backend_timeout_s after at most one interval.
DETECT_BOUND_S = PING_INTERVAL_S + BACKEND_TIMEOUT_S + SLACK_S
# A connect attempt into the void times out, the next one starts within the reconnect interval, then one ping.
RECOVER_BOUND_S = BACKEND_TIMEOUT_S + RECONNECT_IVL_MAX_S + PING_INTERVAL_S + SLACK_S
# The long outage: the breakers open, and TCP backs its retransmissions off to tens of seconds (left to the
# kernel, the first retransmission after the link returns came ~20 s later: the regression this guards).
LONG_CUT_S = 30.0

SHORT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
# ~27 s of generation on the dev machines (150 tokens/s): still running when the short cut ends.
LONG = {"model": "tiny", "messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 4000,
        "ignore_eos": True}


# --- network namespaces ---

def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], check=False, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def _bridge(*args: str) -> None:
    r = subprocess.run(["bridge", *args], check=False, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"bridge {' '.join(args)}: {r.stderr.strip()}")


def _free_subnet() -> str:
    """A 10.231.X /24 that no route in the root namespace uses (several runs may share one machine)."""
    routes = subprocess.run(["ip", "-4", "route", "show"], check=True, capture_output=True, text=True,
                            timeout=30).stdout
    start = os.getpid() % 200
    for i in range(200):
        prefix = f"10.231.{(start + i) % 200 + 20}"
        if f"{prefix}." not in routes:
            return prefix
    raise RuntimeError(f"no free 10.231.X.0/24 subnet:\n{routes}")


@dataclass
class Net:
    tag: str
    bridge: str
    host_ip: str
    # role ("be", "fe1", "fe2") → namespace name, address inside it, root-side veth on the bridge
    ns: dict[str, str] = field(default_factory=dict)
    ips: dict[str, str] = field(default_factory=dict)
    ports: dict[str, str] = field(default_factory=dict)

    def cut(self, role: str) -> None:
        """Drops every frame to and from `role` at the bridge; links stay up, no RST, no ICMP."""
        _bridge("link", "set", "dev", self.ports[role], "state", "0")

    def restore(self, role: str) -> None:
        _bridge("link", "set", "dev", self.ports[role], "state", "3")


def _remove_stale(pid: int) -> None:
    """Removes what a killed earlier run left behind (its pid is gone, or reused by this run)."""
    listing = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True, timeout=30)
    for name in {line.split()[0] for line in listing.stdout.splitlines() if line.startswith("pocserve-")}:
        owner = name.split("-")[1]
        if owner.isdigit() and (int(owner) == pid or not Path(f"/proc/{owner}").exists()):
            for link in (f"psbr{owner}", *(f"ps{owner}{role}" for role in ("be", "fe1", "fe2"))):
                subprocess.run(["ip", "link", "del", link], check=False, capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True, timeout=30)


def _is_permission_error(message: str) -> bool:
    return any(s in message for s in ("Operation not permitted", "Permission denied", "must be root"))


@pytest.fixture
def net() -> Iterator[Net]:
    if shutil.which("ip") is None or shutil.which("bridge") is None:
        pytest.skip("iproute2 (ip, bridge) is not installed")
    pid = os.getpid()
    _remove_stale(pid)
    prefix = _free_subnet()
    n = Net(tag=f"pocserve-{pid}", bridge=f"psbr{pid}", host_ip=f"{prefix}.1")
    made_ns: list[str] = []
    made_links: list[str] = []
    try:
        try:
            _ip("netns", "add", f"{n.tag}-be")
        except RuntimeError as e:
            if _is_permission_error(str(e)):
                pytest.skip(f"cannot create network namespaces here: {e}")
            raise
        made_ns.append(f"{n.tag}-be")
        _ip("link", "add", n.bridge, "type", "bridge")
        made_links.append(n.bridge)
        _ip("addr", "add", f"{n.host_ip}/24", "dev", n.bridge)
        _ip("link", "set", n.bridge, "up")
        for host, role in enumerate(("be", "fe1", "fe2"), start=2):
            ns, port, ip = f"{n.tag}-{role}", f"ps{pid}{role}", f"{prefix}.{host}"
            if ns not in made_ns:
                _ip("netns", "add", ns)
                made_ns.append(ns)
            # The peer is created directly inside the namespace, so its name only has to be unique there.
            _ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            made_links.append(port)
            _ip("link", "set", port, "master", n.bridge)
            _ip("link", "set", port, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            n.ns[role], n.ips[role], n.ports[role] = ns, ip, port
        yield n
    finally:
        # Processes are stopped by the test's own finally, before this runs; a namespace outlives its
        # `ip netns del` while a process still lives in it.
        errors = []
        for link in made_links:
            try:
                _ip("link", "del", link)
            except RuntimeError as e:
                errors.append(str(e))
        for ns in made_ns:
            try:
                _ip("netns", "del", ns)
            except RuntimeError as e:
                errors.append(str(e))
        assert not errors, f"network teardown failed: {errors}"


class NsProc(Proc):
    """A Proc started inside a network namespace. `ip netns exec` execs the command in place (no fork), so
    the pid is Python's own and Proc.kill/stop's killpg reaches it."""

    def __init__(self, ns: str, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        super().__init__(args, log_path, env)
        self.ns = ns

    def start(self) -> NsProc:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(["ip", "netns", "exec", self.ns, sys.executable, *self.args], cwd=REPO,
                                         env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        return self


# --- helpers with bounded waits ---

def _tails(procs: dict[str, Proc]) -> str:
    return "\n".join(f"--- {name} log tail ---\n{p.tail(30)}" for name, p in procs.items())


def _check_alive(procs: dict[str, Proc]) -> None:
    for name, p in procs.items():
        assert p.proc is not None and p.proc.poll() is None, \
            f"{name} exited {p.proc.returncode if p.proc else None}\n{_tails(procs)}"


def _wait_until(what: str, predicate: Callable[[], bool], timeout_s: float, procs: dict[str, Proc],
                poll_s: float = 0.05) -> float:
    """Seconds until `predicate` held; fails with the log tails after `timeout_s`."""
    started = time.monotonic()
    while not predicate():
        _check_alive(procs)
        assert time.monotonic() - started < timeout_s, f"{what}: not within {timeout_s:.1f} s\n{_tails(procs)}"
        time.sleep(poll_s)
    return time.monotonic() - started


def _wait_each(what: str, predicates: dict[str, Callable[[], bool]], timeout_s: float,
               procs: dict[str, Proc]) -> dict[str, float]:
    """Seconds until each predicate first held, all polled together; fails with the log tails."""
    started, took = time.monotonic(), {}
    while len(took) < len(predicates):
        for name, predicate in predicates.items():
            if name not in took and predicate():
                took[name] = time.monotonic() - started
        _check_alive(procs)
        missing = sorted(set(predicates) - set(took))
        assert time.monotonic() - started < timeout_s, \
            f"{what}: not within {timeout_s:.1f} s for {missing}\n{_tails(procs)}"
        time.sleep(0.05)
    return took


def _health(http: httpx.Client, url: str) -> int:
    try:
        return http.get(f"{url}/health", timeout=1.0).status_code
    except httpx.HTTPError:
        return -1


def _metric(http: httpx.Client, url: str, name: str) -> float | None:
    return totals(http.get(f"{url}/metrics", timeout=5).text).get(name)


def _assert_clean_503(r: httpx.Response, elapsed_s: float, bound_s: float, procs: dict[str, Proc]) -> None:
    assert r.status_code == 503, f"expected 503, got {r.status_code}: {r.text}\n{_tails(procs)}"
    error = r.json()["error"]
    assert error["code"] == 503 and error["type"] == "ServiceUnavailableError", r.text
    assert error["message"].startswith("backend unavailable"), r.text
    assert elapsed_s < bound_s, f"503 took {elapsed_s:.2f} s (bound {bound_s:.1f} s)\n{_tails(procs)}"


class Background:
    """One HTTP request on a thread, so the test can cut the link while it runs."""

    def __init__(self, http: httpx.Client, url: str, body: dict, timeout_s: float) -> None:
        self.response: httpx.Response | None = None
        self.error: BaseException | None = None
        self.started_at = time.monotonic()
        self.ended_at: float | None = None

        def run() -> None:
            try:
                self.response = http.post(f"{url}/v1/chat/completions", json=body, timeout=timeout_s)
            except Exception as e:  # reported by the test through self.error
                self.error = e
            self.ended_at = time.monotonic()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()


# --- the phases ---

@dataclass
class Cluster:
    net: Net
    procs: dict[str, Proc]
    urls: dict[str, str]
    http: httpx.Client
    be_address: str

    def chat_ok(self, what: str) -> None:
        for role, url in self.urls.items():
            r = self.http.post(f"{url}/v1/chat/completions", json=SHORT, timeout=60)
            assert r.status_code == 200, f"{role} {what}: {r.status_code} {r.text}\n{_tails(self.procs)}"

    def chat_503(self, bound_s: float) -> None:
        for url in self.urls.values():
            started = time.monotonic()
            r = self.http.post(f"{url}/v1/chat/completions", json=SHORT, timeout=30)
            _assert_clean_503(r, time.monotonic() - started, bound_s, self.procs)

    def cut(self) -> tuple[float, dict[str, float]]:
        """Cuts the backend off; returns when every frontend's /health went red, with the seconds it took."""
        self.net.cut("be")
        cut_at = time.monotonic()
        return cut_at, _wait_each("/health non-200 after the cut", self._health_is(lambda code: code != 200),
                                  DETECT_BOUND_S, self.procs)

    def restore(self) -> tuple[float, dict[str, float]]:
        """Brings the link back; returns when every frontend's /health is green again, with the seconds."""
        self.net.restore("be")
        restored_at = time.monotonic()
        return restored_at, _wait_each("/health 200 after the link came back",
                                       self._health_is(lambda code: code == 200), RECOVER_BOUND_S, self.procs)

    def _health_is(self, ok: Callable[[int], bool]) -> dict[str, Callable[[], bool]]:
        return {role: (lambda u=url: ok(_health(self.http, u))) for role, url in self.urls.items()}

    def engine(self, name: str) -> float | None:
        return _metric(self.http, self.urls["fe1"], name)

    def probe_backend_inside(self) -> str:
        """The backend answers in its own namespace while the network is cut (the operator's probe)."""
        r = subprocess.run(["ip", "netns", "exec", self.net.ns["be"], sys.executable, "-m", "backend.tools.probe",
                            "--address", self.be_address, "--once", "--timeout-s", "5"],
                           check=False, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"probe in the backend's namespace: {r.stdout}{r.stderr}\n{_tails(self.procs)}"
        return r.stdout.strip()


def _fmt(times: dict[str, float]) -> str:
    return ", ".join(f"{role} {s:.2f} s" for role, s in times.items())


def _blip_with_request_in_flight(c: Cluster) -> None:
    """A short cut while fe1 waits for a long request: it ends in a clean 503, and once the link is back the
    backend is told to abort it instead of generating thousands of tokens for nobody."""
    aborted_before = c.engine("pocserve_backend_aborted_requests_total")
    inflight = Background(c.http, c.urls["fe1"], LONG, timeout_s=120)
    _wait_until("long request running in the engine",
                lambda: (c.engine("vllm:num_requests_running") or 0) >= 1, 30, c.procs)
    cut_at, detect_s = c.cut()
    inflight.thread.join(DETECT_BOUND_S + SLACK_S)
    assert not inflight.thread.is_alive(), f"in-flight request still hanging after the cut\n{_tails(c.procs)}"
    assert inflight.error is None, f"in-flight request: {inflight.error!r}"
    inflight_s = inflight.ended_at - cut_at
    _assert_clean_503(inflight.response, inflight_s, DETECT_BOUND_S + SLACK_S, c.procs)
    c.chat_503(BACKEND_WAIT_S + SLACK_S)
    restored_at, recover_s = c.restore()
    _wait_until("engine idle after the link came back", lambda: all(
        _metric(c.http, u, "vllm:num_requests_running") == 0.0 for u in c.urls.values()),
        RECOVER_BOUND_S + SLACK_S, c.procs, 0.1)
    idle_s = time.monotonic() - restored_at
    aborted = c.engine("pocserve_backend_aborted_requests_total")
    assert aborted == aborted_before + 1, (
        f"the orphaned request was not aborted (aborted {aborted_before} -> {aborted}); it finished by itself "
        f"only if this machine generates {LONG['max_tokens']} tokens in "
        f"{time.monotonic() - inflight.started_at:.0f} s"
        f"\n{_tails(c.procs)}")
    c.chat_ok("after the short cut")
    print(f"\nmultihost short cut: /health red after {_fmt(detect_s)}; in-flight request 503 after "
          f"{inflight_s:.2f} s; green again {_fmt(recover_s)} after restore; orphan aborted, engine idle "
          f"{idle_s:.2f} s after restore")


def _long_outage(c: Cluster) -> None:
    """A long cut: breakers open (503 at once), the backend keeps serving in its namespace, and recovery
    after the link returns does not grow with the outage."""
    cut_at, detect_s = c.cut()
    c.chat_503(BACKEND_WAIT_S + SLACK_S)
    probe = c.probe_backend_inside()
    time.sleep(max(0.0, LONG_CUT_S - (time.monotonic() - cut_at)))
    c.chat_503(0.5 + SLACK_S / 3)  # the breaker is open: no wait at all
    _check_alive(c.procs)
    _, recover_s = c.restore()
    c.chat_ok("after the long cut")
    print(f"multihost long cut ({LONG_CUT_S:.0f} s): /health red after {_fmt(detect_s)}; backend probe inside "
          f"its namespace: {probe!r}; green again {_fmt(recover_s)} after restore")


def test_multihost_link_cut_and_restore(model_dir, net, tmp_path):
    be_address = f"tcp://{net.ips['be']}:{BACKEND_PORT}"
    liveness = ["--ping-interval-s", str(PING_INTERVAL_S), "--backend-timeout-s", str(BACKEND_TIMEOUT_S),
                "--backend-wait-s", str(BACKEND_WAIT_S), "--breaker-misses", str(BREAKER_MISSES)]
    backend = NsProc(net.ns["be"], backend_args(model_dir, be_address, "--state-dir", str(tmp_path / "state"),
                                                "--max-model-len", "4096"), tmp_path / "backend.log")
    frontends = {role: NsProc(net.ns[role], frontend_args(be_address, HTTP_PORT, "--host", net.ips[role],
                                                          "--frontend-id", role, *liveness),
                              tmp_path / f"{role}.log") for role in ("fe1", "fe2")}
    procs: dict[str, Proc] = {"backend": backend, **frontends}
    # trust_env=False: a proxy from the environment must not capture the private subnet.
    http = httpx.Client(trust_env=False)
    c = Cluster(net, procs, {role: f"http://{net.ips[role]}:{HTTP_PORT}" for role in frontends}, http, be_address)
    try:
        for p in procs.values():
            p.start()
        for role, url in c.urls.items():
            _wait_until(f"{role} healthy at start", lambda u=url: _health(http, u) == 200, 240, procs, 0.2)
        for name, p in procs.items():  # killpg in Proc.stop/kill relies on ip having exec'd Python in place
            exe = Path(f"/proc/{p.proc.pid}/exe").resolve()
            assert exe == Path(sys.executable).resolve(), f"{name}: pid {p.proc.pid} runs {exe}"
        c.chat_ok("at start")
        _blip_with_request_in_flight(c)
        _long_outage(c)
        _check_alive(procs)
    finally:
        http.close()
        for p in procs.values():
            p.stop()
