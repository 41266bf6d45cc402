"""How the engine worker shares the CPU cores with the event loop: the OpenMP wait policy and torch's threads.

The problem, measured on a 2-core machine: torch's OpenMP
threads *spin* while they wait at the end of each parallel region (GNU OpenMP's default active wait
policy). When the event loop thread needs a core for a moment, one OpenMP thread is descheduled and its
sibling burns its whole time slice spinning for it: a 2-thread forward went from 68 ms to 784 ms. With
``OMP_WAIT_POLICY=PASSIVE`` waiting threads sleep instead, and the same forward ran at full speed (69
ms) next to a busy thread.

So the policy is:

* ``OMP_WAIT_POLICY=PASSIVE`` in the environment before torch is first imported (the OpenMP runtime reads
  it once, when it loads). :func:`apply_passive_wait_policy` does this; ``policy_server/__init__.py``
  calls it so that importing the server package is enough, and it only sets a default (an explicit
  ``OMP_WAIT_POLICY`` in the environment wins). This module imports no torch at its top for that reason:
  the package's import of it must come before torch's.
* the worker's torch intra-op pool gets every core but one (at least one): the event loop, the OS and
  whatever else runs beside the server (often the robot stack itself) keep a core, so neither side
  waits on the other for a time slice. One inter-op thread: the worker runs one request at a time.

Measured on this 2-core machine (``benchmarks/worker_threads.py``, tiny distilled model, 224×224,
closed loop; model time p50 / p99 in ms):

==========  ===============  ===============  ===============  ===============
scenario    2 thr PASSIVE    1 thr PASSIVE    2 thr ACTIVE     1 thr ACTIVE
==========  ===============  ===============  ===============  ===============
alone       118 / 317        117 / 159        427 / 1783       149 / 183
busy core   204 / 371        220 / 327        1946 / 6570      299 / 387
streaming   116 / 202        102 / 119        708 / 3666       111 / 134
==========  ===============  ===============  ===============  ===============

(``streaming``: a second robot sends frames at 30 Hz while ``/healthz`` is probed; /healthz answered
in 2.0 ms p50 / 6.5 ms p99 with 1 passive thread, 5.7 / 32 ms with 2 active ones.) ACTIVE with two
threads is the pathology from the field notes: 4-16x slower. With PASSIVE, one thread matches two at
the median and has the better tail here; on machines with more cores the worker gets them all but one.

Rerun ``benchmarks/worker_threads.py`` on a new machine (30 requests per cell: p99 is the slowest few);
``tests/test_server_lifecycle.py`` checks that a served process runs with this policy.
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


def default_worker_threads() -> int:
    """Every core but one for torch, leaving one to the event loop and the rest of the machine."""
    return max(1, available_cores() - 1)


def configure_worker_threads(num_threads: int | None) -> dict[str, object]:
    """Set torch's thread pools for the calling thread (the engine worker) and return what was set.

    Call it from the worker thread itself: OpenMP thread counts are per calling thread.
    """
    import torch  # imported here, in the worker, so the event loop never pays for it

    threads = num_threads or default_worker_threads()
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
