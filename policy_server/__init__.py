"""Realtime WebSocket policy server for Cosmos3.

Importing this package sets ``OMP_WAIT_POLICY=PASSIVE`` (unless the environment already says otherwise)
before anything imports torch: the engine worker shares the machine's cores with the event loop, and
spinning OpenMP threads make both slow. See :mod:`policy_server.engine.worker` ("The CPU cores").
"""

from .engine.thread_policy import apply_passive_wait_policy  # the module imports no torch

apply_passive_wait_policy()
