"""Gonka sampling features: enforced tokens, per-request logprobs mode, grammar degradation, distance2.

`distance`, `classifier`, `enforced_input` and `compare_cli` are stdlib-only and safe to import from the
frontend; modules that plug into vLLM import it themselves, so importing this package stays cheap.
"""
