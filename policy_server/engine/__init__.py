"""Where a request waits and becomes tensors: the request queue (and the owner contracts of its items),
the engine worker thread (its batches, its counters, its host-prep thread), the batching policies, the
watchdog, the worker's CPU threads and the backend interface.

Nothing here touches a socket: sessions and the HTTP sidecar put work in the queue; the worker (or a
backend's dispatchers) takes it, calls the engine, and posts each outcome back to its owner on the event
loop.
"""
