"""The one door to vLLM: engine construction, request conversion, outputs. Nothing else imports vLLM."""
