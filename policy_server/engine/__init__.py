"""Where a request waits and becomes tensors: the request queue, the engine worker thread (its batching
policies, its one engine call per batch), its watchdog, the worker's CPU threads, the backend interface
and the typed model description.

Nothing here touches a socket: sessions and the HTTP sidecar put work in the queue; the worker (or a
backend's dispatchers) takes it, calls the engine, and posts each outcome back to its owner on the event
loop.
"""
