"""Quantized weights, the memory plan and the served weights' SHA-256 (docs/runtime.md, "Quantized weights").

Real tiny checkpoints loaded through diffusers' torchao config, the plan held against what the loaded model
really holds and against the checkpoint's safetensors headers, and the installed commands refusing in one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from server_fixtures import DOMAIN, REPO_ROOT, rgb_image, tiny_checkpoint

from cosmos3_runtime.checkpoints import inspect_checkpoint
from cosmos3_runtime.engine import Cosmos3Engine
from cosmos3_runtime.memory_plan import GIB, parse_size, plan_memory
from cosmos3_runtime.quantization import FULL_PRECISION_MODULES, is_quantized_linear
from cosmos3_runtime.requests import ActionRequest
from cosmos3_runtime.served_weights import checkpoint_sha256, hub_revision

pytestmark = pytest.mark.timeout(300)

BIN = Path(sys.executable).parent
# The relative difference int8 weights may make in a tiny checkpoint's chunk (measured: 0.05 %).
INT8_ACTION_BOUND = 0.05


def _tensor_bytes(tensor) -> int:
    """What a tensor's storage holds: a torchao tensor's inner tensors (values, scales, zero points)."""
    if type(tensor).__name__ not in ("Parameter", "Tensor") and hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        return sum(_tensor_bytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()


def _module_bytes(module) -> int:
    return sum(_tensor_bytes(t) for t in [*module.parameters(), *module.buffers()])


@pytest.fixture(scope="module")
def engines():
    checkpoint = tiny_checkpoint("distilled")
    return {q: Cosmos3Engine.load(checkpoint, prefix_cache_mb=0, quantization=q) for q in (None, "int8")}


@pytest.mark.parametrize("variant", ["distilled", "edge"])
def test_the_plan_counts_what_the_loaded_model_holds_and_what_its_files_hold(variant):
    checkpoint = tiny_checkpoint(variant)
    info = inspect_checkpoint(checkpoint)
    for quantization in (None, "int8"):
        plan = plan_memory(info, dtype="float32", quantization=quantization, device_type="cpu")
        parts = {c.name: c for c in plan.components}
        engine = Cosmos3Engine.load(checkpoint, prefix_cache_mb=0, quantization=quantization)
        assert parts["transformer"].bytes == _module_bytes(engine.pipe.transformer), quantization
        assert parts["vae"].bytes == _module_bytes(engine.pipe.vae), quantization
        # The parameters the plan counts are the ones the safetensors headers list.
        assert parts["transformer"].parameters == info.weights["transformer"].parameters
        assert parts["vae"].parameters == info.weights["vae"].parameters
        assert (parts["transformer"].quantized_bytes > 0) == (quantization is not None)
    # The tiny checkpoints are stored in float32: at float32 the plan is the headers' bytes (plus buffers).
    plan = plan_memory(info, dtype="float32", quantization=None, device_type="cpu")
    assert plan.components[0].bytes >= info.weights["transformer"].bytes
    assert plan.components[0].largest_shard_bytes == max(
        f.stat().st_size for f in (checkpoint / "transformer").glob("*.safetensors")
    )


def test_int8_weights_are_quantized_and_move_the_actions_a_little(engines):
    transformer = engines["int8"].pipe.transformer
    import torch

    kinds = {
        name: type(module.weight).__name__
        for name, module in transformer.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    assert {kind for name, kind in kinds.items() if is_quantized_linear(name)} == {"Int8Tensor"}
    kept = {name for name in kinds if not is_quantized_linear(name)}
    assert kept and all(kinds[name] == "Parameter" for name in kept)
    assert {name.split(".")[0] for name in kept} <= set(FULL_PRECISION_MODULES)

    request = ActionRequest(domain_name=DOMAIN, image=rgb_image(128, seed=4), seed=11)
    full = engines[None].predict_actions(request).actions
    int8 = engines["int8"].predict_actions(request).actions
    difference = float(np.linalg.norm(int8 - full) / np.linalg.norm(full))
    assert 0.0 < difference < INT8_ACTION_BOUND, difference


def test_the_description_states_the_weights_served(engines):
    digest = checkpoint_sha256(tiny_checkpoint("distilled"))
    for quantization, engine in engines.items():
        weights = engine.describe().weights
        assert weights is not None
        assert (weights.quantization, weights.sha256, weights.revision) == (quantization, digest, None)
        assert engine.describe().as_json()["weights"]["quantization"] == (quantization or "none")


def test_the_checkpoint_digest_is_of_its_files_and_remembered(tmp_path, monkeypatch):
    cache = tmp_path / "digests.json"
    monkeypatch.setenv("COSMOS3_DIGEST_CACHE", str(cache))
    one = shutil.copytree(tiny_checkpoint("distilled"), tmp_path / "one")
    two = shutil.copytree(one, tmp_path / "elsewhere" / "two")
    digest = checkpoint_sha256(one)
    assert digest == checkpoint_sha256(two)  # where a folder lies does not change its digest
    # Remembered: a planted entry for the config file's key is used instead of reading the file.
    entries = json.loads(cache.read_text())
    config = one / "transformer" / "config.json"
    [key] = [k for k in entries if k.startswith(os.path.realpath(config) + "|")]
    entries[key] = "0" * 64
    cache.write_text(json.dumps(entries))
    assert checkpoint_sha256(one) != digest
    # A file whose size or time changed is read again.
    config.write_text(config.read_text())
    os.utime(config, ns=(1, 1))
    assert checkpoint_sha256(one) == digest
    config.write_text(config.read_text() + " ")
    assert checkpoint_sha256(one) != digest


def test_a_hub_cache_snapshot_is_named_by_its_blobs_and_its_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("COSMOS3_DIGEST_CACHE", str(tmp_path / "digests.json"))
    plain = tiny_checkpoint("distilled")
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--nvidia--Cosmos3-Tiny"
    snapshot = repo / "snapshots" / commit
    for path in sorted(p for p in plain.rglob("*") if p.is_file()):
        data = path.read_bytes()
        # Git LFS files' blobs are named by their SHA-256; small files by a git SHA-1 (40 hex).
        name = hashlib.sha256(data).hexdigest() if path.suffix == ".safetensors" else hashlib.sha1(data).hexdigest()
        blob = repo / "blobs" / name
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / path.relative_to(plain)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    assert checkpoint_sha256(snapshot) == checkpoint_sha256(plain)
    assert hub_revision(snapshot) == commit and hub_revision(plain) is None
    # A weight blob's name is trusted as its digest, not read: a blob named for other bytes changes the digest.
    weights = next(snapshot.rglob("*.safetensors"))
    wrong = repo / "blobs" / ("f" * 64)
    wrong.write_bytes(weights.read_bytes())
    weights.unlink()
    weights.symlink_to(os.path.relpath(wrong, weights.parent))
    assert checkpoint_sha256(snapshot) != checkpoint_sha256(plain)


def test_sizes_read_as_vendors_and_operating_systems_write_them():
    assert parse_size("24GiB") == parse_size("24G") == 24 * GIB
    assert parse_size("24GB") == 24 * 10**9 and parse_size("80 gb") == 80 * 10**9
    assert parse_size("1024") == 1024 and parse_size("1.5MiB") == 3 * 2**19
    with pytest.raises(ValueError):
        parse_size("lots")


# -- the installed commands ----------------------------------------------------------------------------


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*args], capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)


def _refusal_line(result: subprocess.CompletedProcess[str], program: str) -> str:
    """The one line a refusal prints: exit 2, no traceback, one line of the program's own."""
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith(f"{program}: error:")]
    assert len(lines) == 1, result.stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize("program", ["cosmos3-serve", "cosmos3-inspect"])
def test_an_unknown_quantization_is_refused_in_one_line(program):
    args = ["--tiny", "distilled", "--no-http"] if program == "cosmos3-serve" else [str(tiny_checkpoint())]
    line = _refusal_line(_run(str(BIN / program), *args, "--quantization", "int3"), program)
    assert "int3" in line and "int8" in line and "fp8" in line


def test_fp8_on_a_machine_without_a_gpu_for_it_is_refused_in_one_line():
    line = _refusal_line(
        _run(str(BIN / "cosmos3-serve"), "--tiny", "distilled", "--no-http", "--quantization", "fp8"), "cosmos3-serve"
    )
    assert "fp8" in line and "CUDA" in line and "int8" in line


@pytest.fixture(scope="module")
def nano_configs(tmp_path_factory):
    """Nano's published shape as a Hub checkpoint fetched for inspection has it: configs and shard index."""
    out = tmp_path_factory.mktemp("nano") / "nano-configs"
    result = _run(str(BIN / "cosmos3-tiny"), str(out), "--shape", "nano", "--no-weights", timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    assert not list(out.rglob("*.safetensors"))
    return out


def test_a_model_too_big_for_this_machine_is_refused_before_anything_loads(nano_configs):
    # Nano at float32 is 57 GiB of transformer: this 24 GiB machine cannot hold it. The checkpoint has no
    # weight files at all, so anything but a refusal before loading would fail otherwise.
    result = _run(str(BIN / "cosmos3-serve"), "--model", str(nano_configs), "--no-http", "--device", "cpu")
    line = _refusal_line(result, "cosmos3-serve")
    assert re.search(r"needs 6\d\.\d GiB .* has \d+\.\d GiB available", line) and "--quantization int8" in line, line


def test_inspect_prints_the_memory_plan_the_server_uses(nano_configs):
    inspect = str(BIN / "cosmos3-inspect")
    result = _run(inspect, str(nano_configs), "--quantization", "int8", "--device-memory", "32GiB", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    plan = json.loads(result.stdout)["memory_plan"]
    expected = plan_memory(
        inspect_checkpoint(nano_configs), dtype="float32", quantization="int8", device_type="cpu"
    ).as_json()
    assert plan == {**expected, "device_memory_bytes": 32 * GIB, "fits": True}
    assert 24 * GIB < plan["need_bytes"] < 32 * GIB  # loading Nano int8 at fp32 on CPU: 25.3 GiB
    result = _run(inspect, str(nano_configs), "--dtype", "bfloat16", "--device", "cuda", "--device-memory", "24GiB")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "memory plan       bfloat16 on cuda" in result.stdout and "does not fit" in result.stdout
