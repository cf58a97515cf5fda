"""`python -m pocserve.api_server` launched, watched and stopped the way the Gonka ML node does it (its
VLLMRunner): `sh -c "exec python -m $MLNODE_VLLM_MODULE --model M --dtype D --port P --host 0.0.0.0 <args>
--worker-extension-cls gonka_poc.worker.PoCWorkerExtension"` in a new session, ready once /metrics carries the
heartbeat series, stopped with SIGINT to the process group (killed after 20 s).

One instance for the main test, two small ones side by side (consecutive ports, one state directory each, a
round fanned out with group_id 0 / 1 of 2). Bad input fails before any engine starts.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from bench.prom import totals
from tests.integration.pow_util import Receiver, artifacts_of, generate, node, params, status, stop, wait_until
from tests.stack import REPO, free_port

# The ML node's timeout between SIGINT and SIGKILL (its vLLM runner's TERMINATION_TIMEOUT).
ML_NODE_TERMINATION_S = 20.0
HEARTBEAT = ("vllm:iteration_tokens_total_count", "vllm:num_requests_running", "vllm:num_requests_waiting")


def heartbeat(base_url: str) -> dict[str, float] | None:
    """The three series as the ML node reads them (its vLLM runner's _scrape_heartbeat); None while any is missing."""
    try:
        text = httpx.get(f"{base_url}/metrics", timeout=3).text
    except httpx.HTTPError:
        return None
    values = totals(text)
    if any(name not in values for name in HEARTBEAT):
        return None
    return {name: values[name] for name in HEARTBEAT}


# What the ML node's VLLMRunner starts: its own flags, the node's model config, the worker extension last.
def runner_args(model_dir: Path, port: int, *config: str) -> list[str]:
    return ["--model", str(model_dir), "--dtype", "float16", "--port", str(port), "--host", "0.0.0.0",
            "--enable-prompt-tokens-details", *config, "--worker-extension-cls", "gonka_poc.worker.PoCWorkerExtension"]


# The network's Qwen3-235B config (gonka deploy/join/node-config.json), with the two values a 2-core CPU host needs:
# one rank, and an explicit KV cache that holds the 240000-token context instead of 88% of memory (vLLM's CPU
# engine takes a share of the RAM the host reports, which a fresh VM under-reports: tests/stack.py).
QWEN235B_CONFIG = ["--scheduling-policy", "priority", "--max-num-batched-tokens", "32768", "--tensor-parallel-size",
                   "1", "--max-model-len", "240000", "--kv-cache-memory-bytes", "512M"]
# A small node config for the instances run side by side on 2 cores.
SMALL_CONFIG = ["--served-model-name", "tiny", "--max-model-len", "1024", "--max-num-seqs", "16",
                "--kv-cache-memory-bytes", "64M", "--enforce-eager", "--tensor-parallel-size", "1",
                "--enable-prefix-caching", "--disable-log-stats"]


class MlNodeInstance:
    """One inference server as the ML node's VLLMRunner starts it."""

    def __init__(self, args: list[str], port: int, state_root: Path, log_path: Path, *,
                 env: dict[str, str] | None = None) -> None:
        self.port, self.state_root, self.log_path, self.args = port, state_root, log_path, args
        self.model = args[args.index("--served-model-name") + 1] if "--served-model-name" in args else \
            args[args.index("--model") + 1]
        command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "pocserve.api_server", *self.args])
        self.env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "POCSERVE_STATE_ROOT": str(state_root), **(env or {})}
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(["sh", "-c", f"exec {command}"], cwd=REPO, env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.base_url = f"http://127.0.0.1:{port}"

    @property
    def pow(self) -> str:
        return f"{self.base_url}/api/v1/pow"

    @property
    def state_dir(self) -> Path:
        return self.state_root / f"port-{self.port}"

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """As the ML node waits: until the process is running and the heartbeat series are all there."""
        deadline = time.monotonic() + timeout_s
        while heartbeat(self.base_url) is None:
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.tail()}"
            assert time.monotonic() < deadline, f"no heartbeat after {timeout_s} s:\n{self.tail()}"
            time.sleep(1.0)

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def sigint_group(self) -> float:
        """SIGINT to the process group, as the ML node stops it; the seconds until the process exited."""
        started = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(ML_NODE_TERMINATION_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running {ML_NODE_TERMINATION_S} s after SIGINT:\n{self.tail()}") from None
        return time.monotonic() - started

    def kill(self) -> None:
        """The ML node's fallback: SIGKILL to everything that is left."""
        if self.proc.poll() is None:
            procs = [*self.descendants(), psutil.Process(self.proc.pid)]
            for p in procs:
                p.kill()
            psutil.wait_procs(procs, timeout=30)
        self.proc.wait(30)


def _alive(procs: list[psutil.Process]) -> list[str]:
    left = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{p.pid} {p.name()}")
        except psutil.NoSuchProcess:
            pass
    return left


def iterations(base_url: str) -> float:
    beat = heartbeat(base_url)
    return -1.0 if beat is None else beat["vllm:iteration_tokens_total_count"]


def chat(inst: MlNodeInstance, content: str = "Hello", **fields) -> httpx.Response:
    body = {"model": inst.model, "messages": [{"role": "user", "content": content}], "max_tokens": 8, **fields}
    return httpx.post(f"{inst.base_url}/v1/chat/completions", json=body, timeout=60)


def init_round(inst: MlNodeInstance, url: str, **fields) -> None:
    body = {**node(block_hash="ML_NODE_ROUND"), "batch_size": 4, "params": params(32, model=inst.model), "url": url,
            **fields}
    r = httpx.post(f"{inst.pow}/init/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text


def mined_nonces(receiver: Receiver) -> set[int]:
    return {a["nonce"] for b in receiver.bodies("generated") for a in b["artifacts"]}


@pytest.fixture(scope="module")
def instance(model_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("api-server")
    port = free_port()
    inst = MlNodeInstance(runner_args(model_dir, port, *QWEN235B_CONFIG), port, work / "state",
                          work / "instance.log", env={"POC_CALLBACK_INTERVAL_SEC": "0.5"})  # POC_* reach the backend
    try:
        inst.wait_ready()
        yield inst
    finally:
        inst.kill()


@pytest.mark.slow
def test_api_server_takes_the_networks_launch_and_calls(instance, stack):
    """The runner's exact command line with a network config, then what dapi and the ML node send."""
    log = instance.log_path.read_text(errors="replace")
    assert "dtype_overridden" in log and "worker_extension_cls_overridden" in log
    models = httpx.get(f"{instance.base_url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [instance.model] and models["data"][0]["max_model_len"] == 240000

    # --dtype float16 runs the checkpoint's dtype, as the fork: the artifacts are the shared (dtype auto) stack's.
    nonces = [0, 1, 2, 3, 4, 5, 6, 7]
    assert artifacts_of(instance.pow, nonces, params=params(32, model=instance.model)) == \
        artifacts_of(f"{stack.base_url}/api/v1/pow", nonces)

    # Chat under --scheduling-policy priority takes a priority; usage has the cached prompt tokens.
    prompt = "The network replays paid inferences token by token. " * 12
    first, second = (chat(instance, prompt, priority=1) for _ in range(2))
    assert first.status_code == 200 == second.status_code, first.text
    details = [r.json()["usage"]["prompt_tokens_details"] for r in (first, second)]
    assert details[0]["cached_tokens"] == 0 < details[1]["cached_tokens"], details

    # A round as dapi starts it for a node numbered above the node count, fanned out by the ML node into groups.
    receiver = Receiver()
    try:
        init_round(instance, receiver.url, node_id=3, node_count=2, group_id=1, n_groups=2)
        wait_until(lambda: len(mined_nonces(receiver)) >= 8, timeout_s=120, what="mined artifacts delivered")
        assert status(instance.pow)["status"] == "GENERATING"
        # The fork's NonceIterator: node_id + group_id * node_count + k * n_groups * node_count.
        assert {n % 4 for n in mined_nonces(receiver)} == {1} and min(mined_nonces(receiver)) >= 5
        # A validator numbered above the node count recomputes a nonce meanwhile.
        r = generate(instance.pow, [5, 9], params=params(32, model=instance.model),
                     **node(block_hash="ML_NODE_ROUND", node_id=7, node_count=2))
        assert r.status_code == 200 and r.json()["status"] == "completed", r.text
        stop(instance.pow)
        assert status(instance.pow)["status"] != "GENERATING"
    finally:
        receiver.close()
    assert chat(instance).status_code == 200


@pytest.mark.slow
def test_api_server_serves_mines_and_stops_on_sigint_as_the_ml_node_expects(instance, receiver):
    # Chat and a blocking /generate, as the network's clients send them.
    r = chat(instance)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
    r = generate(instance.pow, [0, 1, 2, 3], params=params(32, model=instance.model))
    assert r.status_code == 200 and r.json()["status"] == "completed" and len(r.json()["artifacts"]) == 4, r.text

    # A mining round: callbacks arrive, and the heartbeat counter moves with no request running (PoC forwards
    # count as iterations), so the ML node never takes a long round for a hang.
    init_round(instance, receiver.url)
    wait_until(lambda: len(mined_nonces(receiver)) >= 8, timeout_s=120, what="mined artifacts delivered")
    beat = heartbeat(instance.base_url)
    assert beat is not None and beat["vllm:num_requests_running"] == 0 == beat["vllm:num_requests_waiting"]
    wait_until(lambda: iterations(instance.base_url) > beat["vllm:iteration_tokens_total_count"], timeout_s=30,
               what="heartbeat moving while mining")

    # What must survive the stop: callbacks the receiver refuses, and a queued job far from done (it shares the
    # device with the round: thousands of nonces take minutes here).
    receiver.status = 500
    num_failed = receiver.num_failed
    wait_until(lambda: receiver.num_failed > num_failed, timeout_s=60, what="a refused callback")
    r = generate(instance.pow, list(range(1000, 6000)), wait=False, params=params(32, model=instance.model))
    assert r.status_code == 200 and r.json()["status"] == "queued", r.text
    job_id = r.json()["request_id"]
    assert status(instance.pow)["status"] == "GENERATING"

    procs = instance.descendants()
    names = {p.name() for p in procs}
    assert {"pocserve-backend", "pocserve-processor"} <= names, names
    elapsed_s = instance.sigint_group()
    print(f"\nSIGINT to exit, mining round running: {elapsed_s:.2f} s")
    assert instance.proc.returncode == 0, instance.tail()
    assert elapsed_s < ML_NODE_TERMINATION_S
    assert not _alive(procs), f"left behind: {_alive(procs)}"
    assert not list(Path("/tmp").glob(f"pocserve-{instance.port}-*")), "the instance's ipc directory is left"

    with sqlite3.connect(instance.state_dir / "pocserve.db") as db:
        (job_status,) = db.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
        (num_undelivered,) = db.execute("SELECT COUNT(*) FROM outbox WHERE path = 'generated'").fetchone()
    assert job_status in ("queued", "running")  # a running job is queued again when the next backend starts
    assert num_undelivered > 0
    receiver.status = 200


def _run_bad(args: list[str], timeout_s: float = 120.0) -> tuple[int, list[str], float]:
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pocserve.api_server", *args], cwd=REPO, capture_output=True,
                       text=True, timeout=timeout_s)
    return r.returncode, r.stderr.strip().splitlines(), time.monotonic() - started


def test_api_server_bad_input_one_line_naming_it(model_dir, tmp_path):
    env_free = ["--dtype", "auto", "--host", "127.0.0.1"]
    code, lines, elapsed_s = _run_bad(["--model", str(tmp_path / "missing"), "--port", str(free_port()), *env_free])
    assert code == 2 and lines == [f"pocserve.api_server: --model {tmp_path / 'missing'}: no such directory"]
    assert elapsed_s < 10.0  # checked before vLLM's parser is even imported

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, lines, elapsed_s = _run_bad(["--model", str(model_dir), "--port", str(port), *env_free])
    assert code == 2 and lines == [f"pocserve.api_server: --port {port}: address already in use on 127.0.0.1"]
    assert elapsed_s < 10.0

    code, lines, _ = _run_bad(["--model", str(model_dir), "--port", str(free_port()), *env_free, "--no-such-flag"])
    assert code == 2 and lines[-1] == "pocserve.api_server: unrecognized arguments: --no-such-flag", lines
    assert len([line for line in lines if line.startswith("pocserve")]) == 1

    # A server flag pocserve cannot honour, and an engine flag value the backend refuses: both before any start.
    code, lines, _ = _run_bad(["--model", str(model_dir), "--port", str(free_port()), *env_free,
                               "--ssl-keyfile", "k.pem"])
    assert code == 2 and lines[-1].startswith("pocserve.api_server: --ssl-keyfile: "), lines
    code, lines, _ = _run_bad(["--model", str(model_dir), "--port", str(free_port()), *env_free,
                               "--data-parallel-size", "2"])
    assert code == 2 and lines[-1].startswith("pocserve.api_server: --data-parallel-size: "), lines


@pytest.mark.slow
def test_api_server_two_instances_side_by_side_mine_disjoint_nonces(model_dir, tmp_path):
    """Consecutive ports and one state root, as the ML node's instances run: each derives its own state dir and
    ipc path; a round fanned out with group_id 0 and 1 of 2 mines disjoint nonces; a dead backend takes only its
    own instance down, non-zero."""
    port = free_port()
    while not _is_free(port + 1):
        port = free_port()
    receivers = [Receiver(), Receiver()]
    instances = [MlNodeInstance(runner_args(model_dir, port + i, *SMALL_CONFIG), port + i, tmp_path / "state",
                                tmp_path / f"instance{i}.log") for i in range(2)]
    try:
        for inst in instances:
            inst.wait_ready()
        for inst in instances:
            assert chat(inst).status_code == 200
        for group_id, (inst, receiver) in enumerate(zip(instances, receivers, strict=True)):
            init_round(inst, receiver.url, group_id=group_id, n_groups=2)
        for receiver in receivers:
            wait_until(lambda r=receiver: len(mined_nonces(r)) >= 8, timeout_s=180, what="both groups mining")
        for inst in instances:
            stop(inst.pow)
        first, second = (mined_nonces(r) for r in receivers)
        assert first and second and not first & second
        assert {n % 2 for n in first} == {0} and {n % 2 for n in second} == {1}  # group_id + k * n_groups
        assert [p.name for p in sorted((tmp_path / "state").iterdir())] == [f"port-{port}", f"port-{port + 1}"]

        # The second instance's backend dies: that instance goes down non-zero; the first keeps serving.
        backend = next(p for p in instances[1].descendants() if p.name() == "pocserve-backend")
        backend.kill()
        assert instances[1].proc.wait(30) != 0
        assert chat(instances[0]).status_code == 200
        assert instances[0].sigint_group() < ML_NODE_TERMINATION_S and instances[0].proc.returncode == 0
    finally:
        for inst in instances:
            inst.kill()
        for receiver in receivers:
            receiver.close()


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True
