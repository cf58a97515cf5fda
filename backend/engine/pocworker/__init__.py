"""The PoC forward inside vLLM's workers: what touches the model runner, vLLM's forward context, CUDA streams,
green contexts and graphs. The PoC math it runs (seeds, RNG, transforms, artifacts) is poc/'s, which imports
nothing from here.

Imports point one way: hooks ← forward ← graphs ← extension, and streams ← extension (tests/unit/test_import_graph.py).
- hooks.py: the decoder layers this pipeline stage holds, and the hooks that reflect their outputs;
- forward.py: a batched causal prefill on leased KV blocks through vLLM's model runner, whole or layer by layer;
- graphs.py: those forwards captured as CUDA graphs and replayed;
- streams.py: the streams and SM partition a forward beside chat runs on;
- extension.py: PocWorkerExtension, the methods the engine thread calls on every worker by name.
"""
