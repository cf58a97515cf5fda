"""What `python -m backend` runs once, before the engine is built: the settings (settings.py), vLLM's command line
taken whole (vllm_args.py), the fork's environment variables that do nothing here (fork_env.py).

The settings object built here is only read afterwards; the one later call is the io thread's reload of the CURVE
clients directory (transport/curve.py), checked as at start.
"""
