"""vLLM's own Prometheus stat logger, fed the way `vllm serve`'s API server feeds it: the engine's SchedulerStats
and the output processor's IterationStats of every step. So the vllm:* families we export are vLLM's, with its
names, labels, documentation and buckets, and follow vLLM's version without a copy here.

The processor renders them on request (a frontend's /metrics). Four families are left out: the engine thread
exports them itself, because its figures count PoC work and stay current while only PoC runs (scheduler stats
arrive with chat steps only), and the ML node reads them as its heartbeat.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, generate_latest
from vllm.v1.metrics.loggers import PrometheusStatLogger

# Exported by the frontends from the engine thread's stats (frontend/metrics.py), with the same labels.
ENGINE_FAMILIES = frozenset({
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:iteration_tokens_total",
})


class _VllmFamilies:
    """A registry view: vLLM's families in this process, less the engine thread's."""

    def collect(self):
        for family in REGISTRY.collect():
            if family.name.startswith("vllm:") and family.name not in ENGINE_FAMILIES:
                yield family


class VllmMetrics:
    """Processor thread only."""

    def __init__(self, config) -> None:
        self._config = config
        # Registers its collectors in prometheus_client's default registry, which this process has to itself.
        self._logger = PrometheusStatLogger(config)
        self._view = _VllmFamilies()

    def record(self, scheduler_stats, iteration_stats) -> None:
        self._logger.record(scheduler_stats, iteration_stats)

    def engine_built(self, num_gpu_blocks: int) -> None:
        """vllm:cache_config_info, once the engine has sized its KV cache (as AsyncLLM logs it after the
        handshake)."""
        self._config.cache_config.num_gpu_blocks = num_gpu_blocks
        self._logger.log_engine_initialized()

    def render(self) -> bytes:
        return generate_latest(self._view)  # any object with collect() will do
