"""The backend: the engine process and its processor process. Every thread, who runs it, what it may touch.

Engine process (`python -m backend`, backend/__main__.py):
- engine thread (the main thread): runs the loop (core/loop.py): ingest → policy.choose → execute → route. The only
  thread that calls vLLM's EngineCore (engine/) and the workers' RPCs, and the only one that reads or changes the
  chat table (core/chat.py), the PoC service and its artifact queue, or the in-memory job queue (pow/). It never
  touches a socket, never encodes, never blocks on I/O: it hands messages to the outbox and work to the others.
- zmq-io thread (transport/server.py): owns the ROUTER to the frontends and the PAIR to the processor. Decodes
  frames into the inbox, answers Hello and Ping itself (transport/control.py, from the snapshot the engine thread
  publishes), keeps peers' last-seen times (transport/peers.py), runs CURVE admission (transport/curve.py),
  passes the processor's encoded deltas to frontends unread, and encodes and sends what other threads put on the
  outbox (they append and write one byte to a wake-up socket it polls).
- store writer thread (pow/store.py): the only SQLite connection; runs submitted writes in order and their
  completion callbacks (a persisted job's reply goes to the outbox from here).
- callback dispatcher thread and its POST pool (pow/callbacks.py): the in-memory view of the outbox (its rows and
  their SQL: pow/outbox.py, run on the store thread), HTTP out.
- pow-stop-flush thread (pow/service.py): one per /stop, waits for the bounded callback flush, then replies.
- heap-trim thread (core/heap.py): calls glibc's malloc_trim every few seconds; touches nothing of the others.

Processor process (processor/, spawned by the engine process, gone with it):
- its main thread: the link to the engine process; vLLM's InputProcessor (checks, engine requests, n > 1 fan-out),
  OutputProcessor (detokenizer, stop strings, logprobs), tool and reasoning parsers, and our delta shape
  (processor/main.py); it also answers /tokenize and /detokenize.
- tokenize thread: tokenizes prompts of over 64k characters so the deltas of others never wait for them.

Subpackages follow that ownership: core/ (the engine thread's loop, policy, chat table and chat share; the heap
trimmer), startup/ (run once before the engine: settings, vLLM's command line, the fork's variables), transport/
(io thread), engine/ (vLLM, engine thread), pow/ (the PoC API), processor/ (the other process), tools/ (operator
commands, separate processes). At the root: __main__.py (start-up and shutdown), and what several subpackages
share: errors.py (request errors and their wire form), iterations.py (the per-iteration token histogram).
"""
