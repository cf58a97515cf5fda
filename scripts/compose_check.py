"""The CPU compose stack brought up and used through its load balancer (`make compose-test` runs this after
scripts/compose_test.sh has an engine and the base images; README, "Docker compose").

Every compose command here is one the README gives: `scripts/compose.sh cpu ...`. Steps, each timed:
up --build; /health; a chat completion with the `openai` client; a mining round whose /generated callbacks reach a
receiver on this host; a queued validation job and its /validated callback; scale to 2 replicas, both serving
through the balancer; a replica killed (SIGKILL) and restarted by the engine while a client keeps asking, with no
failed request; down and up again with the job's result (SQLite) and the CURVE keys kept. Exits 1 at the first
failure with one line saying which step, after printing the services' last log lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import openai

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT = "pocserve-cpu"
PORT = int(os.environ.get("LB_PORT", "8000"))
BASE = f"http://127.0.0.1:{PORT}"
TOKEN = os.environ["POCSERVE_POW_API_TOKEN"]
POW = f"{BASE}/api/v1/pow"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
START = time.monotonic()


class Failed(Exception):
    pass


def say(message: str) -> None:
    print(f"compose-check [{time.monotonic() - START:6.1f}s] {message}", flush=True)


def compose(*args: str, timeout: float = 1200) -> str:
    """One README command: scripts/compose.sh cpu ARGS."""
    say("$ scripts/compose.sh cpu " + " ".join(args))
    r = subprocess.run(["scripts/compose.sh", "cpu", *args], cwd=ROOT, timeout=timeout, text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        print(r.stdout[-4000:], flush=True)
        raise Failed(f"scripts/compose.sh cpu {' '.join(args)} exited {r.returncode}")
    return r.stdout


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, text=True, capture_output=True, timeout=120).stdout


def containers(service: str) -> list[str]:
    out = docker("ps", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}",
                 "--filter", f"label=com.docker.compose.service={service}")
    return sorted(out.split())


def wait_until(what: str, check: Callable[[], Any], timeout_s: float, interval_s: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except (httpx.HTTPError, subprocess.SubprocessError, KeyError, ValueError) as e:
            last = e
        time.sleep(interval_s)
    raise Failed(f"{what}: not within {timeout_s:.0f} s (last error: {last})")


class Receiver:
    """The node's callback endpoint: a server on this host that the backend container reaches through its
    network's gateway address."""

    def __init__(self, host_ip: str) -> None:
        self.bodies: list[tuple[str, dict]] = []
        lock = threading.Lock()
        self.lock = lock
        bodies = self.bodies

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    bodies.append((self.path, body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("0.0.0.0", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host_ip}:{self.server.server_address[1]}/v2/poc-batches/tiny"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def of(self, suffix: str) -> list[dict]:
        with self.lock:
            return [b for p, b in self.bodies if p.endswith("/" + suffix)]


def node(**kw: Any) -> dict:
    return {"block_hash": "COMPOSE_BLOCK", "block_height": 7, "public_key": "02compose", "node_id": 0,
            "node_count": 1, **kw}


def metric_total(text: str, needle: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("pocserve_http_requests_total") and needle in line)


def replica_count(cid: str) -> float:
    """/v1/models requests one replica answered, read from its own /metrics (not through the balancer)."""
    text = docker("exec", cid, "python", "-c",
                  "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/metrics').read().decode())")
    return metric_total(text, "/v1/models")


def main() -> None:
    compose("down", "-v")  # a fresh start: no volumes (keys, state, model) from an earlier run
    # Start with one replica: the scale step then checks that the balancer finds the second one on its own.
    os.environ["FRONTEND_REPLICAS"] = "1"
    compose("up", "-d", "--build")
    if len(containers("frontend")) != 1:
        raise Failed(f"FRONTEND_REPLICAS=1 gave {len(containers('frontend'))} frontends")

    say("waiting for /health through the balancer (the backend generates the model and starts vLLM)")
    wait_until("/health 200 through the load balancer",
               lambda: httpx.get(f"{BASE}/health", timeout=5).status_code == 200, timeout_s=900, interval_s=2)
    say("/health: 200")

    client = openai.OpenAI(base_url=f"{BASE}/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello"}],
                                          max_tokens=8, temperature=0)
    if not (chat.choices[0].message.content and chat.usage and chat.usage.completion_tokens > 0):
        raise Failed(f"chat completion without text: {chat}")
    say(f"chat completion ({model}): {chat.usage.completion_tokens} tokens, {chat.choices[0].message.content!r}")

    network = f"{PROJECT}_default"
    gateway = json.loads(docker("network", "inspect", network))[0]["IPAM"]["Config"][0]["Gateway"]
    receiver = Receiver(gateway)
    params = {"model": model, "seq_len": 32}
    r = httpx.post(f"{POW}/init/generate", headers=AUTH, timeout=60,
                   json={**node(), "batch_size": 4, "params": params, "url": receiver.url})
    if r.status_code != 200:
        raise Failed(f"/init/generate: {r.status_code} {r.text}")
    artifacts = wait_until("8 mining artifacts delivered to the receiver",
                           lambda: [a for b in receiver.of("generated") for a in b["artifacts"]][:8] if
                           sum(len(b["artifacts"]) for b in receiver.of("generated")) >= 8 else None,
                           timeout_s=300)
    r = httpx.post(f"{POW}/stop", headers=AUTH, timeout=60)
    if r.status_code != 200:
        raise Failed(f"/stop: {r.status_code} {r.text}")
    say(f"mining round: {len(receiver.of('generated'))} /generated callbacks received, stopped")

    # A validator's queued job on what was mined: its result is kept in SQLite and its callback delivered.
    r = httpx.post(f"{POW}/generate", headers=AUTH, timeout=60, json={
        **node(), "nonces": [a["nonce"] for a in artifacts], "params": params, "batch_size": 4, "wait": False,
        "url": receiver.url, "validation": {"artifacts": artifacts}})
    if r.status_code != 200:
        raise Failed(f"queued validation: {r.status_code} {r.text}")
    job_id = r.json()["request_id"]

    def job_done() -> dict | None:
        body = httpx.get(f"{POW}/generate/{job_id}", headers=AUTH, timeout=10).json()
        return body if body["status"] in ("completed", "failed") else None

    result = wait_until("validation job done", job_done, timeout_s=300)
    if (result["status"], result["n_total"], result["n_mismatch"], result["fraud_detected"]) != (
            "completed", 8, 0, False):
        raise Failed(f"validation of the mined artifacts: {result}")
    wait_until("/validated callback", lambda: [b for b in receiver.of("validated") if b["request_id"] == job_id],
               timeout_s=60)
    say(f"validation job {job_id}: 8 nonces, 0 mismatches, /validated callback received")

    compose("up", "-d", "--scale", "frontend=2")
    replicas = containers("frontend")
    if len(replicas) != 2:
        raise Failed(f"--scale frontend=2 gave {len(replicas)} frontends")
    wait_until("both replicas healthy", lambda: all(
        docker("inspect", "-f", "{{.State.Health.Status}}", c).strip() == "healthy" for c in replicas),
        timeout_s=120)

    def both_serve() -> bool:
        before = {c: replica_count(c) for c in replicas}
        for _ in range(20):
            httpx.get(f"{BASE}/v1/models", timeout=10).raise_for_status()
        return all(replica_count(c) > before[c] for c in replicas)

    wait_until("both replicas answer through the balancer", both_serve, timeout_s=60, interval_s=2)
    say("scaled to 2: both replicas answered /v1/models through the balancer")

    # A replica killed (SIGKILL to its process, as a crash) while a client keeps asking: the balancer sends the
    # requests to the other one, the engine restarts the dead one (restart: unless-stopped), and it serves again.
    # The kill lands whenever it lands: a GET in flight on the dying replica is sent again to the other one
    # (docker/haproxy.cfg, retry-on empty-response).
    victim = replicas[0]
    restarts = int(docker("inspect", "-f", "{{.RestartCount}}", victim))
    pid = docker("inspect", "-f", "{{.State.Pid}}", victim).strip()
    done = threading.Event()
    outcomes: list[int | str] = []

    def ask() -> None:
        with httpx.Client(timeout=30) as http:
            while not done.is_set():
                try:
                    outcomes.append(http.get(f"{BASE}/v1/models").status_code)
                except httpx.HTTPError as e:
                    outcomes.append(repr(e))
                time.sleep(0.02)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    time.sleep(2)
    subprocess.run(["kill", "-KILL", pid], check=True)
    wait_until("the killed replica restarted and healthy", lambda: (
        int(docker("inspect", "-f", "{{.RestartCount}}", victim)) > restarts
        and docker("inspect", "-f", "{{.State.Health.Status}}", victim).strip() == "healthy"), timeout_s=120)
    served = replica_count(victim)
    wait_until("the restarted replica serves through the balancer", lambda: (
        httpx.get(f"{BASE}/v1/models", timeout=10).status_code == 200 and replica_count(victim) > served),
        timeout_s=60, interval_s=0.2)
    done.set()
    asker.join(60)
    failed = [o for o in outcomes if o != 200]
    if failed or len(outcomes) < 20:
        raise Failed(f"while a replica was killed and restarted: {len(failed)} of {len(outcomes)} requests failed: "
                     f"{failed[:5]}")
    say(f"replica killed and restarted: {len(outcomes)} requests meanwhile, none failed")

    def curve_keys() -> str:
        return docker("exec", containers("backend")[0], "sh", "-c",
                      "cat /keys/backend.key /keys/clients/frontend.key")

    keys = curve_keys()
    compose("down")
    if containers("backend") or containers("frontend"):
        raise Failed("containers left after down")
    compose("up", "-d")
    wait_until("/health 200 after down and up", lambda: httpx.get(f"{BASE}/health", timeout=5).status_code == 200,
               timeout_s=600, interval_s=2)
    if curve_keys() != keys:
        raise Failed("the CURVE keys changed across down and up")
    kept = httpx.get(f"{POW}/generate/{job_id}", headers=AUTH, timeout=10)
    if kept.status_code != 200 or kept.json() != result:
        raise Failed(f"job {job_id} after down and up: {kept.status_code} {kept.text} (before: {result})")
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello"}],
                                          max_tokens=8, temperature=0)
    say("down and up: CURVE keys and the job's result (SQLite) kept; chat answers again")


if __name__ == "__main__":
    try:
        main()
    except (Failed, httpx.HTTPError, openai.OpenAIError, subprocess.SubprocessError) as e:
        for service in ("backend", "frontend", "lb"):
            for cid in containers(service):
                print(f"--- {service} {cid} (last lines)", flush=True)
                subprocess.run(["docker", "logs", "--tail", "30", cid], check=False)
        print(f"compose-check: FAILED: {e}", flush=True)
        sys.exit(1)
    say("compose-check: all steps passed")
    if os.environ.get("POCSERVE_COMPOSE_KEEP") != "1":
        compose("down")
