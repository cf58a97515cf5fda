"""bench/startup.py reads a start's phases from the backend's log, in our format and in vLLM's own."""

from __future__ import annotations

from datetime import datetime

from bench.startup import phases
from common.logs import process_uptime_s


def test_phases_from_both_log_formats(tmp_path):
    year = datetime.now().year
    spawned_at = datetime.fromisoformat(f"{year}-11-25T20:35:20+00:00").timestamp()
    vllm_at = datetime.strptime(f"{year}-11-25 20:35:30", "%Y-%m-%d %H:%M:%S").timestamp()  # local time
    log = tmp_path / "backend.log"
    log.write_text("\n".join([
        f"{year}-11-25T20:35:21.500000Z [info     ] backend_socket_bound           [backend.transport.server]",
        f"{year}-11-25T20:35:22.000000Z [info     ] jobs_loaded                    [backend.pow.jobs]",
        "INFO 11-25 20:35:30 [default_loader.py:430] Loading weights took 0.01 seconds",
        "(EngineCore pid=1) INFO 11-25 20:35:30 [monitor.py:53] torch.compile took 4.12 s in total",
        "Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 127.05it/s] took",
        f"{year}-11-25T20:35:44.422049Z [info     ] engine_ready                   elapsed_s=15.9 uptime_s=24.4",
    ]))
    got = phases(log, spawned_at)
    assert [line.split()[-1] if "engine_ready" not in line else "engine_ready" for _, line in got] == [
        "[backend.transport.server]", "seconds", "total", "engine_ready"]
    assert got[0][0] == 1.5
    assert got[1][0] == vllm_at - spawned_at and got[2][0] == vllm_at - spawned_at  # whole seconds in vLLM's
    assert round(got[3][0], 3) == 24.422  # jobs_loaded and the unstamped progress bar are not phases


def test_process_uptime_is_this_process_age():
    uptime = process_uptime_s()
    assert uptime is not None and 0 <= uptime < 24 * 3600
