"""PoC artifact throughput through the served vLLM model vs the bare vLLM forward, measured in one run.

    python -m bench.poc_forward --shape qwen3-0.6b --seq-lens 256 1024 --batches 32 64     (GPU)
    python -m bench.poc_forward --seq-lens 64 --batches 8                                   (CPU, tiny)
    python -m bench.poc_forward --shape qwen3-235b-a22b --num-layers 94 --quant fp8 --config-only \
        --model-dir models/q235-94l --engine-arg=--tensor-parallel-size=4 --gpu-memory-utilization 0.9  (full size)

"PoC" is one forward at a time as `PocRunner.run` takes it (engine thread → leased KV blocks → worker: seeded
inputs, per-layer reflections, final-norm hidden, pick/rotate/encode on the device, a sync at each end): what a
validation job outside a round runs. "Round" is what an exclusive round runs: forwards launched whole and back to
back (`PocRunner.launch`, two in flight), the oldest collected while the next runs; on one GPU on PoC's own
stream, replayed from CUDA graphs after a shape's first two, elsewhere (--poc-overlap off, TP > 1) pipelined on
chat's stream, eager. "Bare" is the same batched prefill on leased blocks with inputs made once and no reflections,
RNG or post-processing. The three are timed in alternating rounds and the medians reported: on an H100 the bare
rate alone moved by 10% between two runs of one lease, more than the PoC's overhead. Under tensor parallelism all
three run on every rank (collective_rpc). "Peak" is the most device memory torch held during one PoC batch above
what it held before it (the largest rank's), beside vLLM's own profile of a step of max_num_batched_tokens. MFU
counts 2 × (q, k, v, o, MLP weights) per token plus causal attention, against the matmul peak measured here in
the weights' type: FP8's for an FP8 checkpoint (its GEMMs run in FP8; against bf16's, DeepGEMM read 1.05), else bf16's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from backend.engine import compat
from bench.kernel_paths import dump_artifacts, peak_fp8_tflops
from poc.spec import ArtifactJob, PocSpec


def _bare(worker, block_ids: list[int], num_seqs: int, seq_len: int, iters: int) -> float:
    """Runs inside the worker (in-process executor): the forward alone, seconds per iteration."""
    import torch

    from backend.engine.pocworker.forward import prefill_last_hidden
    mr, cfg = worker.model_runner, worker.vllm_config
    device = torch.device(worker.device) if not isinstance(worker.device, torch.device) else worker.device
    gen = torch.Generator(device=device).manual_seed(0)  # the same inputs on every tensor-parallel rank
    x = torch.randn(num_seqs, seq_len, cfg.model_config.get_hidden_size(), device=device,
                    dtype=cfg.model_config.dtype, generator=gen)
    model = mr.get_model()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with torch.inference_mode():
        for _ in range(3):
            prefill_last_hidden(mr, cfg, model, block_ids, x)
        sync()
        started = time.perf_counter()
        for _ in range(iters):
            prefill_last_hidden(mr, cfg, model, block_ids, x)
        sync()
    return (time.perf_counter() - started) / iters


def _round_path_s(runner, job: ArtifactJob, batch: int, iters: int, first_nonce: int) -> float:
    """Seconds per forward of `iters` forwards launched as an exclusive round launches them (backend/core/policy.py,
    PocLaunch / PocCollect, and choose_overlapped while chat is gated): a new one whenever a slot is free, else the
    oldest collected."""
    launched = done = 0
    started = time.perf_counter()
    while done < iters:
        if launched < iters and runner.can_launch:
            nonces = [first_nonce + launched * batch + k for k in range(batch)]
            assert runner.launch(job, nonces, False, float("inf"), pipelined=runner.pipelines) == batch
            launched += 1
        else:
            assert runner.poll(wait=True) is not None
            done += 1
    return (time.perf_counter() - started) / iters


def _round_path(runner) -> str:
    """How the round path launches on this engine (PocRunner's flags)."""
    if runner.overlaps:
        return "PoC's stream, graphs where capturable"
    return "pipelined on chat's stream" if runner.pipelines else "one at a time"


def _parts(worker, block_ids: list[int], num_seqs: int, seq_len: int, iters: int) -> dict[str, float]:
    """Milliseconds per batch of each PoC stage, timed alone in the worker: where the PoC overhead goes."""
    import torch

    from backend.engine.pocworker.forward import prefill_last_hidden
    from backend.engine.pocworker.hooks import decoder_layers, reflection_hooks
    from poc.artifacts import compute_artifacts
    from poc.rng import input_embeddings
    mr, cfg = worker.model_runner, worker.vllm_config
    device = torch.device(worker.device) if not isinstance(worker.device, torch.device) else worker.device
    model, hidden = mr.get_model(), cfg.model_config.get_hidden_size()
    nonces = list(range(num_seqs))
    vectors = worker._householder("BENCH_BLOCK", len(decoder_layers(model)), hidden, device)

    def rng():
        return input_embeddings("BENCH_BLOCK", "bench_key", nonces, seq_len, hidden, device, cfg.model_config.dtype)

    x = rng()

    def hooked():
        with reflection_hooks(model, vectors):
            return prefill_last_hidden(mr, cfg, model, block_ids, x)

    last = hooked()
    stages = {"inputs": rng, "forward": lambda: prefill_last_hidden(mr, cfg, model, block_ids, x),
              "forward+reflections": hooked,
              "artifacts": lambda: compute_artifacts(last, "BENCH_BLOCK", "bench_key", nonces, 12)}
    out = {}
    with torch.inference_mode():
        for name, fn in stages.items():
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started, enqueued = time.perf_counter(), 0.0
            for _ in range(iters):
                fn()
                enqueued = time.perf_counter()  # host time to launch (the device may still be working)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            out[name] = (time.perf_counter() - started) / iters * 1e3
            out[name + " (host)"] = (enqueued - started) / iters * 1e3
    return out


def _memory_mark(worker) -> int:
    """Resets the device's peak counter; bytes allocated now (0 off CUDA)."""
    import torch
    if not torch.cuda.is_available():
        return 0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return int(torch.cuda.memory_allocated())


def _memory_peak(worker) -> dict[str, int]:
    """Peak bytes allocated since the mark, and what the allocator reserves and the device has free now."""
    import torch
    if not torch.cuda.is_available():
        return {"peak": 0, "reserved": 0, "free": 0}
    torch.cuda.synchronize()
    return {"peak": int(torch.cuda.max_memory_allocated()), "reserved": int(torch.cuda.memory_reserved()),
            "free": int(torch.cuda.mem_get_info()[0])}


def _poc_peak_gib(llm, runner, job: ArtifactJob, nonces: list[int]) -> dict[str, float]:
    """One PoC batch's own device memory: its peak above the allocation before it, the largest rank's, GiB."""
    before = llm.collective_rpc(_memory_mark)
    runner.run(job, nonces)
    after = llm.collective_rpc(_memory_peak)
    gib = 1 << 30
    return {"poc_peak_gib": max(a["peak"] - b for a, b in zip(after, before, strict=True)) / gib,
            "reserved_gib": max(a["reserved"] for a in after) / gib,
            "free_gib": min(a["free"] for a in after) / gib}


def _describe(worker) -> dict:
    """What the worker runs: attention backends, dtype, compilation mode (explains MFU differences)."""
    mr, cfg = worker.model_runner, worker.vllm_config
    backends = sorted({type(g.backend).__name__ if not isinstance(g.backend, type) else g.backend.__name__
                       for groups in mr.attn_groups for g in groups})
    comp = cfg.compilation_config
    return {"attention": backends, "dtype": str(cfg.model_config.dtype),
            "custom_ops": list(comp.custom_ops), "mode": str(getattr(comp, "mode", getattr(comp, "level", "")))}


def _profile_table(fn, rows: int = 30) -> str:
    """Device-time table of fn() under torch.profiler (the executor is in-process, so kernels are seen)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        fn()
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows)


def _peak_tflops(worker) -> float:
    import torch
    device = torch.device(worker.device) if not isinstance(worker.device, torch.device) else worker.device
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    iters = 20 if device.type == "cuda" else 3
    started = time.perf_counter()
    for _ in range(iters):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return 2 * n**3 * iters / (time.perf_counter() - started) / 1e12


def flops_per_seq(cfg, seq_len: int) -> float:
    h, layers = cfg.hidden_size, cfg.num_hidden_layers
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or h // heads
    linear = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2 + 3 * h * cfg.intermediate_size
    attention = 2 * seq_len * seq_len * heads * head_dim  # QK^T and AV, causal half of 2·2·L²·d
    return layers * (2 * linear * seq_len + attention)


@contextmanager
def _leased(runner, pool, num_blocks: int) -> Iterator[list[int]]:
    """Block ids for a forward outside the runner (bare, stages), after the runner's own held lease went back
    (as the engine returns it before a step)."""
    runner.release()
    blocks = pool.get_new_blocks(num_blocks)
    try:
        yield [b.block_id for b in blocks]
    finally:
        pool.free_blocks(blocks)


def _write_profiles(out: Path, llm, runner, pool, job: ArtifactJob, seq_len: int, batch: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    nonces = list(range(batch))
    poc = _profile_table(lambda: [runner.run(job, nonces) for _ in range(3)])
    with _leased(runner, pool, batch * runner.blocks_per_seq(seq_len)) as ids:
        bare = _profile_table(lambda: llm.collective_rpc(_bare, args=(ids, batch, seq_len, 3)))
    (out / f"profile_L{seq_len}_B{batch}.txt").write_text(f"=== PoC x3\n{poc}\n\n=== bare x3 (+1 warm-up)\n{bare}\n")


def _write_host_profile(out: Path, runner, job: ArtifactJob, batch: int, iters: int, seq_len: int) -> None:
    """cProfile of the engine thread's host work in `iters` forwards of the round path (in-process executor: the
    worker's code runs on this thread too): where the host time goes when the host, not the device, is the limit."""
    import cProfile
    import io
    import pstats
    profiler = cProfile.Profile()
    profiler.enable()
    seconds = _round_path_s(runner, job, batch, iters, 10**9)
    profiler.disable()
    text = io.StringIO()
    text.write(f"round path, {iters} forwards of {batch} x {seq_len}: {seconds * 1e3:.2f} ms each under cProfile\n")
    for key in ("tottime", "cumtime"):
        pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(45)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"host_L{seq_len}_B{batch}.txt").write_text(text.getvalue())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from backend.tools.modelgen import QUANTS, SHAPES
    p.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    p.add_argument("--num-layers", type=int, default=None, help="decoder layers (default: the shape's)")
    p.add_argument("--quant", default=None, choices=QUANTS)
    p.add_argument("--model-dir", default="")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[64])
    p.add_argument("--batches", type=int, nargs="+", default=[8])
    p.add_argument("--iters", type=int, default=10, help="batches per timed round, each side")
    p.add_argument("--rounds", type=int, default=3, help="PoC and bare rounds, alternating; medians reported")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    p.add_argument("--config-only", action="store_true",
                   help="the model's JSON files alone and vLLM's --load-format dummy: full sizes without the disk")
    p.add_argument("--max-num-batched-tokens", type=int, default=0,
                   help="vLLM's step size, which its memory profile covers (default: the largest batch's tokens)")
    p.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                   help="one more engine flag, e.g. --engine-arg=--tensor-parallel-size=4 (repeatable)")
    p.add_argument("--json", default="")
    p.add_argument("--parts", action="store_true", help="also time each PoC stage alone")
    p.add_argument("--profile", default="", help="directory for torch.profiler tables of PoC and bare")
    p.add_argument("--host-profile", default="", help="directory for cProfile tables of the round path's host work")
    p.add_argument("--artifacts-out", default="", help="also write the artifacts of --artifact-nonces nonces at "
                   "the largest seq_len here (bench/kernel_paths.py compares paths)")
    p.add_argument("--artifact-nonces", type=int, default=256)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.iters < 1:
        p.error("--rounds and --iters must be at least 1")

    from backend.engine.adapter import Engine
    from backend.startup.settings import load_settings
    from backend.tools.modelgen import ensure_model, write_config_only
    model_dir = Path(args.model_dir or f"models/{args.shape}")
    engine_args = list(args.engine_arg)
    if args.config_only:
        write_config_only(model_dir, args.shape, num_layers=args.num_layers, quant=args.quant)
        engine_args += ["--load-format", "dummy"]
    else:
        ensure_model(model_dir, args.shape, num_layers=args.num_layers, quant=args.quant)
    max_tokens = max(args.seq_lens) * max(args.batches)
    step_tokens = args.max_num_batched_tokens or max_tokens
    settings = load_settings(["--model", str(model_dir), "--generate-model", "none", "--max-model-len",
                              str(max(max(args.seq_lens), 2048)), "--max-num-seqs", str(max(args.batches)),
                              "--max-num-batched-tokens", str(step_tokens), "--poc-max-batch-tokens",
                              str(max_tokens), "--gpu-memory-utilization",
                              str(args.gpu_memory_utilization), *engine_args])
    engine = Engine(settings)
    llm, runner = engine.core, engine.poc
    hf_cfg = engine.vllm_config.model_config.hf_config
    peak = llm.collective_rpc(_peak_tflops)[0]
    peak_fp8 = llm.collective_rpc(peak_fp8_tflops)[0]
    quant = getattr(hf_cfg, "quantization_config", None)  # a dict, as backend/engine/kernels.py reads it
    mfu_of = "fp8" if isinstance(quant, dict) and quant.get("quant_method") == "fp8" and peak_fp8 else "bf16"
    mfu_peak = peak_fp8 if mfu_of == "fp8" else peak
    print("worker:", llm.collective_rpc(_describe)[0], flush=True)
    pool = compat.block_pool(llm)
    rows = []
    points = []
    for seq_len, batch in ((seq_len, batch) for seq_len in args.seq_lens for batch in args.batches):
        if batch > runner.max_batch(seq_len):  # the runner's cap: what vLLM's profile covered
            print(f"L={seq_len:5d} B={batch:3d}  skipped: above the largest PoC batch {runner.max_batch(seq_len)} "
                  f"(max_num_batched_tokens {step_tokens})", flush=True)
        else:
            points.append((seq_len, batch))
    for seq_len, batch in points:  # warm-up of every point before any is timed: kernels, allocator, clocks
        job = ArtifactJob(PocSpec("BENCH_BLOCK", "bench_key", seq_len), tuple(range(batch)))
        for _ in range(3):
            runner.run(job, list(job.nonces))
        _round_path_s(runner, job, batch, 3, 0)  # a shape's first forwards there warm up, then capture its graph
    for seq_len, batch in points:
        nonces = list(range(batch))
        job = ArtifactJob(PocSpec("BENCH_BLOCK", "bench_key", seq_len), tuple(nonces))
        memory = _poc_peak_gib(llm, runner, job, nonces)
        num_blocks = batch * runner.blocks_per_seq(seq_len)
        rounds = []  # (poc_s, round_s, bare_s) per round, alternating so clock drift hits all alike
        for r in range(args.rounds):
            started = time.perf_counter()
            for i in range(args.iters):
                _arts, n = runner.run(job, [(2 * r * args.iters + i) * batch + k for k in range(batch)])
                assert n == batch
            poc_round_s = (time.perf_counter() - started) / args.iters
            launched_s = _round_path_s(runner, job, batch, args.iters, (2 * r + 1) * args.iters * batch)
            with _leased(runner, pool, num_blocks) as ids:
                bare_round_s = llm.collective_rpc(_bare, args=(ids, batch, seq_len, args.iters))[0]
            rounds.append((poc_round_s, launched_s, bare_round_s))
        poc_s, launched_s, bare_s = (statistics.median(col) for col in zip(*rounds, strict=True))
        round_ratios = [bare / poc for poc, _, bare in rounds]
        launched_ratios = [bare / launched for _, launched, bare in rounds]
        parts = None
        if args.parts:
            with _leased(runner, pool, num_blocks) as ids:
                parts = llm.collective_rpc(_parts, args=(ids, batch, seq_len, args.iters))[0]
        if args.profile:
            _write_profiles(Path(args.profile), llm, runner, pool, job, seq_len, batch)
        if args.host_profile:
            _write_host_profile(Path(args.host_profile), runner, job, batch, args.iters, seq_len)
        flops = flops_per_seq(hf_cfg, seq_len) * batch
        row = {"seq_len": seq_len, "batch": batch, "poc_nonces_per_s": batch / poc_s,
               "bare_nonces_per_s": batch / bare_s, "ratio": statistics.median(round_ratios),
               "round_ratios": round_ratios, "round_nonces_per_s": batch / launched_s,
               "round_ratio": statistics.median(launched_ratios), "round_round_ratios": launched_ratios,
               "round_path": _round_path(runner), "mfu_of": mfu_of,
               "poc_mfu": flops / poc_s / 1e12 / mfu_peak, "bare_mfu": flops / bare_s / 1e12 / mfu_peak,
               "poc_tflops": flops / poc_s / 1e12, "bare_tflops": flops / bare_s / 1e12, **memory}
        if parts:
            row["parts_ms"] = parts
            print("   stage ms per batch: " + "  ".join(f"{k} {v:.2f}" for k, v in parts.items()), flush=True)
        rows.append(row)
        print(f"L={seq_len:5d} B={batch:3d}  PoC {row['poc_nonces_per_s']:9.1f} nonces/s "
              f"(MFU {row['poc_mfu']:.3f} of {mfu_of})  bare {row['bare_nonces_per_s']:9.1f} nonces/s "
              f"(MFU {row['bare_mfu']:.3f}, {row['bare_tflops']:.0f} TFLOP/s)  PoC/bare {row['ratio']:.3f} (median of "
              f"{' '.join(f'{x:.3f}' for x in row['round_ratios'])})  round {row['round_nonces_per_s']:9.1f} "
              f"nonces/s, round/bare {row['round_ratio']:.3f} (median of "
              f"{' '.join(f'{x:.3f}' for x in row['round_round_ratios'])}; {row['round_path']})  memory: PoC peak "
              f"{memory['poc_peak_gib']:.2f} GiB, reserved {memory['reserved_gib']:.2f}, free "
              f"{memory['free_gib']:.2f}", flush=True)
    device = str(engine.vllm_config.device_config.device_type)
    kv = f"{engine.num_gpu_blocks} blocks of {compat.block_size(llm)} tokens"
    print(f"device {device}  peak bf16 matmul {peak:.1f} TFLOP/s, fp8 {peak_fp8:.1f}  model {args.shape}  ranks "
          f"{settings.vllm.world_size}  KV cache {kv}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "peak_tflops": peak, "peak_fp8_tflops": peak_fp8,
                                               "shape": args.shape, "num_layers": hf_cfg.num_hidden_layers,
                                               "ranks": settings.vllm.world_size, "kv_cache": kv,
                                               "engine_args": engine_args, "rows": rows}, indent=1))
    if args.artifacts_out:
        dump_artifacts(runner, Path(args.artifacts_out), args.artifact_nonces, max(args.seq_lens), min(args.batches))


if __name__ == "__main__":
    main()
