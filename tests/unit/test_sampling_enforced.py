"""Unit tests for sampling/enforced.py: the per-row plan of registered replay requests and the wrappers on a
sampler's forward and sample (a stand-in sampler with vLLM's call shape, CPU tensors; no engine)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from sampling.enforced import EnforcedRows, EnforcedSamplingExtension, install

VOCAB = 6


@dataclass
class InputBatch:
    """The two fields of vLLM's InputBatch the plan reads."""

    req_ids: list[str]
    req_output_token_ids: list[list[int] | None] = field(default_factory=list)


class Sampler:
    """vLLM's Sampler shape: forward runs the logits processors (here: in place) and calls self.sample, which
    returns (sampled ids, logprobs of the processed logits or None)."""

    def forward(self, logits: torch.Tensor, sampling_metadata, *args, **kwargs):
        if sampling_metadata.fail:
            raise RuntimeError("sampler failed")
        logits.mul_(2.0)  # a processor that works in place: raw logprobs must be taken before it
        return self.sample(logits, sampling_metadata)

    def sample(self, logits: torch.Tensor, sampling_metadata):
        processed = logits.log_softmax(dim=-1) if sampling_metadata.max_num_logprobs is not None else None
        return logits.argmax(dim=-1), processed


def _metadata(max_num_logprobs: int | None = 2, fail: bool = False) -> SimpleNamespace:
    return SimpleNamespace(max_num_logprobs=max_num_logprobs, fail=fail)


def _logits(rows: int) -> torch.Tensor:
    """Each row prefers token 5."""
    return torch.arange(VOCAB, dtype=torch.float32).repeat(rows, 1)


@pytest.fixture
def batch() -> InputBatch:
    return InputBatch(["a", "b", "c"], [[], [7, 8], None])


@pytest.fixture
def rows(batch) -> EnforcedRows:
    return EnforcedRows(lambda: batch, torch.device("cpu"), pin_memory=False)


@pytest.fixture
def sampler(rows) -> Sampler:
    s = Sampler()
    install(s, rows)
    return s


# --- EnforcedRows.plan ---

def test_plan_is_none_without_registered_rows_in_the_batch(rows):
    assert rows.plan(3) is None
    rows.register("elsewhere", [1, 2], wants_raw=True)
    assert rows.plan(3) is None


def test_plan_enforces_the_token_at_each_requests_output_length(rows):
    rows.register("b", [1, 2, 3, 4], wants_raw=False)  # two tokens out: the third is next
    rows.register("c", [4, 0], wants_raw=False)  # no output list yet: the first
    plan = rows.plan(3)
    assert plan is not None and plan.raw_rows is None
    assert plan.enforced is not None and plan.enforced.tolist() == [-1, 3, 4]


def test_plan_repeats_the_last_enforced_token_past_the_end(rows, batch):
    rows.register("b", [1, 2], wants_raw=False)
    batch.req_output_token_ids[1] = [1, 2, 5]
    plan = rows.plan(3)
    assert plan is not None and plan.enforced is not None and plan.enforced.tolist() == [-1, 2, -1]


def test_plan_raw_rows_only(rows):
    rows.register("a", [], wants_raw=True)
    plan = rows.plan(3)
    assert plan is not None and plan.enforced is None
    assert plan.raw_rows is not None and plan.raw_rows.tolist() == [True, False, False]


def test_plan_reads_only_the_rows_sampled(rows):
    rows.register("c", [4], wants_raw=True)
    assert rows.plan(2) is None  # c is the third row: not in this call
    plan = rows.plan(3)
    assert plan is not None and plan.raw_rows is not None and plan.raw_rows.tolist() == [False, False, True]


def test_plan_follows_a_rebuilt_input_batch(rows, batch):
    rows.register("a", [3], wants_raw=False)
    batch.req_ids[:] = ["c", "a"]
    batch.req_output_token_ids[:] = [None, []]
    plan = rows.plan(2)
    assert plan is not None and plan.enforced is not None and plan.enforced.tolist() == [-1, 3]


def test_forget_drops_registrations(rows):
    rows.register("a", [1], wants_raw=True)
    rows.register("b", [1], wants_raw=True)
    rows.forget(["a", "b", "never-registered"])
    assert rows.registered == {} and rows.plan(3) is None


# --- the sampler wrappers ---

def test_unregistered_rows_sample_as_without_the_wrappers(sampler):
    sampled, processed = sampler.forward(_logits(3), _metadata())
    assert sampled.tolist() == [5, 5, 5]
    assert torch.equal(processed, (_logits(3) * 2).log_softmax(dim=-1))


def test_enforced_rows_return_the_enforced_token_with_the_models_logprobs(sampler, rows):
    rows.register("b", [9, 9, 1], wants_raw=False)
    sampled, processed = sampler.forward(_logits(3), _metadata())
    assert sampled.tolist() == [5, 1, 5]
    assert torch.equal(processed, (_logits(3) * 2).log_softmax(dim=-1))  # the distribution itself is untouched


def test_raw_rows_get_the_logprobs_before_any_processor(sampler, rows):
    rows.register("c", [], wants_raw=True)
    _, processed = sampler.forward(_logits(3), _metadata())
    processed_rows = (_logits(3) * 2).log_softmax(dim=-1)
    assert torch.equal(processed[:2], processed_rows[:2])
    assert torch.equal(processed[2], _logits(1)[0].log_softmax(dim=-1))


def test_raw_rows_without_logprobs_asked_take_nothing(sampler, rows):
    rows.register("a", [2], wants_raw=True)
    sampled, processed = sampler.forward(_logits(3), _metadata(max_num_logprobs=None))
    assert sampled.tolist() == [2, 5, 5] and processed is None


def test_a_failed_forward_leaves_no_plan_behind(sampler, rows):
    rows.register("a", [2], wants_raw=False)
    with pytest.raises(RuntimeError):
        sampler.forward(_logits(3), _metadata(fail=True))
    rows.forget(["a"])
    assert sampler.sample(_logits(3), _metadata())[0].tolist() == [5, 5, 5]  # no stale enforced row


# --- the worker extension ---

class Worker(EnforcedSamplingExtension):
    def __init__(self) -> None:
        self.device = "cpu"
        self.model_runner = SimpleNamespace(sampler=Sampler(), input_batch=InputBatch(["r1"], [[]]))


def test_extension_installs_once_and_registers_by_name():
    worker = Worker()
    assert worker.install_enforced_sampling() is True
    rows = worker.model_runner._pocserve_enforced_rows
    forward = worker.model_runner.sampler.forward
    assert worker.install_enforced_sampling() is True
    assert worker.model_runner._pocserve_enforced_rows is rows and worker.model_runner.sampler.forward is forward
    assert rows.device == torch.device("cpu") and rows.pin is False
    worker.register_enforced("r1", [3], True)
    assert worker.model_runner.sampler.forward(_logits(1), _metadata())[0].tolist() == [3]
    worker.forget_enforced(["r1"])
    assert rows.registered == {}
