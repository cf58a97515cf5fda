"""Host work per engine step: our engine thread beside vLLM's own `LLMEngine.step()`, on the same load.

Both run in this process on the same model and engine settings: N chat requests of T tokens (greedy, ignore_eos)
added at once, stepped until all finish. For each step it takes the wall time of the step and subtracts the time
spent inside the model executor (`execute_model` and `sample_tokens`, the forward and the sampler), leaving the
host work around the model: what decides TPOT on a GPU, where the forward is short and runs asynchronously.

- vllm: `LLMEngine.step()` in-process: engine core step + output processing (detokenizer, stop strings) on the
  calling thread, as our backend did before the processor process.
- vllm-core: what `vllm serve`'s engine core process does per step (EngineCoreProc's busy loop: step_fn, post_step,
  the outputs encoded by an output thread and pushed to another process): no output processing, which its API server
  process does. The baseline for our engine thread; `vllm` above also counts the detokenizer's host work.
- ours: one iteration of our engine loop (ingest, policy, EngineCore step, routing of the outputs) with the real
  processor process and sockets, as `python -m backend` runs it; detokenizing happens in the processor.

    .venv/bin/python -m bench.engine_step [--requests 32] [--tokens 64] [--arrivals 128] [--step-log DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import queue
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from backend.engine import compat
from bench.step_log import (
    HOST_FIELD,
    INTERVAL_FIELD,
    SCHED_FIELD,
    equal_batch_ratio,
    round_steps,
    server_env,
    steps_line,
    system_dir,
)

compat.prepare_environment()

import zmq  # noqa: E402

from backend.startup.settings import load_settings  # noqa: E402
from backend.tools.modelgen import ensure_model  # noqa: E402
from protocol.generate import ChatMessage, GenerateRequest, SamplingSpec  # noqa: E402


class ExecutorClock:
    """Sums the wall and thread-CPU time spent inside the model executor's calls (wraps the instance's two
    methods, timing only)."""

    def __init__(self, executor) -> None:
        self.wall_s = 0.0
        self.cpu_s = 0.0
        for name in ("execute_model", "sample_tokens"):
            setattr(executor, name, self._timed(getattr(executor, name)))

    def _timed(self, fn):
        def call(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wall_s += time.perf_counter() - wall
                self.cpu_s += time.thread_time() - cpu
        return call


class StepClock:
    """Per step: wall time and the engine thread's CPU time, each without the executor's share."""

    def __init__(self, executor) -> None:
        self.executor = ExecutorClock(executor)
        self.host_ms: list[float] = []
        self.host_cpu_ms: list[float] = []
        self.step_ms: list[float] = []
        # Wall times (time.time(), the step log's clock) of the first recorded step's start and the last one's end.
        self.window_s = [math.nan, math.nan]

    def timed(self, step, record: bool) -> None:
        ex_wall, ex_cpu = self.executor.wall_s, self.executor.cpu_s
        if record and math.isnan(self.window_s[0]):
            self.window_s[0] = time.time()
        wall, cpu = time.perf_counter(), time.thread_time()
        step()
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        if record:
            self.window_s[1] = time.time()
            self.step_ms.append(wall * 1000)
            self.host_ms.append((wall - (self.executor.wall_s - ex_wall)) * 1000)
            self.host_cpu_ms.append((cpu - (self.executor.cpu_s - ex_cpu)) * 1000)

    def summary(self) -> dict:
        return {"num_steps": len(self.host_ms), "host_ms_mean": statistics.fmean(self.host_ms),
                "host_ms_p50": statistics.median(self.host_ms), "host_cpu_ms_mean": statistics.fmean(self.host_cpu_ms),
                "step_ms_mean": statistics.fmean(self.step_ms), "window_s": self.window_s}


def _prompts(n: int) -> list[str]:
    return [f"Request {i}: tell me something about the number {i * 7919 % 1000}." for i in range(n)]


def run_vllm(settings, n: int, tokens: int, arrivals: int = 0) -> dict:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.llm_engine import LLMEngine

    from backend.engine.args import USAGE_CONTEXT, engine_args
    llm = LLMEngine.from_engine_args(engine_args(settings), usage_context=USAGE_CONTEXT)
    clock = StepClock(llm.engine_core.engine_core.model_executor)
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0, output_kind=RequestOutputKind.DELTA)
    for warm in (True, False):
        for i, text in enumerate(_prompts(n)):
            chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
            ids = tokenizer.encode(chat, add_special_tokens=False)
            llm.add_request(f"{warm}-{i}", compat.token_prompt(list(ids)), params)
        while llm.has_unfinished_requests():
            clock.timed(llm.step, record=not warm)
    return clock.summary()


def _length(j: int, tokens: int) -> int:
    """Request j's max_tokens in an arrivals run: spread over [tokens/2, tokens], so requests end (and their
    successors arrive) apart, not in waves."""
    low = tokens // 2
    return low + (j * 7919) % (tokens - low + 1)


def _engine_core_requests(llm, prompts: list[str], lengths: list[int], tag: str) -> list:
    """The EngineCoreRequests vLLM's input processing makes of these chats (what `vllm serve`'s API server sends
    its engine core), caught on their way to the engine core instead of added."""
    from vllm import SamplingParams

    tokenizer, caught = llm.get_tokenizer(), []
    original = llm.engine_core.add_request
    llm.engine_core.add_request = caught.append
    try:
        for i, (text, length) in enumerate(zip(prompts, lengths, strict=True)):
            chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
            ids = tokenizer.encode(chat, add_special_tokens=False)
            llm.add_request(f"{tag}-{i}", compat.token_prompt(list(ids)),
                            SamplingParams(max_tokens=length, ignore_eos=True, temperature=0.0))
    finally:
        llm.engine_core.add_request = original
    return caught


def run_vllm_core(settings, n: int, tokens: int, arrivals: int = 0) -> dict:
    """vLLM's engine core as `vllm serve` runs it (EngineCoreProc in a process of its own): an input thread decodes
    each request and makes its `Request` (`preprocess_add_request`: block hashes and all), the busy loop adds what
    came (`_process_input_queue`), then `step_fn`, the outputs put on a queue, `post_step`; an output thread encodes
    them with vLLM's MsgpackEncoder and pushes them to a socket another process drains (the API server, which
    detokenizes there, off this process's GIL)."""
    import threading

    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from backend.engine.args import USAGE_CONTEXT, engine_args
    llm = LLMEngine.from_engine_args(engine_args(settings), usage_context=USAGE_CONTEXT)
    core = llm.engine_core.engine_core
    clock = StepClock(core.model_executor)
    address = f"ipc://{tempfile.mkdtemp(prefix='engine-step-')}/out.ipc"
    drain = subprocess.Popen([sys.executable, "-c", "import sys, zmq\ns = zmq.Context().socket(zmq.PULL)\n"
                              "s.connect(sys.argv[1])\nwhile True: s.recv_multipart()", address])
    to_add: queue.Queue = queue.Queue()  # encoded requests, as they come off the input socket
    added: queue.Queue = queue.Queue()  # (Request, wave) for the busy loop
    outputs_queue: queue.Queue = queue.Queue()
    finished = 0

    def take_inputs() -> None:
        decoder = MsgpackDecoder(EngineCoreRequest)
        while (frames := to_add.get()) is not None:
            added.put(core.preprocess_add_request(decoder.decode(frames)))

    def send_outputs() -> None:
        encoder = MsgpackEncoder()
        push: zmq.Socket = zmq.Context.instance().socket(zmq.PUSH)
        push.bind(address)
        while (item := outputs_queue.get()) is not None:
            push.send_multipart(encoder.encode(item[1]), copy=False)
        push.close(linger=0)

    def step() -> None:
        nonlocal finished
        while not added.empty():
            core.add_request(*added.get_nowait())
        outputs, model_executed = core.step_fn()
        for output in outputs.items() if outputs else ():
            outputs_queue.put_nowait(output)
            finished += sum(o.finish_reason is not None for o in output[1].outputs)
        core.post_step(model_executed)

    threads = [threading.Thread(target=f, daemon=True) for f in (take_inputs, send_outputs)]
    for t in threads:
        t.start()
    try:
        encoder = MsgpackEncoder()
        for warm in (True, False):
            total = arrivals if arrivals and not warm else n
            lengths = [_length(j, tokens) if arrivals and not warm else tokens for j in range(total)]
            # encode_into reuses no buffer here: each request's frames are its own
            frames = [encoder.encode(r) for r in _engine_core_requests(llm, _prompts(total), lengths, str(warm))]
            finished, sent = 0, min(n, total)
            for f in frames[:sent]:
                to_add.put(f)
            while finished < total:
                if not core.scheduler.has_requests():  # nothing to step until the input thread hands one over
                    core.add_request(*added.get())
                before = finished
                clock.timed(step, record=not warm)
                for f in frames[sent:sent + finished - before]:  # each finished request's successor arrives
                    to_add.put(f)
                sent = min(total, sent + finished - before)
        return clock.summary()
    finally:
        to_add.put(None)
        outputs_queue.put(None)
        for t in threads:
            t.join(timeout=10)
        drain.kill()


def run_ours(settings, n: int, tokens: int, arrivals: int = 0) -> dict:
    """Our engine process as `python -m backend` assembles it, driven by requests put on its inbox."""
    from backend.__main__ import build_loop, start_processor, stop_processor
    from backend.engine.adapter import Engine
    from backend.pow.store import open_store
    from backend.processor import engine_address, link_address
    from backend.processor.link import EngineOut, EngineSide
    from backend.transport.control import ControlPlane
    from backend.transport.server import SocketServer, shut_down

    work = Path(tempfile.mkdtemp(prefix="engine-step-"))
    ctx, inbox, control = zmq.Context(), queue.Queue(), ControlPlane(uuid.uuid4().hex)
    server = SocketServer(ctx, f"ipc://{work}/b.ipc", inbox, control, link_address=link_address(str(work)))
    server.start()
    server.attach_link(EngineSide())
    to_processor = EngineOut(ctx, engine_address(str(work)))
    processor = start_processor(settings, str(work))
    store = open_store(work / "state")
    try:
        engine = Engine(settings)
        clock = StepClock(engine.core.model_executor)
        loop = build_loop(settings, engine, server, inbox, control, store, processor, to_processor)
        while not loop.chat.is_ready:
            loop.ingest(block=True)
        for warm in (True, False):
            total = arrivals if arrivals and not warm else n
            lengths = [_length(j, tokens) if arrivals and not warm else tokens for j in range(total)]
            requests = [GenerateRequest(rid=f"{warm}-{i}", stream=True,
                                        sampling=SamplingSpec(max_tokens=length, ignore_eos=True, temperature=0.0),
                                        messages=[ChatMessage(role="user", content=text)])
                        for i, (text, length) in enumerate(zip(_prompts(total), lengths, strict=True))]
            sent = min(n, total)
            for request in requests[:sent]:
                inbox.put((b"fe-bench", request))
            if not arrivals or warm:
                while loop.chat.preparing or not loop.chat.owners:  # until the processor handed every request back
                    loop.ingest(block=True)
            entered: set[str] = set()  # requests the engine has had; those no longer owned have finished
            while sent < total or loop.chat.has_work() or loop.chat.is_preparing() or not inbox.empty():
                if not loop.chat.has_work():  # nothing to step until the processor hands a request back
                    loop.ingest(block=True)
                    continue
                clock.timed(loop.run_once, record=not warm)
                entered.update(loop.chat.owners)
                # each finished request's successor arrives, as the frontend would pass it on
                successors = min(total - sent, len(entered) - len(loop.chat.owners) - (sent - n))
                for request in requests[sent:sent + successors]:
                    inbox.put((b"fe-bench", request))
                sent += successors
        loop.pow.callbacks.close()
        return clock.summary()
    finally:
        to_processor.close()
        shut_down(server, ctx)
        stop_processor(processor)
        store.close()


def step_log_lines(log_dir: Path, figures: dict[str, dict]) -> list[str]:
    """Each system's step log over its measured steps, and ours over each other system at equal batch: the decode
    interval, vLLM's four phases, and the scheduler's two alone (bench/step_log.py equal_batch_ratio)."""
    steps = {system: round_steps(system_dir(log_dir, system), *f["window_s"]) for system, f in figures.items()}
    lines = [f"{system:5} step log: {steps_line(r)}" for system, r in steps.items()]
    for base in (s for s in steps if s != "ours" and "ours" in steps):
        mine, theirs = steps["ours"]["step_decode_by_batch"], steps[base]["step_decode_by_batch"]
        interval, phases, scheduler = (equal_batch_ratio(mine, theirs, field)
                                       for field in (INTERVAL_FIELD, HOST_FIELD, SCHED_FIELD))
        lines.append(f"ours/{base} at equal batch: decode interval {interval:.3f}, vLLM's phases {phases:.3f}, "
                     f"the scheduler's {scheduler:.3f}")
    return lines


def _without(argv: list[str], *flags: str) -> list[str]:
    """argv less each of `flags` with its value (`--flag VALUE` or `--flag=VALUE`)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        elif not a.startswith(tuple(f"{f}=" for f in flags)):
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, default=Path("models/tiny-qwen3"))
    p.add_argument("--shape", default="tiny")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--systems", default="vllm,vllm-core,ours",
                   help="comma-separated (vllm, vllm-core, ours); each runs in a process of its own")
    p.add_argument("--arrivals", type=int, default=0,
                   help="measure over this many requests arriving as others end (N in flight, lengths spread over "
                        "[T/2, T]): each step then carries the work of requests coming in (vllm-core and ours; "
                        "0: the N requests added at once)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--quiet", action="store_true", help="no summary lines (the per-system child processes)")
    p.add_argument("--step-log", type=Path, default=None,
                   help="log each system's engine steps under this directory (bench/step_log.py) and print vLLM's "
                        "own phases at equal batch, ours over the others: the same code, slower in ours' process?")
    p.add_argument("engine_flags", nargs="*", help="backend flags after --, e.g. -- --enforce-eager")
    args = p.parse_args(argv)
    if args.arrivals and "vllm" in args.systems.split(","):
        p.error("--arrivals: for vllm-core and ours (LLMEngine.step adds requests on its own thread anyway)")
    model = ensure_model(args.model_dir, args.shape)
    settings = load_settings(["--model", str(model), "--generate-model", "none", "--max-num-seqs",
                              str(max(64, args.requests)), *args.engine_flags], {})
    systems = args.systems.split(",")
    figures = {}
    if len(systems) == 1 and args.step_log is None:
        run = {"vllm": run_vllm, "vllm-core": run_vllm_core, "ours": run_ours}[systems[0]]
        figures[systems[0]] = run(settings, args.requests, args.tokens, args.arrivals)
    else:  # each engine in a process of its own: one engine's KV cache is not given back before the next
        for system in systems:
            # The step log's hook is installed as vLLM is imported: only a child process started with it has it.
            env = {**os.environ, **server_env(args.step_log, system, True)} if args.step_log is not None else None
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                one = _without(argv if argv is not None else sys.argv[1:], "--systems", "--json", "--step-log")
                subprocess.run([sys.executable, "-m", "bench.engine_step", "--systems", system, "--json", out.name,
                                "--quiet", *one], check=True, env=env)
                figures[system] = json.loads(Path(out.name).read_text())["figures"][system]
    if not args.quiet:
        print()  # vLLM's native libraries may leave a line unterminated on stderr
    for system, f in figures.items() if not args.quiet else ():
        print(f"{system:5} steps {f['num_steps']:4}  host ms/step: wall mean {f['host_ms_mean']:.3f} p50 "
              f"{f['host_ms_p50']:.3f}, engine-thread CPU mean {f['host_cpu_ms_mean']:.3f}  "
              f"(whole step {f['step_ms_mean']:.3f})", flush=True)
    for base in ("vllm", "vllm-core") if "ours" in figures and not args.quiet else ():
        if base in figures:
            o, v = figures["ours"], figures[base]
            print(f"ours/{base} host per step: wall {o['host_ms_mean'] / v['host_ms_mean']:.3f}, engine-thread CPU "
                  f"{o['host_cpu_ms_mean'] / v['host_cpu_ms_mean']:.3f}; whole step "
                  f"{o['step_ms_mean'] / v['step_ms_mean']:.3f}")
    if args.step_log is not None and not args.quiet:
        print("\n".join(step_log_lines(args.step_log, figures)))
    if args.json is not None:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.platform(),
                                         "cpu_count": os.cpu_count(), "argv": sys.argv[1:], "figures": figures},
                                        indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
