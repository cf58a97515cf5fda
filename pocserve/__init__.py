"""The drop-in for the Gonka ML node: `python -m pocserve.api_server` takes the command line the ML node builds for
`vllm.entrypoints.openai.api_server` and runs one pocserve instance (a backend and a frontend) under supervision.

- `settings.py`: the launcher's own few settings (environment only: the command line is vLLM's);
- `cli.py`: vLLM's own parser, which flags were given, one-line usage errors;
- `flags.py`: the table of every vLLM flag pocserve maps, ignores or refuses, and the translation it drives;
- `instance.py`: one instance's model, port, directories and child command lines;
- `supervisor.py`: starts the backend and the frontend, stops both on a signal, goes down with either;
- `api_server.py`: the entry point.
"""
