"""Checkpoints: tiny builds in the real layout, resolution of sources, variant detection, tolerant loading."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from cosmos3_runtime.checkpoints import CheckpointSource, inspect_checkpoint
from cosmos3_runtime.cli import inspect_main, tiny_main
from cosmos3_runtime.engine import Cosmos3Engine
from cosmos3_runtime.errors import CheckpointError, UnsupportedModeError
from cosmos3_runtime.random_checkpoints import TINY_DISTILLED_SIGMAS, build_tiny_checkpoint
from cosmos3_runtime.requests import ActionRequest


def _digest(folder):
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(folder)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def test_tiny_checkpoint_has_the_diffusers_layout_and_is_small(tiny_checkpoint):
    path = tiny_checkpoint("distilled")
    for rel in (
        "model_index.json",
        "transformer/config.json",
        "transformer/diffusion_pytorch_model.safetensors",
        "vae/config.json",
        "vae/diffusion_pytorch_model.safetensors",
        "scheduler/scheduler_config.json",
        "text_tokenizer/tokenizer.json",
        "text_tokenizer/tokenizer_config.json",
    ):
        assert (path / rel).is_file(), rel
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    assert size < 50e6
    index = json.loads((path / "model_index.json").read_text())
    assert index["_class_name"] == "Cosmos3OmniPipeline"


def test_tiny_checkpoint_is_deterministic(tmp_path):
    a = build_tiny_checkpoint(tmp_path / "a", "base", seed=3)
    b = build_tiny_checkpoint(tmp_path / "b", "base", seed=3)
    c = build_tiny_checkpoint(tmp_path / "c", "base", seed=4)
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest(c)


@pytest.mark.parametrize(
    "variant, edge, distilled",
    [("base", False, False), ("edge", True, False), ("distilled", False, True), ("edge-distilled", True, True)],
)
def test_variant_detection(tiny_checkpoint, variant, edge, distilled):
    info = inspect_checkpoint(tiny_checkpoint(variant))
    assert (info.variant, info.is_edge, info.is_distilled) == (variant, edge, distilled)
    assert info.has_action_head and info.action_dim == 64 and info.num_embodiment_domains == 32
    assert info.distilled_sigmas == (TINY_DISTILLED_SIGMAS if distilled else None)
    assert info.resolution_tiers == ((256, 480) if edge else (256, 480, 704, 720))
    # Parameter count from the safetensors headers equals the loaded modules' count.
    assert info.parameters > 0 and info.parameter_bytes == 4 * info.parameters


@pytest.mark.parametrize(
    "changes, edge",
    [
        ({"backbone_type": "cosmos3_edge_nemotron_dense"}, True),
        ({"hidden_act": "relu2"}, True),
        # Names that merely contain "edge" or "nemotron" are not the Edge backbone.
        ({"backbone_type": "nemotron_inspired_dense"}, False),
        ({"backbone_type": "cosmos3_edge_nemotron_dense_v2"}, False),
        ({"model_type": "cosmos3_edge"}, False),
    ],
)
def test_edge_is_recognised_by_exact_values(tiny_checkpoint, tmp_path, changes, edge):
    path = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("base"), path)
    config_path = path / "transformer" / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), **changes}))
    assert inspect_checkpoint(path).is_edge is edge


def test_a_distilled_sigma_list_on_unipc_is_refused_at_load(tiny_checkpoint, tmp_path, monkeypatch):
    """Before: it loaded, then every request failed inside UniPC.set_timesteps (an engine_error per robot)."""
    path = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("base"), path)
    (path / "modular_model_index.json").write_text(json.dumps({"distilled_sigmas": TINY_DISTILLED_SIGMAS}))
    assert inspect_checkpoint(path).is_distilled  # what the checkpoint claims stays inspectable
    import diffusers

    weights_read = []
    monkeypatch.setattr(
        diffusers.Cosmos3OmniTransformer, "from_pretrained", classmethod(lambda cls, *a, **k: weights_read.append(a))
    )
    with pytest.raises(CheckpointError) as err:
        Cosmos3Engine.load(path)
    assert "UniPCMultistepScheduler" in err.value.message and "FlowMatchEulerDiscreteScheduler" in err.value.message
    assert weights_read == []  # refused before any weight is read


def test_parameter_count_matches_loaded_modules(tiny_engine):
    engine = tiny_engine("distilled")
    loaded = sum(p.numel() for m in (engine.pipe.transformer, engine.pipe.vae) for p in m.parameters())
    assert engine.info.parameters == loaded


def test_distilled_sigmas_from_modular_model_index(tiny_checkpoint, tmp_path):
    """diffusers' own convention: distilled_sigmas in modular_model_index.json."""
    path = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("distilled"), path)
    config_path = path / "scheduler" / "scheduler_config.json"
    config = json.loads(config_path.read_text())
    del config["fixed_step_sampler_config"]
    config_path.write_text(json.dumps(config))
    assert not inspect_checkpoint(path).is_distilled
    (path / "modular_model_index.json").write_text(json.dumps({"distilled_sigmas": [1.0, 0.8, 0.4]}))
    info = inspect_checkpoint(path)
    assert info.is_distilled and info.distilled_sigmas == [1.0, 0.8, 0.4]


def test_legacy_pipeline_class_name_loads(tiny_checkpoint, camera_image):
    path = tiny_checkpoint("distilled", legacy_class_name=True)
    assert json.loads((path / "model_index.json").read_text())["_class_name"] == "Cosmos3OmniDiffusersPipeline"
    engine = Cosmos3Engine.load(path)
    chunk = engine.predict_actions(ActionRequest(domain_name="fractal", image=camera_image, seed=0))
    assert chunk.actions.shape == (16, 10)


def test_unknown_scheduler_keys_are_tolerated(tiny_checkpoint, tmp_path, camera_image):
    path = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("base"), path)
    config_path = path / "scheduler" / "scheduler_config.json"
    config = json.loads(config_path.read_text())
    config["some_future_option"] = {"nested": [1, 2]}
    config_path.write_text(json.dumps(config))
    info = inspect_checkpoint(path)
    assert info.ignored_scheduler_keys == ["some_future_option"]
    engine = Cosmos3Engine.load(path)
    chunk = engine.predict_actions(ActionRequest(domain_name="fractal", image=camera_image, num_steps=2, seed=0))
    assert chunk.num_steps == 2


def test_distilled_keeps_the_unaccepted_schedule_key_for_inspection(tiny_checkpoint):
    info = inspect_checkpoint(tiny_checkpoint("distilled"))
    assert "fixed_step_sampler_config" in info.ignored_scheduler_keys


def test_checkpoint_without_action_head_refuses_action_modes(tiny_checkpoint, camera_image):
    engine = Cosmos3Engine.load(tiny_checkpoint("distilled", with_action_head=False))
    assert engine.describe().modes == ()
    with pytest.raises(UnsupportedModeError) as err:
        engine.predict_actions(ActionRequest(domain_name="fractal", image=camera_image))
    assert err.value.field == "action_mode" and "no action head" in err.value.message


def test_not_a_cosmos3_checkpoint(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    with pytest.raises(CheckpointError, match="not a Cosmos3 checkpoint"):
        inspect_checkpoint(tmp_path)


@pytest.mark.parametrize(
    "text, repo, sub, rev",
    [
        ("nvidia/Cosmos3-Policy", "nvidia/Cosmos3-Policy", None, None),
        ("nvidia/Cosmos3-Policy@v1.1", "nvidia/Cosmos3-Policy", None, "v1.1"),
        ("nvidia/Cosmos3-Policy/distilled/edge", "nvidia/Cosmos3-Policy", "distilled/edge", None),
    ],
)
def test_hub_ids_parse(text, repo, sub, rev):
    source = CheckpointSource.parse(text)
    assert (source.repo_id, source.subfolder, source.revision) == (repo, sub, rev)
    assert not source.is_local


def test_local_folder_and_bad_sources(tmp_path):
    assert CheckpointSource.parse(tmp_path).local_path == tmp_path.resolve()
    with pytest.raises(CheckpointError, match="does not exist"):
        CheckpointSource.parse("./no/such/folder")
    with pytest.raises(CheckpointError, match="neither an existing folder nor a Hub id"):
        CheckpointSource.parse("justaname")


def test_offline_hub_id_gives_an_error_naming_the_id(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(CheckpointError) as err:
        Cosmos3Engine.load("nvidia/Cosmos3-Not-Cached/distilled")
    assert "nvidia/Cosmos3-Not-Cached/distilled" in str(err.value)
    assert "offline" in str(err.value)


def test_inspect_cli_prints_everything(tiny_checkpoint, capsys):
    assert inspect_main([str(tiny_checkpoint("edge-distilled"))]) == 0
    out = capsys.readouterr().out
    for needle in (
        "edge-distilled",
        "FlowMatchEulerDiscreteScheduler",
        "0.9997",
        "action_dim 64",
        "bridge_orig_lerobot",
        "quantile",
        "mean_std",
        "parameters",
        "256, 480",
    ):
        assert needle in out, needle
    assert inspect_main([str(tiny_checkpoint("base")), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["variant"] == "base" and data["domains"]["fractal"]["raw_action_dim"] == 10


def test_inspect_prints_each_domains_profile_and_the_defaults_it_resolves_to(tiny_checkpoint, capsys):
    assert inspect_main([str(tiny_checkpoint("base", droid=True))]) == 0
    out = capsys.readouterr().out
    assert "variant defaults  35 steps, guidance 6.0, tier 480" in out
    assert "default domain    droid_lerobot: chunk 32, tier 480, 15 fps, concat_view\n" in out
    # NVIDIA's DROID serving settings, from the profile: 4 steps with guidance, two forwards each.
    assert "default sampler   4 steps, guidance 3, shift 5: 8 transformer forwards a chunk" in out
    droid = next(line for line in out.splitlines() if line.strip().startswith("droid_lerobot"))
    for needle in (
        "width  8",
        "chunk 32",
        "15 fps",
        "tier 480",
        "concat_view",
        "space joint_pos",
        "state 1 x 8 (last row: the current state)",
        "gripper flipped at 7",
        "The top row is from the wrist",
    ):
        assert needle in droid, needle
    assert inspect_main([str(tiny_checkpoint("edge"))]) == 0
    assert "variant defaults  35 steps, guidance 5.0, tier 256" in capsys.readouterr().out
    assert inspect_main([str(tiny_checkpoint("base", droid=True)), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["defaults"]["domain_name"] == "droid_lerobot"
    droid = data["domains"]["droid_lerobot"]
    assert (droid["defaults"]["num_steps"], droid["defaults"]["guidance_scale"], droid["defaults"]["shift"]) == (
        4,
        3.0,
        5.0,
    )
    assert droid["defaults"]["guidance_interval"] is None and droid["transformer_forwards"] == 8
    assert droid["state_dim"] == 8
    # The Edge DROID recipe: guidance only in timesteps 960-1001, the first of the 4 steps.
    assert inspect_main([str(tiny_checkpoint("edge", droid=True)), "--json"]) == 0
    edge = json.loads(capsys.readouterr().out)["domains"]["droid_lerobot"]
    assert edge["defaults"]["guidance_interval"] == [0.96, 1.0] and edge["transformer_forwards"] == 5


def test_cosmos3_tiny_droid_is_one_of_nvidias_droid_policies(tmp_path, capsys):
    """``--droid`` writes what NVIDIA's Edge DROID export carries (checkpoint.json's policy block) and no
    DROID profile: the runtime recognises the checkpoint and applies NVIDIA's DROID contract."""
    from cosmos3_runtime.profiles import profiles_for_checkpoint

    folder = tmp_path / "droid"
    assert tiny_main([str(folder), "--variant", "edge-distilled", "--droid"]) == 0
    policy = json.loads((folder / "checkpoint.json").read_text())["policy"]
    assert policy == {"action_chunk_size": 32, "conditioning_fps": 15.0, "domain_name": "droid_lerobot"}
    shipped = json.loads((folder / "policy_profiles.json").read_text())["domains"]
    assert "droid_lerobot" not in shipped and "bridge_orig_lerobot" in shipped  # the other tiny profiles stay
    table = profiles_for_checkpoint(folder, inspect_checkpoint(folder))
    droid = table.domains["droid_lerobot"]
    assert table.default_domain == "droid_lerobot"
    assert (
        droid.raw_action_dim,
        droid.state_dim,
        droid.use_state,
        droid.history_length,
        droid.gripper_flip_index,
        droid.normalization,
        droid.resolution_tier,
        droid.view_point,
        droid.default_horizon,
        droid.fps,
    ) == (8, 8, True, 1, 7, None, 480, "concat_view", 32, 15.0)
    # A distilled checkpoint runs its own list: NVIDIA's sampler is not applied to it.
    assert (droid.num_steps, droid.guidance_scale, droid.shift, droid.guidance_interval) == (None, None, None, None)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="glibc's heap, on Linux")
def test_a_loaded_engine_keeps_its_heap_between_requests(tiny_engine, camera_image):
    """A load hands freed memory back to the system as it goes (see ``_freed_memory_returned``); serving must
    not. Setting glibc's mmap threshold for the load froze its trim threshold at 128 KiB: every request then
    returned its temporaries' pages and faulted them in again at the next, about 2,000 page faults a tiny
    request. (The other half, a worker thread's arena deleting a heap a request left free, happened in one
    start of the server of two; ``benchmarks/realtime_roundtrip.py`` prints the server's faults a request.)"""
    import resource

    engine = tiny_engine("distilled")
    request = ActionRequest(domain_name=engine.default_domain(), image=camera_image, seed=1)
    for _ in range(3):
        engine.predict_actions(request)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        engine.predict_actions(request)
    per_request = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5
    # Given back each time: 1,722 (the trim threshold alone) to 7,231 a request. The process's other threads (the
    # servers of other test modules) add up to a few hundred in the whole suite (350 seen once).
    assert per_request < 1000, f"{per_request:.0f} page faults a request"
