"""cosmos3-train: training batches go through the serving path, and what is trained is what is served.

- **Skew**: the trainer's forward on a noised sample equals the sampler's forward on the same noisy
  inputs (same job, action rows, masks, positions, domain and timestep convention).
- **Overfit**: a few frames are fitted, and ``predict_actions`` (the engine, not the trainer) reproduces them.
- **Given prefixes**: a frame whose label continues a given prefix (``action.prefix_rows``) is conditioned on
  exactly it, without the ``--prefix-noise`` offset; a longer one than ``--max-prefix`` is refused.
- **VAE**: the checkpoint the trainer writes encodes frames to the latents it trained on.
- **Tiny builder**: its VAE does not depend on the transformer's size, and its statistics are its own.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos3_runtime.training import TrainConfig, encode_frames, prepare_training, train

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; mujoco reads it when first imported
pytest.importorskip("mujoco", reason="the `sim` extra (mujoco) is not installed")

from policy_server.recording.demonstrations import collect  # noqa: E402
from robot_clients.sim.reach_task import TASK  # noqa: E402


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reach") / "data"
    collect(out, episodes=2, seed=7, image_size=64, episode_steps=12)
    return out


def _config(dataset: Path, out: Path, **changes) -> TrainConfig:
    settings = {"steps": 0, "batch_size": 4, "seed": 0, "save_every": 0, **changes}
    return TrainConfig(dataset=dataset, out=out, **settings)


def test_the_training_forward_equals_the_samplers_forward_on_the_same_noisy_inputs(small_dataset, tmp_path):
    prep = prepare_training(_config(small_dataset, tmp_path / "ckpt"))
    trainer, sampler = prep.trainer, prep.engine.sampler
    sigma = 0.9
    inputs = trainer.sample_inputs(5, 3, sigma, torch.Generator().manual_seed(1))
    with torch.no_grad():
        preds_vision, preds_action = trainer.predict([inputs])

    item = sampler._prepare(inputs.job, time.perf_counter)
    # The sampler's own layout of the same job: the state row and the prefix rows clean, the chunk noisy.
    assert torch.equal(item.action_mask, inputs.action_mask)
    assert torch.equal(item.vision_mask, inputs.vision_mask)
    lead = inputs.job.leading_rows + 3
    assert torch.allclose(item.x0_action[:lead], inputs.action_latents[:lead])
    # The transformer is fed sigma x 1000, as the scheduler's timesteps are.
    assert float(item.scheduler.timesteps[1]) == pytest.approx(1000.0 * sigma, rel=1e-5)
    item.latents, item.action_latents = inputs.latents, inputs.action_latents
    with torch.no_grad():
        sampler._forward([item], "cond", item.scheduler.timesteps[1], 1, sigma, len(item.scheduler.timesteps))
    served_vision, served_action = item.velocities["cond"]
    width = inputs.job.raw_action_dim
    trained_action = (preds_action[0].float() * (1 - inputs.action_mask))[:, :width]
    assert torch.allclose(trained_action, served_action[:, :width], atol=1e-5)
    trained_vision = preds_vision[0].float().reshape(served_vision.shape) * (1 - inputs.vision_mask)
    assert torch.allclose(trained_vision, served_vision, atol=1e-5)


def test_a_batchs_loss_and_gradients_are_the_mean_of_its_samples_taken_one_at_a_time(small_dataset, tmp_path):
    """A training batch is one packed call whose samples share their prompt's text once: its loss and its
    gradients (the shared text's included) are those of the samples run alone, averaged."""
    trainer = prepare_training(_config(small_dataset, tmp_path / "ckpt")).trainer
    transformer = trainer.engine.pipe.transformer
    transformer.requires_grad_(True)
    params = list(transformer.parameters())
    indexes, prefixes, t = [1, 4, 9], [0, 3, 5], torch.tensor([0.2, 0.5, 0.9])

    def loss_and_grads(idx: list[int], pre: list[int], times: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
        transformer.zero_grad(set_to_none=True)
        loss, _, _ = trainer.batch_loss(idx, pre, times, torch.Generator().manual_seed(sum(idx) + 7 * sum(pre)))
        loss.backward()
        return float(loss.detach()), [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]

    # One generator per call draws each sample's noise: draw the batch's with the per-sample seeds instead.
    singles = [loss_and_grads([i], [p], t[k : k + 1]) for k, (i, p) in enumerate(zip(indexes, prefixes))]
    inputs = [
        trainer.sample_inputs(i, p, float(t[k]), torch.Generator().manual_seed(i + 7 * p))
        for k, (i, p) in enumerate(zip(indexes, prefixes))
    ]
    transformer.zero_grad(set_to_none=True)
    preds_vision, preds_action = trainer.predict(inputs)
    assert len(preds_action) == 3
    terms = [trainer.sample_loss(pv, pa, x) for pv, pa, x in zip(preds_vision, preds_action, inputs)]
    cfg = trainer.cfg
    together = sum(cfg.action_weight * action + cfg.video_weight * vision for action, vision in terms) / 3
    together.backward()
    grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
    assert float(together) == pytest.approx(np.mean([loss for loss, _ in singles]), rel=1e-5)
    for k, grad in enumerate(grads):
        expected = sum(g[k] for _, g in singles) / 3
        assert torch.allclose(grad, expected, atol=1e-6, rtol=1e-4), k


def test_the_checkpoint_encodes_frames_to_the_latents_it_was_trained_on(small_dataset, tmp_path):
    from cosmos3_runtime.engine import Cosmos3Engine
    from cosmos3_runtime.lerobot_dataset import read_dataset

    prep = prepare_training(_config(small_dataset, tmp_path / "ckpt"))
    trained = prep.trainer.samples.latents
    served = Cosmos3Engine.load(prep.ckpt, device="cpu", prefix_cache_mb=0)
    frames = np.concatenate([e.images for e in read_dataset(small_dataset).episodes])
    latents, _ = encode_frames(served, frames, 256)
    assert torch.allclose(latents, trained, atol=1e-4)
    # The drawn VAE's statistics are the data's: the trained latents have zero mean and unit spread.
    per_channel = trained.transpose(0, 1).reshape(trained.shape[1], -1)
    assert per_channel.mean(1).abs().max() < 1e-3
    assert (per_channel.std(1) - 1).abs().max() < 1e-3
    config = json.loads((prep.ckpt / "vae" / "config.json").read_text())
    assert config["latents_std"] != [1.0] * len(config["latents_std"])


def test_a_small_batch_is_overfitted_and_predict_actions_reproduces_it(small_dataset, tmp_path):
    from cosmos3_runtime.engine import Cosmos3Engine
    from cosmos3_runtime.lerobot_dataset import read_dataset
    from cosmos3_runtime.requests import ActionRequest

    cfg = _config(small_dataset, tmp_path / "ckpt", steps=400, batch_size=8, lr=3e-3, warmup=20, max_prefix=0)
    summary = train(cfg)
    assert summary["action_loss_last50"] < 0.2
    engine = Cosmos3Engine.load(tmp_path / "ckpt", device="cpu", prefix_cache_mb=0)
    # The first frame of each episode: the arm at its start pose, two cube places; only the image tells them apart.
    episodes = read_dataset(small_dataset).episodes
    expected = np.array([e.actions[np.minimum(np.arange(16), len(e.actions) - 1)] for e in episodes])
    chunks = np.array(
        [
            engine.predict_actions(
                ActionRequest(
                    domain_name="cosmos3_mujoco_arm", image=e.images[0], state=e.state[0], prompt=TASK, seed=0
                )
            ).actions
            for e in episodes
        ]
    )
    errors = np.abs(chunks - expected).mean(axis=(1, 2))
    baseline = np.abs(expected.mean(0, keepdims=True) - expected).mean(axis=(1, 2))
    assert np.mean(errors) < 0.5 * np.mean(baseline), (errors, baseline)


def test_offset_prefixes_move_every_prefix_row_by_one_offset_and_leave_the_chunk_alone(small_dataset, tmp_path):
    """--prefix-noise: the clean prefix rows are the chunk's first rows plus one offset (the same on every
    row, as a policy's previous chunk is off by its error); the rows the loss asks for are the data's."""
    exact = prepare_training(_config(small_dataset, tmp_path / "exact")).trainer
    offset = prepare_training(_config(small_dataset, tmp_path / "offset", prefix_noise=1.0)).trainer
    prefix = 4
    a = exact.sample_inputs(3, prefix, 0.7, torch.Generator().manual_seed(2))
    b = offset.sample_inputs(3, prefix, 0.7, torch.Generator().manual_seed(2))
    lead, width = a.job.leading_rows, a.job.raw_action_dim
    rows = slice(lead, lead + prefix)
    assert torch.equal(a.action_mask, b.action_mask)
    shift = (b.action_latents[rows] - a.action_latents[rows])[:, :width]
    assert shift.abs().min() > 0  # every prefix entry moved
    assert torch.allclose(shift, shift[:1].expand_as(shift), atol=1e-5)  # by one offset
    assert torch.equal(a.action_latents[:lead], b.action_latents[:lead])  # the state row is untouched
    # The rows the loss asks for: x_t = t*eps + (1-t)*x0 and target = eps - x0 give x0 = x_t - t*target.
    chunk = slice(lead + prefix, None)
    x0_a = (a.action_latents - 0.7 * a.action_target)[chunk, :width]
    x0_b = (b.action_latents - 0.7 * b.action_target)[chunk, :width]
    assert torch.allclose(x0_a, x0_b, atol=1e-5)


@pytest.fixture(scope="module")
def prefixed_dataset(tmp_path_factory) -> Path:
    """The moving task's DAgger labels, 2 episodes of 12 ticks: the expert's (no given prefix), then a
    student's, every frame's label continuing the rows it was about to execute (action.prefix_rows)."""
    from policy_server.recording.demonstrations import collect_moving

    out = tmp_path_factory.mktemp("moving") / "data"
    collect_moving(
        out, 2, seed=7, image_size=64, episode_steps=12, chunk_labels=True, perturbed=0.5, student_prefixes=1.0
    )
    return out


def test_a_given_prefix_is_conditioned_as_recorded_without_offset_and_the_others_drawn(prefixed_dataset, tmp_path):
    """A frame whose label continues a given prefix is trained with exactly that prefix, clean (no
    --prefix-noise offset), the loss on the rows after it; the other frames draw theirs as before."""
    from cosmos3_runtime.lerobot_dataset import DatasetError, read_dataset

    episodes = read_dataset(prefixed_dataset).episodes
    given = np.concatenate([e.prefix_rows for e in episodes if e.prefix_rows is not None])
    assert given.shape == (24,) and not given[:12].any() and given[12:].all()
    with pytest.raises(DatasetError, match="--max-prefix"):  # a given prefix longer than any trained
        prepare_training(_config(prefixed_dataset, tmp_path / "short", max_prefix=int(given.max()) - 1))

    exact = prepare_training(_config(prefixed_dataset, tmp_path / "exact", max_prefix=12)).trainer
    noisy = prepare_training(_config(prefixed_dataset, tmp_path / "noisy", max_prefix=12, prefix_noise=1.0))
    offset = noisy.trainer
    np.testing.assert_array_equal(offset.samples.given_prefix, given)
    assert (
        json.loads((noisy.ckpt / "policy_profiles.json").read_text())["domains"]["cosmos3_mujoco_arm"]["max_prefix"]
        == 12
    )
    drawn = offset.draw_prefixes(list(range(24)) * 20, np.random.default_rng(0))
    assert drawn[12:24] == given[12:].tolist()  # always the given one
    expert_frames = [p for k, p in enumerate(drawn) if k % 24 < 12]
    assert 0 in expert_frames and len(set(expert_frames)) > 5  # drawn: none, or 1 to 12 rows of its own chunk

    def clean_rows(trainer, index: int, prefix: int) -> torch.Tensor:
        x = trainer.sample_inputs(index, prefix, 0.7, torch.Generator().manual_seed(2))
        lead = x.job.leading_rows
        assert x.action_mask[lead : lead + prefix].all() and not x.action_mask[lead + prefix :].any()
        return x.action_latents[lead : lead + prefix, : x.job.raw_action_dim]

    k = 12 + int(np.argmax(given[12:] > 1))
    d = int(given[k])
    # The given prefix is the label's first rows, as recorded (the student's), not moved by --prefix-noise...
    rows = clean_rows(offset, k, d)
    assert torch.equal(rows, clean_rows(exact, k, d))
    profile = exact.job(k, d, seed=0)[1]
    np.testing.assert_allclose(rows.numpy(), profile.to_model(exact.samples.chunks[k, :d]), atol=1e-6)
    # ...while a prefix drawn from an expert frame's own chunk is.
    assert not torch.equal(clean_rows(offset, 3, d), clean_rows(exact, 3, d))
    with pytest.raises(ValueError, match="given prefix"):
        offset.sample_inputs(k, d - 1, 0.7, torch.Generator().manual_seed(2))


def test_a_moving_average_is_served_and_a_resumed_run_continues_from_the_trained_weights(small_dataset, tmp_path):
    """--ema-decay: the checkpoint holds the average; a run stopped and resumed ends where one whole run ends."""
    from safetensors.torch import load_file

    def weights(ckpt: Path) -> dict[str, torch.Tensor]:
        return {k: v for f in sorted((ckpt / "transformer").glob("*.safetensors")) for k, v in load_file(f).items()}

    whole = _config(small_dataset, tmp_path / "whole", steps=6, ema_decay=0.9, max_prefix=2, prefix_noise=0.5)
    train(whole)
    first = _config(small_dataset, tmp_path / "split", steps=3, ema_decay=0.9, max_prefix=2, prefix_noise=0.5)
    train(first)
    train(
        _config(small_dataset, tmp_path / "split", steps=6, ema_decay=0.9, max_prefix=2, prefix_noise=0.5, resume=True)
    )
    served_whole, served_split = weights(tmp_path / "whole"), weights(tmp_path / "split")
    assert served_whole.keys() == served_split.keys()
    for name in served_whole:
        assert torch.allclose(served_whole[name], served_split[name], atol=1e-6), name
    # What is served is not the trained weights themselves (kept in the state for --resume).
    trained = torch.load(tmp_path / "whole" / "training_state.pt", weights_only=False)["trained_weights"]
    assert len(trained) == len(served_whole)
    norm_trained = sum(float(t.double().square().sum()) for t in trained)
    norm_served = sum(float(t.double().square().sum()) for t in served_whole.values())
    assert abs(norm_trained - norm_served) > 1e-6 * norm_trained


LEROBOT_PYTHON = Path(
    os.environ.get("LEROBOT_PYTHON", Path(__file__).resolve().parent.parent / ".venv-lerobot/bin/python")
)


@pytest.mark.skipif(not LEROBOT_PYTHON.exists(), reason="LeRobot's virtualenv is missing; `make test` builds it")
def test_lerobot_loads_the_demonstrations_and_so_does_the_trainer(small_dataset):
    import subprocess

    from cosmos3_runtime.lerobot_dataset import read_dataset

    script = Path(__file__).resolve().parent / "lerobot_demos_script.py"
    done = subprocess.run([str(LEROBOT_PYTHON), str(script), str(small_dataset)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    ours = read_dataset(small_dataset)
    assert read["frames"] == ours.frames == 24 and read["episodes"] == len(ours.episodes) == 2
    assert read["fps"] == ours.fps == 20
    assert read["shapes"]["observation.images.front"] == [3, 64, 64]
    assert read["task"] == TASK
    np.testing.assert_allclose(read["last_action"], ours.episodes[-1].actions[-1], rtol=1e-6)


def test_the_tiny_vae_is_the_same_whatever_the_transformer_and_its_statistics_are_its_own(tmp_path):
    from cosmos3_runtime.random_checkpoints import build_tiny_checkpoint

    a = build_tiny_checkpoint(tmp_path / "a", seed=3)
    b = build_tiny_checkpoint(tmp_path / "b", seed=3, transformer_overrides={"hidden_size": 96})
    from safetensors.torch import load_file

    wa = load_file(a / "vae" / "diffusion_pytorch_model.safetensors")
    wb = load_file(b / "vae" / "diffusion_pytorch_model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    config = json.loads((a / "vae" / "config.json").read_text())
    assert config["latents_mean"] != [0.0] * len(config["latents_mean"])
    assert max(config["latents_std"]) < 0.5  # a random encoder's latents spread far less than unit
