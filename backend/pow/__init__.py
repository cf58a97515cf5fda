"""The Gonka PoC API on the engine thread: the service and its decisions (service.py), artifact batches between
engine steps (artifact_queue.py), queued /generate jobs (jobs.py), results and callback bodies (results.py), the
callback sender with its own threads (callbacks.py) and the SQLite store with its writer thread (store.py)."""
