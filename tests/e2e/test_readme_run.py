"""The README's `make run`, as a user runs it, answered through the official openai client."""

from __future__ import annotations

import os
import signal
import subprocess

import openai

from tests.stack import REPO, Proc, free_port, wait_healthy


def test_make_run_serves_openai_chat(tmp_path):
    port = free_port()
    env = {
        "POCSERVE_PORT": str(port), "POCSERVE_BACKEND_ADDRESS": f"ipc://{tmp_path}/backend.ipc",
        "POCSERVE_MODEL": str(tmp_path / "models" / "tiny-qwen3"), "POCSERVE_STATE_DIR": str(tmp_path / "state"),
        "POCSERVE_ENFORCE_EAGER": "1",  # the memory as README's command has it: the CPU engine's defaults
        "POCSERVE_SERVED_MODEL_NAME": "tiny",
    }
    log = open(tmp_path / "make-run.log", "wb")  # noqa: SIM115  (the child keeps writing to it)
    proc = subprocess.Popen(["make", "run"], cwd=REPO, env={**os.environ, **env}, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    handle = Proc(["make", "run"], tmp_path / "make-run.log")
    handle.proc = proc
    try:
        wait_healthy(f"http://127.0.0.1:{port}", handle, timeout_s=240)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}],
                                               max_tokens=8)
        assert reply.choices[0].message.content is not None
        assert reply.usage.completion_tokens >= 1
        streamed = list(client.chat.completions.create(model="tiny", stream=True, max_tokens=4,
                                                       messages=[{"role": "user", "content": "Hello"}]))
        assert streamed[-1].choices[0].finish_reason in ("stop", "length")
        assert (tmp_path / "models" / "tiny-qwen3" / "model.safetensors").exists()  # generated on first run
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
