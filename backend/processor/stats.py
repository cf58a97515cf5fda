"""Chat statistics from vLLM's output processor (IterationStats), the numbers `vllm serve` exports."""

from __future__ import annotations

from backend.iterations import IterationHistogram
from protocol.processor import ProcessorStats


class ChatStats:
    """Running totals over every engine step that produced chat outputs; processor thread only."""

    def __init__(self) -> None:
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self.num_finished = 0
        self.iterations = IterationHistogram()

    def record(self, iteration_stats) -> None:
        """`iteration_stats`: vLLM's IterationStats of one process_outputs call."""
        prompt = iteration_stats.prompt_token_stats.computed
        tokens = prompt + iteration_stats.num_generation_tokens
        self.num_prompt_tokens += prompt
        self.num_generation_tokens += iteration_stats.num_generation_tokens
        self.num_finished += len(iteration_stats.finished_requests)
        self.iterations.observe(tokens)

    def snapshot(self) -> ProcessorStats:
        return ProcessorStats(
            num_prompt_tokens=self.num_prompt_tokens, num_generation_tokens=self.num_generation_tokens,
            num_finished_requests=self.num_finished, iteration_tokens_counts=list(self.iterations.counts),
            iteration_tokens_sum=float(self.iterations.sum), iteration_tokens_count=self.iterations.count)
