"""A batched causal prefill of given input embeddings through vLLM's model runner, on leased KV blocks.

Runs inside the worker (see extension.py). Follows vLLM's own metadata construction (gpu_model_runner
_build_attention_metadata), with positions 0..L-1 for every sequence and no previously computed tokens.
Under pipeline parallel it runs on every stage as vLLM's Worker.execute_model does: the first stage takes the
input embeddings, the others receive the previous stage's IntermediateTensors, every stage but the last sends
its own to the next, and only the last stage has the final hidden state.
"""

from __future__ import annotations

import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from vllm import ir
from vllm.distributed import get_pp_group, get_tp_group
from vllm.forward_context import set_forward_context
from vllm.sequence import IntermediateTensors
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.kv_cache_interface import AttentionSpec

from backend.engine import compat
from backend.engine.pocworker.hooks import Reflections, is_layerwise, own_layers, reflection_hooks
from poc.rng import host_to_device

# vLLM dispatches RMSNorm through IR ops whose default priority is "native" when the engine compiles with
# inductor, so an eager forward (skip_compiled) would run the unfused PyTorch norm: on an H100 that was about
# half of the whole PoC forward. The fork ran its norms with vLLM's CUDA kernels (its custom_ops default "all"),
# so the PoC forward asks for them; where they do not exist (the CPU build) dispatch falls back to native.
EAGER_NORM_PRIORITY = ["vllm_c", "native"]


@contextmanager
def eager_norm_kernels():
    with ExitStack() as stack:
        for op in (ir.ops.rms_norm, ir.ops.fused_add_rms_norm):
            stack.enter_context(op.set_priority(EAGER_NORM_PRIORITY))
        yield


def is_first_stage() -> bool:
    """This worker is on the first pipeline stage (the one that takes input embeddings)."""
    return bool(get_pp_group().is_first_rank)


def prefill_last_hidden(mr, cfg, model, block_ids: list[int], x: torch.Tensor) -> torch.Tensor:
    """x: [B, L, H] inputs in the model dtype. Returns the final-norm hidden state at position L-1, float32.

    One stage only (no pipeline parallel); `pipeline_last_hidden` is the general form."""
    hidden = pipeline_last_hidden(mr, cfg, model, block_ids, x.shape[0], x.shape[1], x)
    assert hidden is not None, "a single stage is the last stage"
    return hidden


def pipeline_last_hidden(mr, cfg, model, block_ids: list[int], num_seqs: int, seq_len: int,
                         x: torch.Tensor | None) -> torch.Tensor | None:
    """This pipeline stage's part of the prefill of `num_seqs` sequences of `seq_len` tokens.

    x: [B, L, H] inputs in the model dtype on the first stage (None on the others, which receive the previous
    stage's output). Returns the final-norm hidden state at position L-1 as float32 [B, H] on the last stage,
    None on the others (after sending their output on)."""
    pp = get_pp_group()
    if pp.is_first_rank and x is None:
        raise ValueError("the first pipeline stage needs the input embeddings")
    hidden_size = int(cfg.model_config.get_hidden_size())
    p = prefill(mr, cfg, block_ids, num_seqs, seq_len)
    embeds, intermediate = None, None
    if pp.is_first_rank:
        assert x is not None
        embeds = x.reshape(num_seqs * seq_len, hidden_size)
    else:
        # The same pairing of calls as vLLM's worker (TP ranks each send a slice, the receivers all-gather),
        # so a stage's PoC forward can follow a chat step still in flight on the same links, in order.
        intermediate = IntermediateTensors(pp.recv_tensor_dict(all_gather_group=get_tp_group()))
    with _forward_context(cfg, p.attn_metadata, p.slot_mappings, num_seqs * seq_len):
        out = model(input_ids=None, positions=p.positions, intermediate_tensors=intermediate, inputs_embeds=embeds)
    if not pp.is_last_rank:
        pp.send_tensor_dict(out.tensors, all_gather_group=get_tp_group())
        return None
    return out.view(num_seqs, seq_len, hidden_size)[:, -1].float()


class LayerwiseForward:
    """pipeline_last_hidden's prefill on one stage, queued a few decoder layers per call (`advance`), so that
    the thread queueing it can step chat in between: queueing the 0.6B shape's whole eager forward took the
    engine thread 20-22 ms on an H100 host, chat's GPU idled behind it. The same ops in the same order as
    `model(...)` with reflection hooks (hooks.py Reflections), so the result is the same bit for bit. Models
    outside hooks.LAYERWISE_MODELS run whole at the first call."""

    def __init__(self, mr, cfg, model, block_ids: list[int], x: torch.Tensor, vectors: torch.Tensor,
                 metadata: Prefill | None = None) -> None:
        self._cfg, self._model, self._vectors = cfg, model, vectors
        self._reflections = Reflections(model, vectors)
        self.num_seqs, self.seq_len, hidden_size = x.shape
        self.prefill = metadata or prefill(mr, cfg, block_ids, self.num_seqs, self.seq_len)
        self._hidden: Any = x.reshape(self.num_seqs * self.seq_len, hidden_size)
        self._residual: Any = None
        self._stack: Any = getattr(model, "model", None)
        self._next, self._end = (own_layers(model).start, own_layers(model).stop)
        self.last_hidden: torch.Tensor | None = None  # [B, H] float32 once every layer is queued

    @property
    def is_queued(self) -> bool:
        return self.last_hidden is not None

    @property
    def layers_left(self) -> int:
        """Decoder layers not queued yet."""
        return self._end - self._next

    def advance(self, budget_s: float, max_layers: int | None = None) -> bool:
        """Queues decoder layers within `budget_s` of host time (at least one) and at most `max_layers` (0: none):
        the next layer is left for the next call when, taking as long as the last, it would end past the budget (on
        the CPU engine a layer's host time is its compute, and a chunk that overran by a layer doubled a waiting
        request's wait). True once all are queued."""
        if self.is_queued:
            return True
        if max_layers is not None and max_layers <= 0:
            return False
        last = self._end if max_layers is None else min(self._end, self._next + max_layers)
        started = time.perf_counter()
        with _forward_context(self._cfg, self.prefill.attn_metadata, self.prefill.slot_mappings, self._hidden.shape[0]):
            if not is_layerwise(self._stack):
                self._whole()
                return True
            layers = self._stack.layers
            with self._reflections.applied():
                while self._next < last:
                    i, layer_started = self._next, time.perf_counter()
                    out = layers[i](positions=self.prefill.positions, hidden_states=self._hidden,
                                    residual=self._residual)
                    self._hidden, self._residual = self._reflections.output(i, out)
                    self._next += 1
                    now = time.perf_counter()
                    if now - started + (now - layer_started) > budget_s:
                        break
                if self._next == self._end:
                    hidden, _ = self._stack.norm(self._hidden, self._residual)
                    self._reflections.check_applied()
                    self._done(hidden)
        return self.is_queued

    def record_stream(self, stream) -> None:
        """Its remaining layers go on `stream`: the activations made on the stream it ran on so far must not be
        reused there before `stream`'s work reads them (torch's caching allocator frees per stream)."""
        for t in (self._hidden, self._residual):
            if t is not None:
                t.record_stream(stream)

    def _whole(self) -> None:
        with reflection_hooks(self._model, self._vectors):
            self._done(self._model(input_ids=None, positions=self.prefill.positions, intermediate_tensors=None,
                                   inputs_embeds=self._hidden))
        self._next = self._end

    def _done(self, hidden: torch.Tensor) -> None:
        self.last_hidden = hidden.view(self.num_seqs, self.seq_len, -1)[:, -1].float()
        self._hidden = self._residual = None


@contextmanager
def _forward_context(cfg, attn_metadata: dict, slot_mappings: dict, num_tokens: int):
    with set_forward_context(attn_metadata, cfg, num_tokens=num_tokens, slot_mapping=slot_mappings,
                             skip_compiled=True), eager_norm_kernels():
        yield


@dataclass
class Prefill:
    """What a causal prefill of `num_seqs` sequences of `seq_len` tokens from position 0 reads besides its inputs:
    positions, the attention metadata and slot mapping of every layer, and the device block table and slot map of
    each KV-cache group that those hold (a captured forward is pointed at other blocks by copying into them)."""

    positions: torch.Tensor
    attn_metadata: dict
    slot_mappings: dict
    tables: list[tuple[torch.Tensor, torch.Tensor]]
    built: list  # each attention group's built metadata


def layout_problem(mr, cfg) -> str | None:
    """Why `block_tables` cannot lay a prefill out on this model's KV cache, or None if it can. It gives every group
    the same leased block ids, each a page of cache_config.block_size token positions: a group of recurrent state
    (Mamba, GDN, KDA: one state per sequence, not per token) or of another page size (DeepSeek-V4's compressor, in
    later vLLM versions) would be handed slots outside its own layout."""
    for gid, group in enumerate(mr.kv_cache_config.kv_cache_groups):
        spec = group.kv_cache_spec
        name = type(spec).__name__
        if not isinstance(spec, AttentionSpec):
            return f"KV-cache group {gid} ({name}) holds recurrent state, not per-token attention pages"
        if spec.block_size != cfg.cache_config.block_size:
            return (f"KV-cache group {gid} ({name}) pages {spec.block_size} tokens, not the cache's "
                    f"{cfg.cache_config.block_size}")
    return None


def block_tables(mr, cfg, block_ids: list[int], num_seqs: int, seq_len: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Host (block table int32 [B, blocks], slot map int64 [B·L]) of each KV-cache group, in its kernel block size,
    for a prefill on the leased blocks."""
    block_size = cfg.cache_config.block_size
    blocks_per_seq = -(-seq_len // block_size)
    if len(block_ids) != num_seqs * blocks_per_seq:
        raise ValueError(f"{len(block_ids)} leased blocks for {num_seqs}x{blocks_per_seq}")
    ids = torch.tensor(block_ids, dtype=torch.int64).view(num_seqs, blocks_per_seq)
    pos = torch.arange(seq_len)
    tables = []
    for gid in range(len(mr.kv_cache_config.kv_cache_groups)):
        kbs = compat.kernel_block_size(mr, gid)
        per = block_size // kbs
        kernel_blocks = (ids[:, :, None] * per + torch.arange(per)).view(num_seqs, blocks_per_seq * per)
        slots = (kernel_blocks.gather(1, (pos // kbs).expand(num_seqs, seq_len)) * kbs + pos % kbs).reshape(-1)
        tables.append((kernel_blocks.to(torch.int32), slots))
    return tables


def prefill(mr, cfg, block_ids: list[int], num_seqs: int, seq_len: int) -> Prefill:
    """The prefill's positions and metadata on the leased blocks, built fresh (see extension.py)."""
    device = mr.device
    pos = torch.arange(seq_len)
    qsl = torch.arange(num_seqs + 1, dtype=torch.int32) * seq_len
    seq_lens = torch.full((num_seqs,), seq_len, dtype=torch.int32)
    positions = host_to_device(pos.repeat(num_seqs), device)
    attn_metadata, slot_mappings, tables, built_all = {}, {}, [], []
    groups = mr.kv_cache_config.kv_cache_groups
    for gid, (host_table, host_slots) in enumerate(block_tables(mr, cfg, block_ids, num_seqs, seq_len)):
        table, slots = host_to_device(host_table, device), host_to_device(host_slots, device)
        tables.append((table, slots))
        common = CommonAttentionMetadata(
            query_start_loc=host_to_device(qsl, device), query_start_loc_cpu=qsl,
            seq_lens=host_to_device(seq_lens, device), num_reqs=num_seqs, num_actual_tokens=num_seqs * seq_len,
            max_query_len=seq_len, max_seq_len=seq_len, block_table_tensor=table, slot_mapping=slots, causal=True,
            positions=positions, is_prefilling=torch.ones(num_seqs, dtype=torch.bool, device=device),
            seq_lens_cpu_upper_bound=seq_lens, _seq_lens_cpu=seq_lens,
            _num_computed_tokens_cpu=torch.zeros(num_seqs, dtype=torch.int32))
        for attn_group in mr.attn_groups[gid]:
            built = attn_group.get_metadata_builder(0).build(
                common_prefix_len=0, common_attn_metadata=common, fast_build=True)
            built_all.append(built)
            attn_metadata.update(dict.fromkeys(attn_group.layer_names, built))
        slot_mappings.update(dict.fromkeys(groups[gid].layer_names, slots))
    return Prefill(positions, attn_metadata, slot_mappings, tables, built_all)
