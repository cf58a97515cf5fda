"""Enforced tokens and per-request logprobs mode inside vLLM's V1 sampler, with no vLLM source change.

Worker-side. The engine thread registers each replay request (its enforced ids, whether it wants raw
logprobs) by name through collective_rpc before the request is first scheduled. Wrappers on the sampler
instance's `forward` and `sample` then, for registered rows only:
- replace the sampled token with the enforced one *before* the logprob gather, so the returned token,
  logprob, rank and top-k describe the model's distribution at the enforced token;
- give raw-mode rows log_softmax of the logits as they were before any processor (the engine itself runs in
  processed_logprobs mode, so the mode can differ per request).
Rows are matched by request id through the input batch (keying by a stale index mixed requests up in the
fork). The enforced position is the length of vLLM's own output-token list for that request; only its length
is read, so async scheduling keeps overlapping (a logits processor that needs output ids would force a sync
every step: measured at -40% throughput on an H100).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

ENFORCED_KEY = "enforced_token_ids"
MODE_KEY = "logprobs_mode"


@dataclass(frozen=True)
class Registration:
    enforced: tuple[int, ...]
    wants_raw: bool


@dataclass
class Plan:
    # [rows] int64 on the device: the token to force, -1 where the sampler's choice stands.
    enforced: torch.Tensor | None
    # [rows] bool on the device: rows whose logprobs must be raw.
    raw_rows: torch.Tensor | None
    raw_logprobs: torch.Tensor | None = None


class EnforcedRows:
    """Registered requests → the per-row plan for one sampler call."""

    def __init__(self, input_batch_of, device: torch.device, pin_memory: bool) -> None:
        self._input_batch_of = input_batch_of  # the runner may rebuild its input batch: look it up per call
        self.device = device
        self.pin = pin_memory
        self.registered: dict[str, Registration] = {}

    def register(self, req_id: str, enforced: list[int], wants_raw: bool) -> None:
        self.registered[req_id] = Registration(tuple(enforced), wants_raw)

    def forget(self, req_ids: list[str]) -> None:
        for req_id in req_ids:
            self.registered.pop(req_id, None)

    def plan(self, num_rows: int) -> Plan | None:
        if not self.registered:
            return None
        batch = self._input_batch_of()
        enforced = [-1] * num_rows
        raw = [False] * num_rows
        is_any = False
        for index, req_id in enumerate(batch.req_ids[:num_rows]):
            reg = self.registered.get(req_id)
            if reg is None:
                continue
            is_any = True
            if reg.enforced:
                outputs = batch.req_output_token_ids[index]
                pos = len(outputs) if outputs is not None else 0
                enforced[index] = reg.enforced[pos] if pos < len(reg.enforced) else reg.enforced[-1]
            raw[index] = reg.wants_raw
        if not is_any:
            return None
        return Plan(enforced=self._to_device(enforced, torch.int64) if max(enforced) >= 0 else None,
                    raw_rows=self._to_device(raw, torch.bool) if any(raw) else None)

    def _to_device(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        t = torch.tensor(values, dtype=dtype, pin_memory=self.pin)
        return t.to(self.device, non_blocking=True)


def install(sampler, rows: EnforcedRows) -> None:
    """Wraps this sampler instance's forward and sample."""
    orig_forward, orig_sample = sampler.forward, sampler.sample
    current: list[Plan] = []

    def forward(logits, sampling_metadata, *args, **kwargs):
        plan = rows.plan(logits.shape[0])
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
            if plan.raw_logprobs is not None and plan.raw_rows is not None and processed is not None:
                processed = torch.where(plan.raw_rows[:, None], plan.raw_logprobs, processed)
        return sampled, processed

    sampler.forward = forward
    sampler.sample = sample


class EnforcedSamplingExtension:
    """Worker-extension methods (mixed into vLLM's Worker), called by name from the engine thread."""

    # The Worker's, once vLLM mixes this class in.
    model_runner: Any
    device: Any

    def install_enforced_sampling(self) -> bool:
        mr = self.model_runner
        if getattr(mr, "_pocserve_enforced_rows", None) is None:
            device = torch.device(self.device)
            rows = EnforcedRows(lambda: mr.input_batch, device, pin_memory=device.type == "cuda")
            install(mr.sampler, rows)
            mr._pocserve_enforced_rows = rows
        return True

    def register_enforced(self, req_id: str, enforced: list[int], wants_raw: bool) -> None:
        self.model_runner._pocserve_enforced_rows.register(req_id, enforced, wants_raw)

    def forget_enforced(self, req_ids: list[str]) -> None:
        self.model_runner._pocserve_enforced_rows.forget(req_ids)
