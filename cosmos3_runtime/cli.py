"""Command-line entry points of the runtime: ``cosmos3-tiny``, ``cosmos3-inspect``, ``cosmos3-demo``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import CheckpointError
from .memory_plan import GIB, MemoryPlan, available_memory, dtype_name, parse_size, plan_memory
from .quantization import Quantization, parse_quantization

if TYPE_CHECKING:
    from .checkpoints import CheckpointInfo
    from .description import RequestDefaults
    from .profiles import PolicyProfile


def tiny_main(argv: list[str] | None = None) -> int:
    """Build a random Cosmos3 checkpoint in the real diffusers layout, offline: tiny, or a published shape."""
    from .random_checkpoints import SHAPES, VARIANTS, build_tiny_checkpoint

    parser = argparse.ArgumentParser(prog="cosmos3-tiny", description=tiny_main.__doc__)
    parser.add_argument("out", type=Path, help="folder to write (replaced if it exists)")
    parser.add_argument(
        "--shape",
        choices=SHAPES,
        default="tiny",
        help="tiny (0.7 M parameters, default) or a published size with random bf16 weights: "
        "edge (3.4 B, 8 GB on disk), nano (15.2 B), super (64 B)",
    )
    parser.add_argument(
        "--variant", choices=VARIANTS, default=None, help="default: distilled (edge-distilled for --shape edge)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="where published-shape weights are drawn: cpu (default) or cuda")
    parser.add_argument(
        "--no-weights",
        action="store_true",
        help="a published shape's config files and shard index only, as a Hub checkpoint fetched for inspection: "
        "enough for cosmos3-inspect's memory plan",
    )
    parser.add_argument(
        "--legacy-class-name", action="store_true", help="write the older Cosmos3OmniDiffusersPipeline _class_name"
    )
    parser.add_argument("--no-action-head", action="store_true", help="a video-only transformer")
    parser.add_argument(
        "--droid",
        action="store_true",
        help="ship a DROID joint-position profile (state-conditioned, "
        "chunk 32 x 8) for droid_lerobot, the default domain; see docs/runtime.md",
    )
    parser.add_argument(
        "--droid-midtrain",
        action="store_true",
        help="the same DROID profile in the midtrain end-effector action space (poses [x, y, z, qx, qy, qz, "
        "qw, gripper] in and out); see docs/runtime.md",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.shape == "tiny":
        if args.device is not None or args.no_weights:
            parser.error("--device and --no-weights apply to the published shapes (edge, nano, super) only")
        variant = args.variant or "distilled"
        path = build_tiny_checkpoint(
            args.out,
            variant,
            seed=args.seed,
            legacy_class_name=args.legacy_class_name,
            with_action_head=not args.no_action_head,
            droid=args.droid,
            droid_midtrain=args.droid_midtrain,
        )
    else:
        from .random_checkpoints import PUBLISHED_SHAPES, build_shaped_checkpoint, resolve_variant

        if args.legacy_class_name or args.no_action_head or args.droid or args.droid_midtrain:
            parser.error(
                "--legacy-class-name, --no-action-head, --droid and --droid-midtrain apply to --shape tiny only"
            )
        try:
            variant = resolve_variant(PUBLISHED_SHAPES[args.shape], args.variant)
        except ValueError as exc:
            parser.error(str(exc))
        path = build_shaped_checkpoint(
            args.out, args.shape, variant, seed=args.seed, device=args.device or "cpu", weights=not args.no_weights
        )
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    print(
        f"built {args.shape} {variant} checkpoint at {path} in {time.perf_counter() - started:.2f} s, "
        f"{size / 1e6:,.2f} MB"
    )
    return 0


def inspect_main(argv: list[str] | None = None) -> int:
    """Print what a Cosmos3 checkpoint is: variant, defaults, action head, each domain's profile, schedule, size."""
    from .checkpoints import CheckpointSource, inspect_checkpoint
    from .description import EngineSpec, ModelDescription
    from .profiles import profiles_for_checkpoint

    parser = argparse.ArgumentParser(prog="cosmos3-inspect", description=inspect_main.__doc__)
    parser.add_argument("checkpoint", help="local folder, Hub id (namespace/repo[/subfolder][@revision])")
    parser.add_argument("--revision", default=None)
    parser.add_argument("--profiles", default=None, help="an operator profile file to merge")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--quantization",
        default="none",
        metavar="{none,int8,fp8}",
        help="plan the memory with the transformer's linear layers quantized (as cosmos3-serve --quantization)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="plan for a load onto this kind of device (default: this machine's best)",
    )
    parser.add_argument("--dtype", default=None, help="the serving dtype to plan at (default: the device's best)")
    parser.add_argument(
        "--device-memory",
        default=None,
        metavar="SIZE",
        help="the device memory to plan against, e.g. 24GiB or 80GB (default: what this machine's device has free)",
    )
    args = parser.parse_args(argv)
    try:
        quantization = parse_quantization(args.quantization)
        device_memory = parse_size(args.device_memory) if args.device_memory is not None else None
    except (CheckpointError, ValueError) as exc:
        parser.exit(2, f"cosmos3-inspect: error: {exc}\n")
    try:
        local = CheckpointSource.parse(args.checkpoint, revision=args.revision).resolve(config_only=True)
        info = inspect_checkpoint(local)
        spec = EngineSpec.for_checkpoint(info, profiles_for_checkpoint(local, info, args.profiles, args.checkpoint))
        plan, where = _memory_plan(info, args.device, args.dtype, quantization, device_memory)
    except CheckpointError as exc:
        print(f"cosmos3-inspect: {exc}", file=sys.stderr)
        return 2
    description = ModelDescription.of_spec(spec, args.checkpoint)
    if args.json:
        described = description.as_json()
        summary = info.summary()
        summary["defaults"] = described["defaults"]
        summary["domains"] = described["domains"]
        summary["memory_plan"] = plan.as_json()
        print(json.dumps(summary, indent=2))
        return 0
    print(f"checkpoint        {args.checkpoint}")
    print(f"pipeline class    {info.pipeline_class}")
    print(f"variant           {info.variant} (edge: {info.is_edge}, distilled: {info.is_distilled})")
    print(
        f"variant defaults  {spec.default_steps} steps, guidance {spec.default_guidance:.1f}, tier {spec.default_tier}"
    )
    if spec.default_domain:
        default = spec.default_domain
        interval = description.defaults.guidance_interval
        guided = f", guidance in sigmas {list(interval)}" if interval else ""
        print(f"default domain    {default}: {description.defaults.chunk_text()}{guided}")
        print(f"default sampler   {description.defaults.sampler_text(description.chunk_forwards.get(default))}")
    print(
        f"scheduler         {info.scheduler_class}"
        + (
            f" (keys it does not accept, ignored: {', '.join(info.ignored_scheduler_keys)})"
            if info.ignored_scheduler_keys
            else ""
        )
    )
    print(f"distilled sigmas  {info.distilled_sigmas if info.distilled_sigmas else '-'}")
    print(f"action head       {'yes, action_dim ' + str(info.action_dim) if info.has_action_head else 'no'}")
    print(f"embodiment slots  {info.num_embodiment_domains}")
    print(f"resolution tiers  {', '.join(map(str, info.resolution_tiers))}")
    for name, w in info.weights.items():
        print(f"{name:<17} {w.parameters:,} parameters, {w.bytes / 1e6:,.2f} MB in {w.files} file(s)")
    print(f"total             {info.parameters:,} parameters, {info.parameter_bytes / 1e6:,.2f} MB")
    _print_memory_plan(plan, where)
    if spec.profiles:
        print(f"domains ({len(spec.profiles)}), each with the defaults it resolves to:")
        for name, profile in description.domains.items():
            label = name + (" (default)" if name == spec.default_domain else "")
            print("  " + _domain_line(label, profile, description.domain_defaults[name]))
            print(
                "  " + " " * 30 + " " + description.domain_defaults[name].sampler_text(description.chunk_forwards[name])
            )
    return 0


def _memory_plan(
    info: CheckpointInfo,
    device_type: str | None,
    dtype: str | None,
    quantization: Quantization | None,
    device_memory: int | None,
) -> tuple[MemoryPlan, str]:
    """The plan ``cosmos3-inspect`` prints, and what its device memory is (given, or this machine's)."""
    import torch

    from .checkpoints import resolve_device_and_dtype

    if device_type == "cuda" and device_memory is None and not torch.cuda.is_available():
        raise CheckpointError("--device cuda on a machine without a CUDA GPU needs --device-memory")
    device, torch_dtype = resolve_device_and_dtype(device_type, dtype)
    plan = plan_memory(info, dtype=dtype_name(torch_dtype), quantization=quantization, device_type=device.type)
    if device_memory is not None:
        return dataclasses.replace(plan, device_memory_bytes=device_memory), "--device-memory"
    room, where = available_memory(device)
    return dataclasses.replace(plan, device_memory_bytes=room), f"{where}, free now"


def _print_memory_plan(plan: MemoryPlan, where: str) -> None:
    def size(value: int) -> str:  # GiB, or MiB for the tiny checkpoints
        return f"{value / GIB:>9,.2f} GiB" if value >= GIB // 10 else f"{value / 2**20:>9,.2f} MiB"

    print(f"memory plan       {plan.precision} on {plan.device_type} (docs/runtime.md, 'Memory plan')")
    for component in plan.components:
        quantized = (
            f" (quantized linear weights {size(component.quantized_bytes).strip()})"
            if component.quantized_bytes
            else ""
        )
        print(f"  {component.name:<15} {size(component.bytes)}{quantized}")
    print(f"  {'weights':<15} {size(plan.weight_bytes)}")
    print(
        f"  {'needs':<15} {size(plan.need_bytes)} to load and serve "
        f"(with {size(plan.reserve_bytes).strip()} for activations and the runtime)"
    )
    assert plan.device_memory_bytes is not None, "inspect plans against a known amount"
    verdict = "fits" if plan.fits else "does not fit"
    print(f"  {'device memory':<15} {size(plan.device_memory_bytes)} ({where}): {verdict}")


def _domain_line(name: str, p: PolicyProfile, r: RequestDefaults) -> str:
    """One domain of ``cosmos3-inspect``: id, width, chunk, fps, tier, view, prompt format, stats; then what
    only some domains have: action space, state, gripper flip, guidance interval, view layout."""
    stats = p.normalization.kind if p.normalization is not None else "-"
    line = (
        f"{name:<30} id {p.domain_id:>2}  width {p.raw_action_dim:>2}  {r.chunk_text():<44}  "
        f"{p.prompt_format:<5}  stats: {stats}"
    )
    extras = []
    widths = f" (model rows {p.model_action_dim} wide)" if p.model_action_dim != p.raw_action_dim else ""
    extras.append(f"space {p.action_space}{widths}")
    if p.state_dim is not None:
        extras.append(
            f"state {p.history_length} x {p.state_dim}"
            + (" (last row: the current state)" if p.use_state else " (history only)")
        )
    if p.gripper_flip_index is not None:
        extras.append(f"gripper flipped at {p.gripper_flip_index}")
    if r.guidance_interval is not None:
        extras.append(f"guidance in sigmas {list(r.guidance_interval)}")
    if p.view_description:
        extras.append(f"view: {p.view_description!r}")
    return line + ("  " + "; ".join(extras) if extras else "")


def demo_main(argv: list[str] | None = None) -> int:
    """Build a tiny distilled checkpoint, load it and print one predicted action chunk with its timing."""
    import numpy as np

    from .engine import Cosmos3Engine
    from .random_checkpoints import build_tiny_checkpoint
    from .requests import ActionRequest

    parser = argparse.ArgumentParser(prog="cosmos3-demo", description=demo_main.__doc__)
    parser.add_argument("--workdir", type=Path, default=Path(os.environ.get("COSMOS3_DEMO_DIR", "demo-output")))
    parser.add_argument(
        "--droid",
        action="store_true",
        help="the DROID-profile checkpoint: the chunk is conditioned on a joint state (32 x 8)",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    name = "tiny-distilled-droid" if args.droid else "tiny-distilled"
    path = build_tiny_checkpoint(args.workdir / name, "distilled", droid=args.droid)
    print(f"tiny distilled checkpoint: {path} ({time.perf_counter() - started:.2f} s)")
    engine = Cosmos3Engine.load(path)
    engine.warmup()
    domain = engine.default_domain()
    assert domain is not None, "the tiny checkpoint has an action head"
    profile = engine.spec.profiles[domain]
    image = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    state = None
    if profile.history_length:  # the robot's joint positions and gripper, as it reads them
        state = np.array([0.0, -0.6, 0.0, -2.2, 0.0, 1.6, 0.8, 0.0][: profile.state_dim], np.float32)
    rows = np.tile(state, (profile.history_length, 1)) if state is not None else None
    request = ActionRequest(domain_name=domain, image=image, prompt="pick up the red cube", seed=0, state=rows)
    chunk = engine.predict_actions(request)
    np.set_printoptions(precision=3, suppress=True, linewidth=120)
    print(
        f"variant {engine.info.variant}, domain {domain} (id {chunk.domain_id}), "
        f"{chunk.num_steps} steps, {chunk.transformer_forwards} transformer forwards"
    )
    if state is not None:
        print(f"state {state} ({profile.history_length} row(s), gripper flipped at {profile.gripper_flip_index})")
    print(f"action chunk {chunk.actions.shape[0]} x {chunk.actions.shape[1]} float32:")
    print(chunk.actions)
    if state is not None and request.state is not None:
        moved = engine.predict_actions(dataclasses.replace(request, state=request.state + 0.1)).actions
        print(
            f"with every joint moved by 0.1, same seed: the chunk changes by up to "
            f"{np.abs(moved - chunk.actions).max():.3f}"
        )
    t = chunk.timing
    print(
        f"timing: preprocess {t.preprocess_ms:.1f} ms, encode {t.encode_ms:.1f} ms, denoise {t.denoise_ms:.1f} ms, "
        f"postprocess {t.postprocess_ms:.1f} ms, total {t.total_ms:.1f} ms"
    )
    return 0
