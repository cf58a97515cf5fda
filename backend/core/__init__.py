"""What the engine thread runs between start-up and exit (backend/__init__.py maps the threads): the loop
(loop.py), its pure decision table (policy.py), the chat request table (chat.py) and chat's share of the device
(share.py); and the heap trimmer (heap.py), the one thread of its own here, started beside the loop.

Named core as the part every iteration turns over, not vLLM's EngineCore: that one sits behind backend/engine/.
"""
