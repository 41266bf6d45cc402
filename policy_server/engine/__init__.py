"""Where a request waits and becomes tensors: the request queue and the owner contracts of its items,
the engine worker thread, the batching policies, the watchdog, the worker's CPU threads and the
backend interface. Nothing here touches a socket.
"""
