"""HTTP frontend: OpenAI and Gonka routes over a ZMQ client to the backend. Imports neither torch nor vLLM."""
