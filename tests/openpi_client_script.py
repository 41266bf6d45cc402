"""Runs the real ``openpi-client`` package (from PyPI) against a server, in openpi's own virtualenv.

openpi-client 0.1.2 pins numpy<2, so it cannot share this project's environment: the tests run this
script with ``.venv-openpi/bin/python`` and read one JSON object from its stdout. It imports nothing of
this project; it is what an openpi user's eval script does: ``WebsocketClientPolicy`` for single
inferences, ``ActionChunkBroker`` to step through chunks, an observation dict in one benchmark's
convention, and one bad observation in the middle to see the error and the connection survive it.

    python openpi_client_script.py --uri ws://127.0.0.1:8000/openpi --convention libero --horizon 8

``--no-state`` leaves the convention's state keys out; ``--state-probe`` (DROID) also sends one image
twice with two joint states, and a 6-joint state. ``--example`` only sends the convention's example
observation (state included) three times and reports the actions or the error of each.
``--api-key KEY`` is openpi-client's own ``api_key`` (sent as ``Authorization: Api-Key KEY``); with
``--reference`` the script reads each reply as clients written for NVIDIA's cosmos-framework server do,
``result["action"]``, for two observations, and reports a refused connection instead of failing.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from openpi_client import action_chunk_broker, websocket_client_policy


def observation(convention: str, rng: np.random.Generator) -> dict:
    def hwc(h: int, w: int) -> np.ndarray:
        return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)

    def chw(h: int, w: int) -> np.ndarray:
        return rng.integers(0, 256, (3, h, w), dtype=np.uint8)

    if convention == "libero":  # openpi's examples/libero/main.py
        return {
            "observation/image": hwc(224, 224),
            "observation/wrist_image": hwc(224, 224),
            "observation/state": rng.normal(size=8).astype(np.float32),
            "prompt": "put the bowl on the plate",
        }
    if convention == "droid":  # openpi's examples/droid/main.py
        return {
            "observation/exterior_image_1_left": hwc(180, 320),
            "observation/wrist_image_left": hwc(180, 320),
            "observation/joint_position": rng.normal(size=7),
            "observation/gripper_position": rng.uniform(size=1),
            "prompt": "pick up the marker",
        }
    if convention == "aloha":  # openpi's examples/aloha_real: nested, channel-first images
        return {
            "state": rng.normal(size=14).astype(np.float32),
            "images": {name: chw(224, 224) for name in ("cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist")},
            "prompt": "fold the towel",
        }
    raise SystemExit(f"unknown convention {convention}")


STATE_KEYS = ("observation/state", "observation/joint_position", "observation/gripper_position", "state")


def stateless(convention: str, rng: np.random.Generator) -> dict:
    return {key: value for key, value in observation(convention, rng).items() if key not in STATE_KEYS}


class CountingPolicy:
    """Counts the inner policy's round trips under the broker (the broker is the thing being used)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls = 0

    def infer(self, obs: dict) -> dict:
        self.calls += 1
        return self.inner.infer(obs)

    def reset(self) -> None:
        self.inner.reset()


def example_reply(policy, obs: dict) -> dict:
    try:
        actions = policy.infer(obs)["actions"]
    except RuntimeError as exc:
        return {"error": str(exc)}
    return {"shape": list(actions.shape), "finite": bool(np.isfinite(actions).all())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uri", required=True)
    parser.add_argument("--convention", required=True)
    parser.add_argument("--horizon", type=int, required=True)
    parser.add_argument("--no-state", action="store_true")
    parser.add_argument("--state-probe", action="store_true")
    parser.add_argument("--example", action="store_true")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--reference", action="store_true")
    args = parser.parse_args()
    make = stateless if args.no_state else observation
    rng = np.random.default_rng(0)
    out: dict = {"numpy": np.__version__}

    if args.reference:
        try:
            policy = websocket_client_policy.WebsocketClientPolicy(host=args.uri, api_key=args.api_key)
        except Exception as exc:  # the handshake refused: websockets' InvalidStatus, with the HTTP status
            out["refused"] = f"{type(exc).__name__}: {exc}"
            json.dump(out, sys.stdout, default=str)
            return
        out["metadata"] = policy.get_server_metadata()
        replies = []
        for _ in range(2):
            result = policy.infer(make(args.convention, rng))
            action = result["action"]
            replies.append(
                {
                    "keys": sorted(result),
                    "shape": list(action.shape),
                    "dtype": str(action.dtype),
                    "finite": bool(np.isfinite(action).all()),
                    "same_as_actions": bool(np.array_equal(action, result["actions"])),
                }
            )
        out["replies"] = replies
        json.dump(out, sys.stdout, default=str)
        return

    policy = websocket_client_policy.WebsocketClientPolicy(host=args.uri, api_key=args.api_key)
    out["metadata"] = policy.get_server_metadata()
    if args.example:
        out["replies"] = [example_reply(policy, observation(args.convention, rng)) for _ in range(3)]
        json.dump(out, sys.stdout, default=str)
        return

    result = policy.infer(make(args.convention, rng))
    actions = result["actions"]
    out["infer"] = {
        "keys": sorted(result),
        "type": type(actions).__name__,
        "shape": list(actions.shape),
        "dtype": str(actions.dtype),
        "finite": bool(np.isfinite(actions).all()),
        "server_timing": sorted(result["server_timing"]),
    }

    # A bad observation: the camera is a float image out of [0, 1]. The client raises; the connection stays.
    bad = make(args.convention, rng)
    for key in list(bad):
        if key.startswith("observation/") and "image" in key:
            bad[key] = np.full((224, 224, 3), 7.5, dtype=np.float32)
    if "images" in bad:
        bad["images"] = {name: np.full((3, 224, 224), 7.5, dtype=np.float32) for name in bad["images"]}
    try:
        policy.infer(bad)
        out["error"] = None
    except RuntimeError as exc:
        out["error"] = str(exc)

    # The same connection goes on: step through chunks with openpi's own broker.
    counting = CountingPolicy(policy)
    broker = action_chunk_broker.ActionChunkBroker(counting, action_horizon=args.horizon)
    steps = []
    for _ in range(args.horizon + 2):
        step = broker.infer(make(args.convention, rng))
        steps.append(list(np.asarray(step["actions"]).shape))
    out["broker"] = {"step_shapes": steps, "inner_calls": counting.calls}

    if args.state_probe:  # one DROID observation, two joint states: the server's seed is fixed
        frame = make(args.convention, rng)
        first = policy.infer({**frame, "observation/joint_position": np.zeros(7)})["actions"]
        moved = policy.infer({**frame, "observation/joint_position": np.full(7, 0.5)})["actions"]
        again = policy.infer({**frame, "observation/joint_position": np.zeros(7)})["actions"]
        out["state_probe"] = {
            "shape": list(first.shape),
            "moved_max_abs": float(np.abs(moved - first).max()),
            "repeat_max_abs": float(np.abs(again - first).max()),
        }
        try:
            policy.infer({**frame, "observation/joint_position": np.zeros(6)})
            out["state_probe"]["short_error"] = None
        except RuntimeError as exc:
            out["state_probe"]["short_error"] = str(exc)
    json.dump(out, sys.stdout, default=str)


if __name__ == "__main__":
    main()
