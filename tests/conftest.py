"""Shared fixtures: tiny Cosmos3 checkpoints built once per test session, and engines loaded from them.

Every test that touches the model goes through the real diffusers pipeline on these checkpoints; they
take a couple of seconds to build and load, so they are shared.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

# `make test` runs the suite on two pytest-xdist workers. Each keeps torch's intra-op pool to one thread
# (set before torch is first imported): two processes that each start a thread per core oversubscribe a
# 2-core machine, and torch then slows many times over. Servers started by the tests size their own pool.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """``tiny_checkpoint(variant, **options) -> Path``: build (once) and return a tiny checkpoint."""
    from cosmos3_runtime.random_checkpoints import build_tiny_checkpoint

    built = {}

    def get(variant: str = "distilled", **options):
        key = (variant, tuple(sorted(options.items())))
        if key not in built:
            name = "-".join([variant] + [f"{k}={v}" for k, v in sorted(options.items())])
            built[key] = build_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / name, variant, **options)
        return built[key]

    return get


@pytest.fixture(scope="session")
def tiny_engine(tiny_checkpoint):
    """``tiny_engine(variant, **options) -> Cosmos3Engine``: one loaded engine per checkpoint for the session
    (``droid=True``: the checkpoint whose default domain has NVIDIA's DROID profile, state included)."""
    from cosmos3_runtime.engine import Cosmos3Engine

    engines = {}

    def get(variant: str = "distilled", **options):
        key = (variant, tuple(sorted(options.items())))
        if key not in engines:
            engines[key] = Cosmos3Engine.load(tiny_checkpoint(variant, **options))
        return engines[key]

    return get


@pytest.fixture
def camera_image():
    """A 224x224 RGB camera frame with structure (not constant), uint8."""
    rng = np.random.default_rng(1234)
    return rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)
