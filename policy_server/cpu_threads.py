"""How the engine worker shares the CPU cores with the event loop.

The problem, measured on a 2-core machine: torch's OpenMP threads *spin* while they wait at the end of
each parallel region (GNU OpenMP's default active wait policy). When the event loop thread needs a core
for a moment, one OpenMP thread is descheduled and its sibling burns its whole time slice spinning for
it: a 2-thread forward went from 68 ms to 784 ms. With ``OMP_WAIT_POLICY=PASSIVE`` waiting threads
sleep instead, and the same forward ran at full speed (69 ms) next to a busy thread.

So the policy is:

* ``OMP_WAIT_POLICY=PASSIVE`` in the environment before torch is first imported (the OpenMP runtime reads
  it once, when it loads). :func:`apply_passive_wait_policy` does this; ``policy_server/__init__.py``
  calls it so that importing the server package is enough, and it only sets a default (an explicit
  ``OMP_WAIT_POLICY`` in the environment wins).
* the worker uses all the cores available to the process for torch's intra-op pool (the event loop is
  idle most of the time and, with passive waiting, takes a core only when it has work), and one inter-op
  thread (the worker runs one request at a time; a second pool would only compete).

``benchmarks/worker_threads.py`` measures the alternatives (1 or all threads, active or passive) on
this machine, and ``tests/test_server_threads.py`` checks that a served process runs with this policy.
"""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger(__name__)

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"


def apply_passive_wait_policy() -> None:
    """Make OpenMP threads sleep, not spin, while they wait (effective only before torch is imported)."""
    if WAIT_POLICY_ENV in os.environ:
        return
    os.environ[WAIT_POLICY_ENV] = "PASSIVE"
    if "torch" in sys.modules:
        # Too late for this process: the OpenMP runtime already read its environment.
        logger.warning(
            "torch was imported before policy_server; set OMP_WAIT_POLICY=PASSIVE in the environment "
            "so the engine worker does not spin-wait against the event loop"
        )


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def configure_worker_threads(num_threads: int | None) -> dict[str, object]:
    """Set torch's thread pools for the calling thread (the engine worker) and return what was set.

    Call it from the worker thread itself: OpenMP thread counts are per calling thread.
    """
    import torch  # imported here, in the worker, so the event loop never pays for it

    threads = num_threads or available_cores()
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set (or inter-op work already started): keep what is there
    return {
        "torch_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "omp_wait_policy": os.environ.get(WAIT_POLICY_ENV, "(default: active)"),
        "cores": available_cores(),
    }
