"""Engine statistics as vLLM's own stat loggers see them (the same numbers `vllm serve` exports)."""

from __future__ import annotations

import bisect

from vllm.v1.metrics.loggers import StatLoggerBase

# vLLM's buckets for vllm:iteration_tokens_total.
ITERATION_TOKEN_BOUNDS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class EngineStatsRecorder(StatLoggerBase):
    """Receives every engine iteration's stats from vLLM (engine thread) and keeps running totals."""

    bounds = ITERATION_TOKEN_BOUNDS

    def __init__(self, vllm_config=None, engine_index: int = 0) -> None:
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self.num_finished = 0
        # Per-bucket counts, the last one for +Inf.
        self.iteration_counts = [0] * (len(ITERATION_TOKEN_BOUNDS) + 1)
        self.iteration_sum = 0
        self.iteration_count = 0

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        if iteration_stats is None:
            return
        prompt = iteration_stats.prompt_token_stats.computed
        tokens = prompt + iteration_stats.num_generation_tokens
        self.num_prompt_tokens += prompt
        self.num_generation_tokens += iteration_stats.num_generation_tokens
        self.num_finished += len(iteration_stats.finished_requests)
        self.iteration_counts[bisect.bisect_left(ITERATION_TOKEN_BOUNDS, tokens)] += 1
        self.iteration_sum += tokens
        self.iteration_count += 1

    def log_engine_initialized(self) -> None:
        pass


class RecorderFactory:
    """vLLM calls the factory with (vllm_config, engine_index); we keep the instance it made."""

    def __init__(self) -> None:
        self.recorder = EngineStatsRecorder()

    def __call__(self, vllm_config, engine_index: int = 0) -> EngineStatsRecorder:
        return self.recorder
