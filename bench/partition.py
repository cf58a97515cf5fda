"""Why chat slows beside a PoC forward on PoC's share of the SMs: torch alone, no vLLM, one CUDA GPU.

    python -m bench.partition [--curve-sms N ...] [--poc-sms N ...] [--json out.json]

Shared mode runs chat's decode steps on a highest-priority stream and the PoC forward on a green context of
(1 − share) of the SMs (backend/engine/pocworker/streams.py). On an H100 (0.6B shape, 16 streams) chat's TPOT p50
rose 18-31% beside the forward on 88 of 132 SMs, while PoC kept ~0.76x its exclusive rate. This separates the
causes with stand-ins of the 0.6B shape's kernels, each replayed from a CUDA graph:
- chat: one decode step of 16 sequences (28 layers: RMSNorm, QKV, attention over a 256-token cache, O, gate-up,
  SiLU, down; then the LM head and vLLM's random sampling), timed per step with a host sync as the engine waits
  for each step;
- PoC: one 32 × 1024 prefill forward of the same layers (causal attention, no LM head).

Rows:
- each side alone on every SM and on green contexts of fewer (--curve-sms): how its rate follows its SM count
  with nothing beside it;
- chat on every SM at the highest priority beside PoC on a green context of --poc-sms SMs (shared mode's layout),
  chat captured as is or with cuBLAS told to use only the SMs PoC leaves;
- a disjoint split made through the driver API (bench/green_split.py: torch's contexts all start at the first SMs):
  chat alone on the SMs PoC leaves, then beside PoC, and beside loads that stress one thing each (GEMMs, HBM
  copies, tiny kernels) to tell what of PoC's work slows chat on SMs of its own; with balanced work queues too
  where the driver has them (CUDA 13.1).
PoC's rate beside chat is timed on the host over whole forwards, chat stepping throughout. Each row also has the
SM clock and board power nvidia-smi sampled while it ran: a clock that drops slows chat whatever the split.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time

import numpy as np
import torch
import torch.nn.functional as F

from backend.engine.pocworker.streams import cublas_carveout
from bench.green_split import green_split

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
    # vLLM's random sampling: fp32 logits, softmax, exponential noise, argmax (the Gumbel trick).
    probs = (_norm(x) @ weights.lm_head).float().softmax(-1)
    return probs.div_(torch.empty_like(probs).exponential_()).argmax(-1)


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


def capture(fn, stream: torch.cuda.Stream, carve: int = 0) -> torch.cuda.CUDAGraph:
    """fn captured on `stream` (after two eager runs there, which warm cuBLAS's handle for it)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), cublas_carveout(carve):
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


def run_chat(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream, steps: int = 0, until=None) -> list[float]:
    """Seconds per step, each replay waited for on the host (as the engine waits for a step's tokens): `steps`
    steps, or until `until()` is true."""
    times: list[float] = []
    while (until is None and len(times) < steps) or (until is not None and not until()):
        started = time.perf_counter()
        with torch.cuda.stream(stream):
            graph.replay()
        stream.synchronize()
        times.append(time.perf_counter() - started)
    return times


def queue_poc(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream, n: int) -> torch.cuda.Event:
    """n replays queued back to back; the event after the last."""
    with torch.cuda.stream(stream):
        for _ in range(n):
            graph.replay()
        done = torch.cuda.Event()
        done.record()
    return done


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--poc-sms", type=int, nargs="+", default=[88, 96], help="PoC's green contexts beside chat")
    p.add_argument("--curve-sms", type=int, nargs="*", default=[16, 32, 40, 48, 64, 88, 96, 112],
                   help="green contexts each side runs alone on")
    p.add_argument("--steps", type=int, default=400, help="chat steps per row alone")
    p.add_argument("--forwards", type=int, default=16, help="PoC forwards per row")
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
    greens = {}  # SMs -> (context, stream); a context's streams live only as long as it does

    def green_stream(sms: int) -> torch.cuda.Stream:
        if sms not in greens:
            g = GreenContext.create(num_sms=sms, device_id=0)
            greens[sms] = (g, g.Stream())
        return greens[sms][1]

    def chat_fn():
        return chat_step(weights, chat_x, cache)

    def poc_fn():
        return poc_forward(weights, poc_x)

    rows: list[dict] = []

    def record(name: str, clocks: Clocks, chat: list[float] | None = None, poc: float | None = None, **extra):
        row = {"row": name, **extra, "sm_mhz": clocks.sm_mhz, "power_w": clocks.power_w,
               "clock_reasons": clocks.reasons}
        if chat:
            a = np.array(chat[len(chat) // 10:]) * 1000  # the first tenth as warm-up
            row.update(chat_step_p50_ms=float(np.percentile(a, 50)), chat_step_p99_ms=float(np.percentile(a, 99)),
                       chat_steps=len(chat))
        if poc is not None:
            row["poc_seqs_per_s"] = poc
        rows.append(row)
        print(json.dumps(row), flush=True)

    def poc_alone(graph, stream) -> float:
        queue_poc(graph, stream, 2).synchronize()  # warm
        started = time.perf_counter()
        queue_poc(graph, stream, args.forwards).synchronize()
        return args.batch * args.forwards / (time.perf_counter() - started)

    def beside(graph_p, stream_p, graph_c, stream_c, n: int = args.forwards) -> tuple[Clocks, list[float], float]:
        """Chat's steps for as long as n PoC forwards run (after one alone); PoC's sequences/s over them."""
        queue_poc(graph_p, stream_p, 1).synchronize()
        started = time.perf_counter()
        with Clocks() as clocks:
            done = queue_poc(graph_p, stream_p, n)
            times = run_chat(graph_c, stream_c, until=done.query)
        return clocks, times, args.batch * n / (time.perf_counter() - started)

    def load_rows(stream_p, sms: int, graph_c, stream_c) -> None:
        """What of PoC's work slows chat on SMs of its own: chat beside loads that stress one thing each, on
        PoC's SMs for ~2 s: big GEMMs (compute, little memory traffic), copies (HBM bandwidth), and a stream of
        tiny kernels (the work distributor, nothing else)."""
        a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
        big = torch.empty(256 * 2**20, device=device, dtype=torch.bfloat16)
        small = torch.zeros(1024, device=device)

        def compute():
            for _ in range(32):
                a @ a

        def bandwidth():
            for _ in range(16):
                big.mul_(1.0)  # reads and writes 512 MB

        def tiny():
            for _ in range(1000):
                small.add_(1.0)

        for name, fn in (("compute (GEMMs)", compute), ("HBM bandwidth (copies)", bandwidth),
                         ("tiny kernels (dispatch)", tiny)):
            graph = capture(fn, stream_p, carve=total - sms)
            started = time.perf_counter()
            queue_poc(graph, stream_p, 3).synchronize()
            replay_s = (time.perf_counter() - started) / 3
            n = max(3, int(2.0 / replay_s))
            clocks, times, rate = beside(graph, stream_p, graph_c, stream_c, n)
            # beside() counts --batch sequences per replay: the load's time per replay beside chat over alone.
            record(f"chat on the rest beside {name} on {sms} SMs", clocks, times, sms=sms,
                   load_slowdown=round(args.batch / (rate * replay_s), 3))
            del graph

    # Each side alone, on every SM and on fewer.
    chat_stream = torch.cuda.Stream(device, priority=high)
    poc_stream = torch.cuda.Stream(device, priority=low)
    chat_graph = capture(chat_fn, chat_stream)
    poc_graph = capture(poc_fn, poc_stream)
    with Clocks() as clocks:
        rate = poc_alone(poc_graph, poc_stream)
    record("PoC alone", clocks, poc=rate, sms=total)
    poc_base = rate
    with Clocks() as clocks:
        times = run_chat(chat_graph, chat_stream, args.steps)
    record("chat alone", clocks, times, sms=total)
    for sms in args.curve_sms:
        stream = green_stream(sms)
        graph = capture(poc_fn, stream, carve=total - sms)
        with Clocks() as clocks:
            rate = poc_alone(graph, stream)
        record("PoC alone", clocks, poc=rate, sms=sms)
        del graph
        graph = capture(chat_fn, stream)
        with Clocks() as clocks:
            times = run_chat(graph, stream, args.steps)
        record("chat alone", clocks, times, sms=sms)
        del graph

    # Beside: PoC on its green context, chat on every SM (as is, or cuBLAS told PoC's SMs are taken).
    for sms in args.poc_sms:
        stream_p = green_stream(sms)
        graph_p = capture(poc_fn, stream_p, carve=total - sms)
        # (Not chat on a green context of torch's too: each GreenContext.create takes the first SMs of the device,
        # so chat's and PoC's would overlap; the disjoint split is below.)
        chats = {"chat on every SM": (chat_graph, chat_stream),
                 f"chat on every SM, cuBLAS target {total - sms}": (capture(chat_fn, chat_stream, carve=sms),
                                                                    chat_stream)}
        for name, (graph_c, stream_c) in chats.items():
            record(f"{name} beside PoC", *beside(graph_p, stream_p, graph_c, stream_c), sms=sms)

    # Disjoint green contexts: PoC on `sms`, chat on the rest (cuBLAS told so) or on every SM, with shared or
    # balanced work queues.
    for sms in args.poc_sms:
        for balanced in (False, True):
            try:
                stream_p, stream_c, counts, handles = green_split(sms, (low, high), balanced)
            except Exception as e:
                print(f"green_split({sms}, balanced={balanced}): {e}", flush=True)
                continue
            wq = "balanced work queues" if balanced else "shared work queues"
            graph_p = capture(poc_fn, stream_p, carve=total - counts[0])
            graph_c = capture(chat_fn, stream_c, carve=total - counts[1])
            with Clocks() as clocks:
                times = run_chat(graph_c, stream_c, args.steps)
            record(f"chat alone on the rest ({counts[1]}), {wq}", clocks, times, sms=counts[1])
            layouts = {f"chat on the rest ({counts[1]})": (graph_c, stream_c),
                       "chat on every SM": (chat_graph, chat_stream)}
            for name, (g_c, s_c) in layouts.items():
                record(f"{name} beside PoC on a disjoint green context, {wq}", *beside(graph_p, stream_p, g_c, s_c),
                       sms=counts[0])
            if not balanced and sms == args.poc_sms[0]:
                load_rows(stream_p, counts[0], graph_c, stream_c)
            del graph_p, graph_c, handles

    summary = {"device": torch.cuda.get_device_name(device), "total_sms": total, "args": vars(args), "rows": rows}
    chat_base = next(r for r in rows if r["row"] == "chat alone")["chat_step_p50_ms"]
    print("\nrow | SMs | chat step p50/p99 ms (p50 x alone on all) | PoC seqs/s (x alone on all) | SM MHz | W")
    for r in rows:
        c, pc = r.get("chat_step_p50_ms"), r.get("poc_seqs_per_s")
        chat = "" if c is None else f"{c:.3f}/{r['chat_step_p99_ms']:.3f} ({c / chat_base:.2f}x)"
        poc = "" if pc is None else f"{pc:.1f} ({pc / poc_base:.3f})"
        print(f"{r['row']} | {r['sms']} | {chat} | {poc} | {r['sm_mhz']:.0f} | {r['power_w']:.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
