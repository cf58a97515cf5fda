"""Why chat slows beside a PoC forward on PoC's share of the SMs: torch alone, no vLLM, one CUDA GPU.

    python -m bench.partition [--json out.json]

Shared mode runs chat's decode steps on a highest-priority stream and the PoC forward on a green context of
(1 − share) of the SMs (poc/streams.py). On an H100 (0.6B shape, 16 streams) chat's TPOT p50 rose ~27% beside the
forward while PoC kept ~0.76x its exclusive rate on 88 of 132 SMs. This separates the candidate causes with
stand-ins of the 0.6B shape's kernels, each replayed from a CUDA graph:
- chat: one decode step of 16 sequences (28 layers: RMSNorm, QKV, attention over a 256-token cache, O, gate-up,
  SiLU, down; then the LM head and an argmax), timed per step with a host sync as the engine waits for each step;
- PoC: one 32 × 1024 prefill forward of the same layers (causal attention, no LM head).

Rows: chat alone on every SM; chat alone in a green context of the SMs PoC leaves it (SM count alone, no
interference); chat beside PoC on 88 and 96 SMs; chat captured with cuBLAS told to use only the SMs PoC leaves
(the SM-count target baked into its graph); PoC alone on every SM and on its share. For each row the SM clock and
board power nvidia-smi sampled while it ran: a clock that drops beside PoC slows every chat kernel whatever the
partition (the power limit, not the SMs).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS, VOCAB = 1024, 16, 8, 128, 3072, 28, 151936


class Weights:
    def __init__(self, device: torch.device) -> None:
        def w(k: int, n: int) -> torch.Tensor:
            return torch.randn(k, n, device=device, dtype=torch.bfloat16) / k**0.5

        q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
        self.layers = [(w(HIDDEN, q + 2 * kv), w(q, HIDDEN), w(HIDDEN, 2 * INTER), w(INTER, HIDDEN))
                       for _ in range(LAYERS)]
        self.lm_head = w(HIDDEN, VOCAB)


def _norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)


def _layer(x: torch.Tensor, wts, attend) -> torch.Tensor:
    wqkv, wo, wgu, wd = wts
    qkv = _norm(x) @ wqkv
    x = x + attend(qkv) @ wo
    gate, up = (_norm(x) @ wgu).chunk(2, dim=-1)
    return x + (F.silu(gate) * up) @ wd


def chat_step(weights: Weights, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """One decode step of x.shape[0] sequences against a cache of [seqs, kv_heads, ctx, head_dim]."""
    k_cache, v_cache = cache
    n = x.shape[0]

    def attend(qkv: torch.Tensor) -> torch.Tensor:
        q = qkv[:, : HEADS * HEAD_DIM].view(n, HEADS, 1, HEAD_DIM)
        out = F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)
        return out.reshape(n, HEADS * HEAD_DIM)

    for wts in weights.layers:
        x = _layer(x, wts, attend)
    return (_norm(x) @ weights.lm_head).argmax(-1)


def poc_forward(weights: Weights, x: torch.Tensor) -> torch.Tensor:
    """One prefill forward of x [seqs, seq_len, hidden] with causal attention; the last hidden state."""
    b, length, _ = x.shape
    q_dim, kv_dim = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM

    def attend(qkv: torch.Tensor) -> torch.Tensor:
        q, k, v = qkv.split([q_dim, kv_dim, kv_dim], dim=-1)
        q = q.view(b, length, HEADS, HEAD_DIM).transpose(1, 2)
        k = k.view(b, length, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = v.view(b, length, KV_HEADS, HEAD_DIM).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return out.transpose(1, 2).reshape(b, length, q_dim)

    for wts in weights.layers:
        x = _layer(x, wts, attend)
    return x[:, -1]


@contextmanager
def carveout(sms: int):
    """cuBLAS GEMMs issued (or captured) inside leave `sms` SMs free."""
    previous = torch._C._get_sm_carveout_experimental()
    torch._C._set_sm_carveout_experimental(sms or None)
    try:
        yield
    finally:
        torch._C._set_sm_carveout_experimental(previous)


def capture(fn, stream: torch.cuda.Stream, carve: int = 0) -> torch.cuda.CUDAGraph:
    """fn captured on `stream` (after two eager runs there, which warm cuBLAS's handle for it)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), carveout(carve):
        for _ in range(2):
            fn()
        stream.synchronize()
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            fn()
        finally:
            graph.capture_end()
    stream.synchronize()
    return graph


class Clocks:
    """nvidia-smi's SM clock (MHz) and board power (W), sampled every 50 ms while inside."""

    query = ""

    def __enter__(self):
        if not Clocks.query:  # the reasons field's name changed between drivers; a bad field fails the whole query
            for query in ("clocks.sm,power.draw,clocks_event_reasons.active",
                          "clocks.sm,power.draw,clocks_throttle_reasons.active", "clocks.sm,power.draw"):
                ok = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                                    capture_output=True).returncode == 0
                if ok:
                    Clocks.query = query
                    break
        self._proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={Clocks.query}", "--format=csv,noheader,nounits",
                                       "-lms", "50"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc) -> None:
        self._proc.terminate()
        out, _ = self._proc.communicate(timeout=10)
        rows = [line.split(",") for line in out.strip().splitlines()]
        rows = [r for r in rows if len(r) >= 2 and r[0].strip().isdigit()]
        self.sm_mhz = float(np.median([float(r[0]) for r in rows])) if rows else float("nan")
        self.power_w = float(np.median([float(r[1]) for r in rows])) if rows else float("nan")
        self.reasons = sorted({r[2].strip() for r in rows if len(r) > 2})


def run_chat(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream, steps: int) -> list[float]:
    """Seconds per step, each replay waited for on the host (as the engine waits for a step's tokens)."""
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        with torch.cuda.stream(stream):
            graph.replay()
        stream.synchronize()
        times.append(time.perf_counter() - started)
    return times


def queue_poc(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream, n: int) -> list[torch.cuda.Event]:
    """n replays queued back to back; an event after each."""
    ends = []
    with torch.cuda.stream(stream):
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        ends.append(start)
        for _ in range(n):
            graph.replay()
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            ends.append(e)
    return ends


def poc_rate(events: list[torch.cuda.Event], seqs: int, window: tuple[float, float] | None = None) -> float:
    """Sequences per second over the replays that ended inside `window` (ms from the first event), or all."""
    torch.cuda.synchronize()
    ends = [events[0].elapsed_time(e) for e in events[1:]]
    if window is None:
        return seqs * len(ends) / (ends[-1] / 1000)
    lo, hi = window
    inside = [t for t in ends if lo <= t <= hi]
    if len(inside) < 2:
        return float("nan")
    return seqs * (len(inside) - 1) / ((inside[-1] - inside[0]) / 1000)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--poc-sms", type=int, nargs="+", default=[88, 96])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--json")
    args = p.parse_args()

    from torch.cuda.green_contexts import GreenContext

    device = torch.device("cuda", 0)
    torch.manual_seed(0)
    total = torch.cuda.get_device_properties(device).multi_processor_count
    low, high = torch.cuda.Stream.priority_range()
    weights = Weights(device)
    chat_x = torch.randn(args.streams, HIDDEN, device=device, dtype=torch.bfloat16)
    cache = tuple(torch.randn(args.streams, KV_HEADS, args.ctx, HEAD_DIM, device=device, dtype=torch.bfloat16)
                  for _ in range(2))
    poc_x = torch.randn(args.batch, args.seq_len, HIDDEN, device=device, dtype=torch.bfloat16)
    chat_stream = torch.cuda.Stream(device, priority=high)
    poc_all = torch.cuda.Stream(device, priority=low)
    greens = {sms: GreenContext.create(num_sms=sms, device_id=0) for sms in args.poc_sms}
    poc_streams = {sms: g.Stream() for sms, g in greens.items()}
    chat_leftover = total - max(args.poc_sms)
    chat_sms = (chat_leftover // 8) * 8
    chat_green = GreenContext.create(num_sms=chat_sms, device_id=0)
    chat_green_stream = chat_green.Stream()

    def chat_fn():
        return chat_step(weights, chat_x, cache)

    def poc_fn():
        return poc_forward(weights, poc_x)

    chat_graphs = {"all SMs": (capture(chat_fn, chat_stream), chat_stream)}
    for sms in args.poc_sms:
        chat_graphs[f"cuBLAS target {total - sms}"] = (capture(chat_fn, chat_stream, carve=sms), chat_stream)
    chat_graphs[f"green {chat_sms}"] = (capture(chat_fn, chat_green_stream), chat_green_stream)
    poc_graphs = {"all": (capture(poc_fn, poc_all), poc_all)}
    for sms in args.poc_sms:
        poc_graphs[sms] = (capture(poc_fn, poc_streams[sms], carve=total - sms), poc_streams[sms])

    rows: list[dict] = []

    def record(name: str, chat: list[float] | None, poc: float | None, clocks: Clocks) -> None:
        row = {"row": name, "sm_mhz": clocks.sm_mhz, "power_w": clocks.power_w, "clock_reasons": clocks.reasons}
        if chat is not None:
            a = np.array(chat[len(chat) // 10:]) * 1000  # the first tenth as warm-up
            row.update(chat_step_p50_ms=float(np.percentile(a, 50)), chat_step_p99_ms=float(np.percentile(a, 99)))
        if poc is not None:
            row["poc_seqs_per_s"] = poc
        rows.append(row)
        print(json.dumps(row), flush=True)

    # PoC alone: its rate on every SM and on each share.
    poc_alone = {}
    for key, (graph, stream) in poc_graphs.items():
        with Clocks() as clocks:
            events = queue_poc(graph, stream, 20)
            poc_alone[key] = poc_rate(events, args.batch)
        record(f"PoC alone on {key} SMs", None, poc_alone[key], clocks)
    per_forward_s = args.batch / poc_alone["all"]

    # Chat alone, each capture.
    chat_alone_s = {}
    for name, (graph, stream) in chat_graphs.items():
        with Clocks() as clocks:
            times = run_chat(graph, stream, args.steps)
        chat_alone_s[name] = sum(times)
        record(f"chat alone, {name}", times, None, clocks)

    # Chat beside PoC on each share: PoC queued for longer than chat's steps take, chat's window timed by events.
    for sms in args.poc_sms:
        graph_p, stream_p = poc_graphs[sms]
        for name, (graph_c, stream_c) in chat_graphs.items():
            if name.startswith("green") and chat_sms + sms > total:
                continue
            # Queued for three times chat's steps alone (chat slows beside it) and one forward before them.
            events = queue_poc(graph_p, stream_p, max(10, int(3 * chat_alone_s[name] / per_forward_s) + 2))
            time.sleep(per_forward_s)  # PoC running before chat's first step
            with Clocks() as clocks:
                mark0 = torch.cuda.Event(enable_timing=True)
                with torch.cuda.stream(stream_c):
                    mark0.record()
                times = run_chat(graph_c, stream_c, args.steps)
                mark1 = torch.cuda.Event(enable_timing=True)
                with torch.cuda.stream(stream_c):
                    mark1.record()
            torch.cuda.synchronize()
            window = (events[0].elapsed_time(mark0), events[0].elapsed_time(mark1))
            rate = poc_rate(events, args.batch, window)
            last_end = events[0].elapsed_time(events[-1])
            note = "" if last_end > window[1] else " (PoC ended before chat: rate unreliable)"
            record(f"chat {name} beside PoC on {sms} SMs{note}", times, rate, clocks)

    summary = {"device": torch.cuda.get_device_name(device), "total_sms": total, "chat_green_sms": chat_sms,
               "args": vars(args), "rows": rows}
    chat_base = next(r for r in rows if r["row"] == "chat alone, all SMs")["chat_step_p50_ms"]
    print("\nrow | chat step p50 ms (x alone) | PoC seqs/s (x alone on all) | SM MHz | W")
    for r in rows:
        c, pc = r.get("chat_step_p50_ms"), r.get("poc_seqs_per_s")
        chat = "" if c is None else f"{c:.3f} ({c / chat_base:.2f}x)"
        poc = "" if pc is None else f"{pc:.1f} ({pc / poc_alone['all']:.3f})"
        print(f"{r['row']} | {chat} | {poc} | {r['sm_mhz']:.0f} | {r['power_w']:.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
