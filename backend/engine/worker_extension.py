"""The single worker-extension class vLLM mixes into its Worker: PoC forward, enforced sampling, kernel warm-up,
the KV-cache write's leak check, and --chat-ops' count."""

from typing import Any

from backend.engine import chat_ops, compat
from backend.engine.leak_check import LeakCheckExtension
from backend.engine.pocworker.extension import PocWorkerExtension
from backend.engine.warmup import KernelWarmupExtension
from sampling.enforced import EnforcedSamplingExtension

# vLLM imports this module in every worker process before it builds the model there (--chat-ops).
chat_ops.install()


class WorkerExtension(PocWorkerExtension, EnforcedSamplingExtension, KernelWarmupExtension, LeakCheckExtension):
    model_runner: Any

    def prepare_pipeline_stage(self) -> bool:
        """Called once after the engine is built, on every rank (see compat.ensure_pipeline_buffers)."""
        return compat.ensure_pipeline_buffers(self.model_runner)

    def chat_ops_wrapped(self) -> int:
        """The custom ops this rank's process traces native for chat's graph (--chat-ops inductor; else 0)."""
        return chat_ops.num_wrapped

