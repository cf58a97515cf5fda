"""Start errors of the parallel sizes: sizes the model or the machine cannot take, and a model without a decoder
layer list, each one line on stderr naming the setting, exit code 2, and no traceback from any process.

All but the last are refused before vLLM is imported (a few seconds each); the last needs the engine built.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.stack import REPO, backend_args

pytestmark = pytest.mark.slow

CPUS = sorted(os.sched_getaffinity(0))


def _start(model_dir: Path, work: Path, *extra: str, env: dict[str, str] | None = None,
           preexec_fn: Callable[[], None] | None = None, timeout_s: float = 180.0) -> subprocess.CompletedProcess:
    args = backend_args(model_dir, f"ipc://{work}/backend.ipc", "--state-dir", str(work / "state"), *extra)
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, **(env or {})}, preexec_fn=preexec_fn)


def _assert_refused(done: subprocess.CompletedProcess, setting: str) -> str:
    output = done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("pocserve-backend:")]
    assert done.returncode == 2, output[-3000:]
    assert len(lines) == 1 and setting in lines[0], output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    return lines[0]


@pytest.mark.parametrize(("extra", "setting"), [
    (("--tensor-parallel-size", "3"), "--tensor-parallel-size"),  # 4 heads
    (("--tensor-parallel-size", "8"), "--tensor-parallel-size"),  # 4 heads
    (("--pipeline-parallel-size", "5"), "--pipeline-parallel-size"),  # 4 layers
], ids=["tp3-heads", "tp8-heads", "pp5-layers"])
def test_parallel_size_the_model_cannot_split_is_a_start_error(model_dir, tmp_path, extra, setting):
    print(_assert_refused(_start(model_dir, tmp_path, *extra), setting))


def test_parallel_more_cpu_ranks_than_cores_is_a_start_error(model_dir, tmp_path):
    one_core = CPUS[:1]
    done = _start(model_dir, tmp_path, "--tensor-parallel-size", "2", env={"VLLM_CPU_OMP_THREADS_BIND": "auto"},
                  preexec_fn=lambda: os.sched_setaffinity(0, one_core))
    print(_assert_refused(done, "--tensor-parallel-size"))


def test_parallel_cpu_ranks_reserving_more_than_all_ram_is_a_start_error(model_dir, tmp_path):
    if len(CPUS) < 2:
        pytest.skip("needs two cores")
    done = _start(model_dir, tmp_path, "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.6")
    print(_assert_refused(done, "--gpu-memory-utilization"))


@pytest.fixture(scope="module")
def opt_model_dir(model_dir, tmp_path_factory) -> Path:
    """A tiny OPT checkpoint (seeded, bf16) with the tiny model's tokenizer: vLLM's OPT keeps its decoder layers
    at model.decoder.layers, none of the places PoC looks for them (backend/engine/pocworker/hooks.py)."""
    import torch
    from transformers import OPTConfig, OPTForCausalLM

    out = tmp_path_factory.mktemp("opt") / "tiny-opt"
    tiny = json.loads((model_dir / "config.json").read_text())
    torch.manual_seed(0)
    config = OPTConfig(vocab_size=tiny["vocab_size"], hidden_size=64, num_hidden_layers=2, ffn_dim=128,
                       num_attention_heads=2, max_position_embeddings=512, word_embed_proj_dim=64,
                       bos_token_id=tiny["bos_token_id"], eos_token_id=tiny["eos_token_id"], pad_token_id=0)
    OPTForCausalLM(config).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_dir / name, out / name)
    return out


def test_parallel_model_without_decoder_layer_list_is_a_start_error(opt_model_dir, tmp_path):
    done = _start(opt_model_dir, tmp_path, "--max-model-len", "512")
    print(_assert_refused(done, "--model / POCSERVE_MODEL"))
