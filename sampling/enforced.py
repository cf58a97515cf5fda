"""Enforced tokens and per-request logprobs mode inside vLLM's V1 sampler, with no vLLM source change.

Two pieces, both worker-side:
- `EnforcedTracker`, a no-op logits processor (argmax-invariant, so it never changes a distribution) that
  vLLM keeps informed of every batch change; it knows each row's enforced ids, its live output list and its
  logprobs mode, keyed by the row's *request* (never by a stale index: that mixed requests up in the fork);
- wrappers on the sampler instance's `forward` and `sample`: after vLLM samples, rows with an enforced token
  get it instead, *before* the logprob gather, so the returned token, logprob, rank and top-k describe the
  model's distribution at the enforced token; rows asking for raw logprobs get log_softmax of the logits
  as they were before any processor, the others keep vLLM's processed logprobs.
The engine itself runs in processed_logprobs mode; the request's effective mode travels in extra_args.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

ENFORCED_KEY = "enforced_token_ids"
MODE_KEY = "logprobs_mode"
MODES = ("raw_logprobs", "processed_logprobs")


@dataclass
class _Row:
    enforced: list[int] | None
    # vLLM's live list of this request's generated tokens: len() is the index being sampled now.
    output_ids: list[int]
    wants_raw: bool


@dataclass
class Plan:
    # [rows] int64 on the device: the token to force, -1 where the sampler's choice stands.
    enforced: torch.Tensor | None
    # [rows] bool on the device: rows whose logprobs must be raw.
    raw_rows: torch.Tensor | None
    raw_logprobs: torch.Tensor | None = None


def _new_row(params, _prompt_ids, output_ids) -> _Row | None:
    extra = params.extra_args or {}
    enforced = extra.get(ENFORCED_KEY)
    wants_raw = extra.get(MODE_KEY) == "raw_logprobs"
    if not enforced and not wants_raw:
        return None
    return _Row(list(enforced) if enforced else None, output_ids, wants_raw)


class EnforcedTracker(LogitsProcessor):
    @classmethod
    def validate_params(cls, sampling_params) -> None:
        extra = sampling_params.extra_args or {}
        ids = extra.get(ENFORCED_KEY)
        if ids is not None and (not isinstance(ids, list) or not ids or
                                not all(isinstance(i, int) and i >= 0 for i in ids)):
            raise ValueError(f"{ENFORCED_KEY} must be a non-empty list of token ids")
        if extra.get(MODE_KEY) not in (None, *MODES):
            raise ValueError(f"{MODE_KEY} must be one of {MODES}")

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, _Row] = {}
        self.device = device
        self.pin = is_pin_memory

    def is_argmax_invariant(self) -> bool:
        return True

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, _new_row)

    def plan(self, num_rows: int) -> Plan | None:
        if not self.rows:
            return None
        enforced = [-1] * num_rows
        raw = [False] * num_rows
        for index, row in self.rows.items():
            if index >= num_rows:
                continue
            if row.enforced:
                pos = len(row.output_ids)
                enforced[index] = row.enforced[pos] if pos < len(row.enforced) else row.enforced[-1]
            raw[index] = row.wants_raw
        return Plan(enforced=self._to_device(enforced, torch.int64) if max(enforced) >= 0 else None,
                    raw_rows=self._to_device(raw, torch.bool) if any(raw) else None)

    def _to_device(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        t = torch.tensor(values, dtype=dtype, pin_memory=self.pin)
        return t.to(self.device, non_blocking=True)


def find_tracker(sampling_metadata) -> EnforcedTracker | None:
    for proc in sampling_metadata.logitsprocs.argmax_invariant:
        if isinstance(proc, EnforcedTracker):
            return proc
    return None


def install(sampler) -> None:
    """Wraps this sampler instance's forward and sample (idempotent)."""
    if getattr(sampler, "_pocserve_enforced", False):
        return
    orig_forward, orig_sample = sampler.forward, sampler.sample
    current: list[Plan] = []

    def forward(logits, sampling_metadata, *args, **kwargs):
        tracker = find_tracker(sampling_metadata)
        plan = tracker.plan(logits.shape[0]) if tracker is not None else None
        if plan is None:
            return orig_forward(logits, sampling_metadata, *args, **kwargs)
        if plan.raw_rows is not None and sampling_metadata.max_num_logprobs is not None:
            # Raw means before any processor; processors may work in place, so take it now.
            plan.raw_logprobs = logits.log_softmax(dim=-1, dtype=torch.float32)
        current.append(plan)
        try:
            return orig_forward(logits, sampling_metadata, *args, **kwargs)
        finally:
            current.pop()

    def sample(logits, sampling_metadata, *args, **kwargs):
        sampled, processed = orig_sample(logits, sampling_metadata, *args, **kwargs)
        if current:
            plan = current[-1]
            if plan.enforced is not None:
                sampled = torch.where(plan.enforced >= 0, plan.enforced.to(sampled.dtype), sampled)
            if plan.raw_logprobs is not None and processed is not None:
                processed = torch.where(plan.raw_rows[:, None], plan.raw_logprobs, processed)
        return sampled, processed

    sampler.forward = forward
    sampler.sample = sample
    sampler._pocserve_enforced = True


class EnforcedSamplingExtension:
    """Worker-extension method (mixed into vLLM's Worker): installs the sampler wrappers."""

    def install_enforced_sampling(self) -> bool:
        install(self.model_runner.sampler)
        return True
