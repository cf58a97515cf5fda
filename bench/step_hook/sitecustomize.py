"""Loaded at start-up by every Python process whose PYTHONPATH begins with this directory (`bench.serving
--step-log` gives it to both systems' servers): where POCSERVE_BENCH_STEP_LOG names a directory, vLLM's scheduler is
wrapped as soon as it is imported, to log each engine step (bench/step_log.py). Processes that never import it
(our frontend, the client) are untouched. It shadows any other sitecustomize: a bench's servers only."""

import os
import sys

if os.environ.get("POCSERVE_BENCH_STEP_LOG"):
    import importlib.abc
    import importlib.util

    _TARGET = "vllm.v1.core.sched.scheduler"

    class _WrapScheduler(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != _TARGET:
                return None
            sys.meta_path.remove(self)  # once, and no recursion through the lookup below
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                return spec
            load = spec.loader.exec_module

            def exec_module(module):
                load(module)
                from bench.step_log import StepWriter, wrap_update_from_output

                wrap_update_from_output(module.Scheduler, StepWriter(os.environ["POCSERVE_BENCH_STEP_LOG"]).start())

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, _WrapScheduler())
