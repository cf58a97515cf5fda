"""bench/step_hook/sitecustomize.py in a fresh interpreter with vLLM: the scheduler and model runner both engines
run are wrapped once imported where the bench asks for the step log (bench/step_log.py), and left alone where it
does not."""

import os
import subprocess
import sys
from pathlib import Path

from bench.step_log import REPO, server_env

PROBE = """
import threading
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
wrapped = [getattr(f, "step_log_phase", None) for f in (Scheduler.update_from_output, Scheduler.schedule,
                                               GPUModelRunner.execute_model, GPUModelRunner.sample_tokens)]
print(*wrapped, AsyncScheduler.update_from_output is Scheduler.update_from_output,
      CPUModelRunner.execute_model is GPUModelRunner.execute_model,
      sum(t.name == "bench-step-log" for t in threading.enumerate()))
"""


def _probe(env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd="/", env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_engine_is_wrapped_only_where_the_step_log_is_asked_for(tmp_path: Path) -> None:
    # From "/" so that neither this repository nor its hook is on the path unless the environment puts them there.
    # One writer (one flush thread) for both modules of a process.
    assert _probe(server_env(tmp_path, "ours", True)) == "update schedule execute sample True True 1"
    assert _probe({"PYTHONPATH": str(REPO)}) == "None None None None True True 0"
