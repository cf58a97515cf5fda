"""Reliability soak: two frontends, N concurrent chat streams, shared-mode mining and queued validations.

    .venv/bin/python -m bench.soak --seconds 180 --json /tmp/soak.json

Starts its own backend (the engine of this machine, the generated model of `--shape` in `--model-dir`: tiny by
default; shared scheduling mode, its own state dir), two frontends and a real HTTP callback receiver on loopback.
For `--seconds` it keeps `--concurrency` streaming chat completions open, split evenly across the frontends, each
stream checked for a terminal event (see bench/soak_traffic.py). Meanwhile it runs PoC cycles: a mining round whose
/generated callbacks go to the receiver, /stop, then queued validation jobs of nonces sampled from what the round
delivered, each expected to come back as a /validated callback with fraud_detected false. Then it lets in-flight
streams finish, waits for every validation's callback and for the backend's outbox to drain, and checks the
processes are still healthy.

Reported: chat requests sent / completed / failed / lost, TTFT and e2e p50/p99, nonces mined vs delivered,
validations submitted vs answered, callbacks lost, RSS (start of load, peak, final) of the backend and of each
frontend (whole process groups), and the CPU that other processes used meanwhile (the machine may be shared).
The exit status is 1 if anything was lost or failed, or a process ended unhealthy.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from bench.procs import (
    Proc,
    free_port,
    group_cpu_s,
    group_rss_bytes,
    machine_busy_s,
    raise_on_signals,
    rss_by_mapping_mb,
    stop_all,
    wait_http_ok,
)
from bench.prom import totals
from bench.soak_traffic import (
    PowDriver,
    PowPlan,
    chat_worker,
    missing_validations,
    summarize_chat,
    summarize_pow,
)
from tests.integration.pow_util import Receiver
from tests.stack import backend_args, frontend_args

_MB = 1024 * 1024


@dataclass
class SoakConfig:
    work_dir: Path
    model_dir: Path
    seconds: float = 180.0
    concurrency: int = 64
    num_frontends: int = 2
    max_tokens: int = 16
    # PoC cycles (mining, then validations); 0: one per started minute.
    num_cycles: int = 0
    mine_share: float = 0.6
    validation_interval_s: float = 2.0
    nonces_per_validation: int = 8
    batch_size: int = 8
    seq_len: int = 32
    callback_interval_s: float = 5.0
    drain_timeout_s: float = 120.0
    startup_timeout_s: float = 300.0
    # False: chat only (no mining round, no validation), to tell apart what each half of the traffic costs.
    poc: bool = True
    # Backend flags after the soak's own (vLLM's parser: the last wins), e.g. a GPU memory share per stack.
    backend_extra: tuple[str, ...] = ()

    def plan(self) -> PowPlan:
        cycles = self.num_cycles or max(1, int(self.seconds // 60))
        cycle_s = self.seconds / cycles
        return PowPlan(num_cycles=cycles, mine_s=cycle_s * self.mine_share,
                       validate_s=cycle_s * (1 - self.mine_share), validation_interval_s=self.validation_interval_s,
                       nonces_per_validation=self.nonces_per_validation, batch_size=self.batch_size,
                       seq_len=self.seq_len)


def start_stack(cfg: SoakConfig) -> tuple[list[Proc], list[str]]:
    address = f"ipc://{cfg.work_dir}/backend.ipc"
    backend = Proc("backend", backend_args(
        cfg.model_dir, address, "--state-dir", str(cfg.work_dir / "state"), "--scheduling-mode", "shared",
        "--callback-interval-s", str(cfg.callback_interval_s), "--max-num-seqs", str(max(64, cfg.concurrency)),
        *cfg.backend_extra),
        cfg.work_dir / "backend.log")
    procs = [backend.start()]
    urls = []
    for i in range(cfg.num_frontends):
        port = free_port()
        procs.append(Proc(f"frontend{i}", frontend_args(address, port), cfg.work_dir / f"frontend{i}.log").start())
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        wait_http_ok(f"{url}/health", procs, cfg.startup_timeout_s)
    return procs, urls


def member_rss_mb(groups: dict[int, str]) -> dict[str, float]:
    """RSS of every live member of these process groups, as "<group>/<process name>" (the first of a name only)."""
    out: dict[str, float] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in (d for d in os.listdir("/proc") if d.isdigit()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
            group = groups.get(int(rest.split()[2]))
            if group is None:
                continue
            with open(f"/proc/{pid}/statm") as f:
                mb = int(f.read().split()[1]) * page / _MB
        except OSError:
            continue  # exited meanwhile
        out.setdefault(f"{group}/{head.split('(', 1)[1]}", mb)
    return out


# How often the engine's RSS by mapping kind is sampled (a 10-minute soak: 40 samples, enough for a slope).
MAPPING_EVERY_S = 15.0


class MemorySampler:
    """RSS of each process group once a second: at the start of the load, the peak, the last sample, and the slope
    after warm-up (`slopes`)."""

    def __init__(self, procs: list[Proc]) -> None:
        self.procs = procs
        self.figures = {p.name: {"start_mb": 0.0, "peak_mb": 0.0, "final_mb": 0.0} for p in procs}
        self.samples: dict[str, list[tuple[float, float]]] = {p.name: [] for p in procs}
        # The engine process's (the backend group's leader) RSS by kind of mapping, sampled every MAPPING_EVERY_S
        # into `samples` as "engine <kind>" (each kind has its own slope); its first and last sample.
        self.engine_mappings: dict[str, dict[str, float]] = {}
        self._mapped_at = float("-inf")

    def sample(self) -> None:
        rss = group_rss_bytes([p.pid for p in self.procs])
        now = time.monotonic()
        if now - self._mapped_at >= MAPPING_EVERY_S:  # /proc/PID/smaps walks every mapping: not once a second
            self._mapped_at = now
            mapped = rss_by_mapping_mb(self.procs[0].pid)
            self.engine_mappings.setdefault("start_mb", mapped)
            self.engine_mappings["final_mb"] = mapped
            for kind, mb in mapped.items():
                self.samples.setdefault(f"engine {kind}", []).append((now, mb))
        for p in self.procs:
            mb, f = rss.get(p.pid, 0) / _MB, self.figures[p.name]
            f["start_mb"] = f["start_mb"] or mb
            f["peak_mb"], f["final_mb"] = max(f["peak_mb"], mb), mb
            self.samples[p.name].append((now, mb))
        # Each member of a group too (the backend's engine process and its processor; a frontend and its body
        # worker), by process name, so that a slope says which process grows.
        for name, mb in member_rss_mb({p.pid: p.name for p in self.procs}).items():
            self.samples.setdefault(name, []).append((now, mb))

    def finish(self) -> None:
        """The last sample, the engine's mappings included whenever the last of them was taken."""
        self._mapped_at = float("-inf")
        self.sample()

    def slopes(self, warmup_fraction: float = 1 / 3) -> dict[str, float]:
        """RSS slope in MB/min per process group over the samples after the first `warmup_fraction` of the run
        (least squares; what a leak shows and a warm-up does not, once it has levelled off)."""
        out = {}
        for name, samples in self.samples.items():
            if len(samples) < 10:
                continue
            slope = slope_per_min(samples, warmup_fraction)
            out[name] = round(slope, 3) if slope is not None else 0.0
        return out

    async def run(self) -> None:
        while True:
            await asyncio.to_thread(self.sample)
            await asyncio.sleep(1.0)


def slope_per_min(points: list[tuple[float, float]], warmup_fraction: float = 1 / 3) -> float | None:
    """Least-squares slope in units per minute of (time s, value) points after the first `warmup_fraction` of
    their span; None with fewer than two points there (or all at one time)."""
    if len(points) < 2:
        return None
    t0, t1 = points[0][0], points[-1][0]
    after = [(t, y) for t, y in points if t >= t0 + warmup_fraction * (t1 - t0)]
    if len(after) < 2:
        return None
    mean_t = sum(t for t, _ in after) / len(after)
    mean_y = sum(y for _, y in after) / len(after)
    var = sum((t - mean_t) ** 2 for t, _ in after)
    return 60 * sum((t - mean_t) * (y - mean_y) for t, y in after) / var if var else None


async def metrics(session: aiohttp.ClientSession, base_url: str) -> dict[str, float]:
    async with session.get(f"{base_url}/metrics") as resp:
        text = await resp.text()
    return totals(text)


async def drain(session: aiohttp.ClientSession, urls: list[str], driver: PowDriver, timeout_s: float) -> dict:
    """Waits for every validation's callback, an empty outbox and an idle engine; returns the last metrics."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = await metrics(session, urls[0])
        is_done = (not missing_validations(driver.receiver, driver.jobs) and m.get("pocserve_callback_backlog") == 0
                   and m.get("vllm:num_requests_running") == 0 and m.get("pocserve_poc_queued_job_nonces") == 0)
        if is_done or time.monotonic() > deadline:
            return m
        await asyncio.sleep(0.5)


async def soak(cfg: SoakConfig, procs: list[Proc], urls: list[str], receiver: Receiver) -> dict:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=cfg.concurrency), timeout=timeout) as chat, \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as control:
        memory = MemorySampler(procs)
        sampler = asyncio.create_task(memory.run())
        driver = PowDriver(control, urls, receiver, cfg.plan())
        streams: list = []
        ids = itertools.count()
        cpu_before, client_before, started = _cpu(procs), _client_cpu(), time.monotonic()
        stop_at = started + cfg.seconds
        workers = [asyncio.create_task(chat_worker(chat, urls, w, stop_at, cfg.max_tokens, ids, streams))
                   for w in range(cfg.concurrency)]
        try:
            if cfg.poc:
                await driver.run()
            else:
                await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
        finally:
            if driver.is_mining:  # interrupted mid-round: leave the backend idle
                await driver.stop(f"{urls[0]}/api/v1/pow")
        await asyncio.gather(*workers)
        load_s = time.monotonic() - started
        cpu = [a - b for a, b in zip(_cpu(procs), cpu_before, strict=False)]
        client_cpu_s = _client_cpu() - client_before
        final = await drain(control, urls, driver, cfg.drain_timeout_s)
        sampler.cancel()
        await asyncio.to_thread(memory.finish)
        health = {}
        for name, url in zip([p.name for p in procs[1:]], urls, strict=False):
            async with control.get(f"{url}/health") as resp:
                health[name] = resp.status
        alive = {p.name: p.proc.poll() is None for p in procs}
    return {
        "chat": summarize_chat(streams, load_s, len(urls)), "pow": summarize_pow(driver),
        "memory": memory.figures, "rss_slope_mb_per_min": memory.slopes(), "load_s": load_s,
        "engine_rss_by_mapping": memory.engine_mappings,
        "cpu_pct": {"servers": 100 * cpu[1] / load_s, "client": 100 * client_cpu_s / load_s,
                    "foreign": 100 * (cpu[0] - cpu[1] - client_cpu_s) / load_s},
        "health": {"http": health, "alive": alive},
        "backend": {k: final.get(k) for k in (
            "vllm:num_requests_running", "pocserve_callback_backlog", "pocserve_callbacks_delivered_total",
            "pocserve_callbacks_dropped_total", "pocserve_callback_retries_total",
            "pocserve_backend_aborted_requests_total", "pocserve_poc_validations_total")},
    }


def _cpu(procs: list[Proc]) -> tuple[float, float]:
    return machine_busy_s(), group_cpu_s([p.pid for p in procs])


def _client_cpu() -> float:
    t = os.times()
    return t.user + t.system


def verdict(report: dict, poc: bool = True) -> list[str]:
    """What went wrong, in words; empty when nothing was lost or failed and every process is healthy (`poc`:
    whether PoC cycles ran, so that validations were expected)."""
    chat, pow_, backend = report["chat"], report["pow"], report["backend"]
    problems = [f"{chat[k]} chat requests {k}" for k in ("lost", "failed") if chat[k]]
    if pow_["callbacks_lost"]:
        problems.append(f"{pow_['callbacks_lost']} callbacks lost ({pow_['mining_nonces_lost']} mined nonces, "
                        f"{len(pow_['validations_without_callback'])} validations)")
    if pow_["num_validations_wrong"]:
        problems.append(f"{pow_['num_validations_wrong']} honest validations not clean")
    if pow_["recomputed"]["past_chain"]:
        problems.append(f"{pow_['recomputed']['past_chain']} recomputed nonces past the chain's distance threshold")
    problems += [f"PoC driver: {e}" for e in pow_["errors"]]
    if poc and not pow_["validations_submitted"]:
        problems.append("no validation was submitted")
    if backend["pocserve_callbacks_dropped_total"]:
        problems.append(f"{backend['pocserve_callbacks_dropped_total']:.0f} callbacks dropped by the backend")
    if backend["pocserve_callback_backlog"] or backend["vllm:num_requests_running"]:
        problems.append(f"backend not drained: {backend}")
    problems += [f"{n} /health answered {s}" for n, s in report["health"]["http"].items() if s != 200]
    problems += [f"{n} exited" for n, alive in report["health"]["alive"].items() if not alive]
    return problems


def run_soak(cfg: SoakConfig) -> dict:
    """Starts the processes, runs the soak, stops everything; the report includes `problems` and `ok`."""
    cfg.work_dir.mkdir(parents=True, exist_ok=True)
    receiver = Receiver()
    procs: list[Proc] = []
    try:
        procs, urls = start_stack(cfg)
        report = asyncio.run(soak(cfg, procs, urls, receiver))
    finally:
        stop_all(procs)
        receiver.close()
    report["config"] = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
    report["plan"] = asdict(cfg.plan())
    report["problems"] = verdict(report, cfg.poc)
    report["ok"] = not report["problems"]
    return report


def print_report(r: dict) -> None:
    chat, pow_ = r["chat"], r["pow"]
    rows = [
        ("chat sent / completed", f"{chat['sent']} / {chat['completed']}"),
        ("chat failed / lost", f"{chat['failed']} / {chat['lost']}"),
        ("per frontend (sent)", " ".join(str(f["sent"]) for f in chat["per_frontend"])),
        ("chat req/s", f"{chat['req_per_s']:.2f}"),
        ("TTFT p50 / p99 ms", f"{chat['ttft_p50_ms']:.0f} / {chat['ttft_p99_ms']:.0f}"),
        ("e2e p50 / p99 ms", f"{chat['e2e_p50_ms']:.0f} / {chat['e2e_p99_ms']:.0f}"),
        ("rounds", str(len(pow_["rounds"]))),
        ("nonces mined (/status) / delivered", f"{pow_['nonces_mined']} / {pow_['nonces_delivered']}"),
        ("validations sent / answered", f"{pow_['validations_submitted']} / {pow_['validated_callbacks']}"),
        ("callbacks lost", str(pow_["callbacks_lost"])),
        ("recomputed nonces: max L2 / past 0.02 / past 0.4", "{nonces} nonces: {max_l2:.4f} / {past_fork_default} / "
         "{past_chain}".format(**pow_["recomputed"])),
        ("CPU % servers/client/foreign", " / ".join(f"{v:.0f}" for v in r["cpu_pct"].values())),
    ]
    rows += [(f"RSS MB {name} start/peak/final", " / ".join(f"{v:.0f}" for v in m.values()))
             for name, m in r["memory"].items()]
    rows += [(f"RSS slope {name} after warm-up", f"{v:+.2f} MB/min") for name, v in r["rss_slope_mb_per_min"].items()]
    by_mapping = r.get("engine_rss_by_mapping") or {}
    rows += [(f"engine RSS {kind} start/final", f"{mb:.0f} / {by_mapping['final_mb'][kind]:.0f} MB")
             for kind, mb in by_mapping.get("start_mb", {}).items() if kind in by_mapping.get("final_mb", {})]
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    for e in chat["errors"]:
        print(f"chat error: {e}")
    print("OK: nothing lost" if r["ok"] else "FAILED:\n  " + "\n  ".join(r["problems"]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=180.0)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--cycles", type=int, default=0, help="mining+validation cycles (0: one per minute)")
    p.add_argument("--callback-interval-s", type=float, default=5.0)
    p.add_argument("--model-dir", type=Path, default=Path("models/tiny-qwen3"))
    p.add_argument("--shape", default="tiny", help="the generated model's shape in --model-dir (generated if "
                   "missing): tiny on the CPU, qwen3-0.6b on a GPU")
    p.add_argument("--work-dir", type=Path, default=None, help="logs and state (default: a fresh /tmp dir)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--no-poc", dest="poc", action="store_false", help="chat only: no mining, no validation")
    p.add_argument("--backend-arg", action="append", default=[], metavar="ARG",
                   help="one more backend flag, after the soak's own (repeat it; --backend-arg=--flag=value)")
    args = p.parse_args(argv)
    raise_on_signals()
    from backend.tools.modelgen import ensure_model
    work = args.work_dir or Path(f"/tmp/pocserve-soak-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    cfg = SoakConfig(work_dir=work, model_dir=ensure_model(args.model_dir, args.shape), seconds=args.seconds,
                     concurrency=args.concurrency, max_tokens=args.max_tokens, num_cycles=args.cycles,
                     callback_interval_s=args.callback_interval_s, poc=args.poc,
                     backend_extra=tuple(args.backend_arg))
    cycles = f"{cfg.plan().num_cycles} PoC cycles" if cfg.poc else "no PoC"
    print(f"soak: {cfg.seconds:.0f} s, {cfg.concurrency} streams over {cfg.num_frontends} frontends, "
          f"{cycles}; logs in {work}", flush=True)
    try:
        report = run_soak(cfg)
    except KeyboardInterrupt:
        print("interrupted; child processes stopped", file=sys.stderr)
        return 130
    report["load_avg_end"] = os.getloadavg()
    print_report(report)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
