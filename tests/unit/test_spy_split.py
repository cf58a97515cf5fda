"""Unit tests for bench/spy_split.py: py-spy's raw stacks split by thread and function."""

from __future__ import annotations

from bench.spy_split import function, parse, report

# Lines as py-spy 0.4.3 writes them with --threads (the first as recorded from a test backend), then with
# --subprocesses, where a child's stacks start with its parent's process frame (as `vllm serve`'s engine core
# under its API server, recorded on an H100); the last is not a stack.
RAW = """\
thread (10932): MainThread;_run_module_as_main (<frozen runpy>:198);BackendLoop.run (backend/core/loop.py:66);\
BackendLoop.step_engine (backend/core/loop.py:201);EngineCore.step_with_batch_queue (vllm/v1/engine/core.py:450);\
Event.synchronize (torch/cuda/streams.py:225) 30
thread (10932): MainThread;_run_module_as_main (<frozen runpy>:198);BackendLoop.run (backend/core/loop.py:66);\
BackendLoop.step_engine (backend/core/loop.py:201);EngineCore.step_with_batch_queue (vllm/v1/engine/core.py:433);\
Scheduler.schedule (vllm/v1/core/sched/scheduler.py:300) 10
thread (10932): MainThread;_run_module_as_main (<frozen runpy>:198);BackendLoop.run (backend/core/loop.py:66);\
BackendLoop.ingest (backend/core/loop.py:130) 10
thread (0x7f00aa): zmq-io;_io_loop (backend/transport/server.py:170) 4
process 77:"python -m vllm";thread (78): MainThread;run_busy_loop (vllm/v1/engine/core.py:900) 5
process 77:"python -m vllm";process 91:"VLLM::EngineCore";thread (91): MainThread;\
EngineCoreProc.run_busy_loop (vllm/v1/engine/core.py:1050) 7
Wrote raw flamegraph data
"""


def test_frames_are_counted_once_per_sample_by_function_not_line():
    threads = parse(RAW)
    assert set(threads) == {"MainThread", "zmq-io", "77/MainThread", "91/MainThread"}
    main = threads["MainThread"]
    assert main.samples == 50
    assert main.inclusive["EngineCore.step_with_batch_queue (core.py)"] == 40  # two lines of one function
    assert main.inclusive["BackendLoop.run (loop.py)"] == 50
    assert main.leaf == {"Event.synchronize (streams.py)": 30, "Scheduler.schedule (scheduler.py)": 10,
                         "BackendLoop.ingest (loop.py)": 10}
    assert threads["77/MainThread"].samples == 5
    assert threads["91/MainThread"].samples == 7  # the child's own thread, not its parent's


def test_function_keeps_the_name_and_the_file():
    assert function("Queue.get (queue.py:180)") == "Queue.get (queue.py)"
    assert function("<module> (backend/__main__.py:226)") == "<module> (__main__.py)"
    assert function("_run_module_as_main (<frozen runpy>:198)") == "_run_module_as_main (<frozen runpy>)"


def test_the_report_gives_shares_and_leaves_out_small_threads(tmp_path):
    path = tmp_path / "spy.txt"
    path.write_text(RAW)
    lines = report(path, top=5, min_samples=5)
    assert lines[0] == f"== {path}: 66 samples in 4 threads"
    assert "-- MainThread: 50 samples" in lines
    assert "     80.0%  EngineCore.step_with_batch_queue (core.py)" in lines
    assert "     60.0%  Event.synchronize (streams.py)" in lines
    assert not any("zmq-io" in line for line in lines)  # 4 samples, under the minimum


# `--native --idle` stacks as py-spy 0.4.3 wrote them for a backend on the CPU engine (addresses shortened): a
# Cython call taking the GIL back (a bare pthread_cond_timedwait), CPython's exported taker, a Condition's wait (a
# lock, not the GIL), a CUDA driver's wait, a C++ barrier's, and torch's binding taking the GIL back after an op.
NATIVE = """\
thread (1): zmq-io;SocketServer._io_loop (backend/transport/server.py:170);Poller.poll (zmq/sugar/poll.py:106);\
0x7f3 (zmq/backend/cython/_zmq.cpython-311-x86_64-linux-gnu.so);pthread_cond_timedwait (libc.so.6);0x7f36 (libc.so.6) 6
thread (1): zmq-io;SocketServer._io_loop (backend/transport/server.py:170);Poller.poll (zmq/sugar/poll.py:106);\
zmq_poll (libzmq.so.5);poll (libc.so.6) 30
thread (2): MainThread;GPUModelRunner._prepare_inputs (vllm/v1/worker/gpu_model_runner.py:2205);\
PyEval_RestoreThread (libpython3.12.so.1.0);take_gil (libpython3.12.so.1.0) 3
thread (2): MainThread;Event.wait (threading.py:629);Condition.wait (threading.py:331);\
lock_PyThread_acquire_lock (libpython3.11.so.1.0);PyThread_acquire_lock_timed (libpython3.11.so.1.0);\
pthread_cond_timedwait (libc.so.6) 5
thread (2): MainThread;Event.synchronize (torch/cuda/streams.py:225);cuEventSynchronize (libcuda.so.1);\
pthread_cond_timedwait (libc.so.6) 7
thread (2): MainThread;barrier (torch/distributed/distributed_c10d.py:4800);0x7f1 (libtorch_cpu.so);\
std::condition_variable::wait_for (libstdc++.so.6);pthread_cond_timedwait (libc.so.6) 2
thread (2): MainThread;GPUModelRunner._prepare_inputs (vllm/v1/worker/gpu_model_runner.py:2205);\
torch::autograd::THPVariable_to (libtorch_python.so);pthread_cond_timedwait (libc.so.6) 4
"""


def test_gil_waits_are_told_from_lock_and_driver_waits(tmp_path):
    threads = parse(NATIVE)
    assert threads["zmq-io"].gil_waits == {"Poller.poll (poll.py)": 6}
    assert threads["MainThread"].gil_waits == {"GPUModelRunner._prepare_inputs (gpu_model_runner.py)": 7}
    path = tmp_path / "spy.txt"
    path.write_text(NATIVE)
    lines = report(path, top=5, min_samples=1)
    assert "   waiting for the GIL: 16.7% of the samples, in:" in lines  # zmq-io: 6 of 36
    assert "   waiting for the GIL: 33.3% of the samples, in:" in lines  # MainThread: 7 of 21
    python_only = tmp_path / "python-only.txt"  # py-spy's default: no native frames, no waits told
    python_only.write_text(RAW)
    assert not any("waiting for the GIL" in line for line in report(python_only, top=5, min_samples=1))
