"""Loaded at start-up by every Python process whose PYTHONPATH begins with this directory (`bench.serving
--step-log` gives it to both systems' servers): where POCSERVE_BENCH_STEP_LOG names a directory, vLLM's scheduler and
model runner are wrapped as soon as each is imported, to log each engine step (bench/step_log.py TIMED). Processes
that import neither (our frontend, the client) are untouched. It shadows any other sitecustomize: a bench's servers
only."""

import os
import sys

if os.environ.get("POCSERVE_BENCH_STEP_LOG"):
    import importlib.abc
    import importlib.util

    _TARGETS = {"vllm.v1.core.sched.scheduler", "vllm.v1.worker.gpu_model_runner"}  # bench/step_log.py TIMED

    class _WrapOnImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in _TARGETS:
                return None
            _TARGETS.discard(name)
            sys.meta_path.remove(self)  # out of the way of the lookup below: the path's own finders
            try:
                spec = importlib.util.find_spec(name)
            finally:
                if _TARGETS:  # back for the other module
                    sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return spec
            load = spec.loader.exec_module

            def exec_module(module):
                load(module)
                from bench.step_log import install

                install(module)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, _WrapOnImport())
