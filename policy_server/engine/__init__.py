"""Where a request waits and becomes tensors: the request queue and the owner contracts of its items,
the engine worker thread with its batching policies, its watchdog and its CPU threads, and the backend
interface. Nothing here touches a socket.
"""
