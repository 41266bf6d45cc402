"""Runs vla-eval's own ``Connection`` (PyPI ``vla-eval``) against a server, in vla-eval's own virtualenv.

The tests run this with ``.venv-vlaeval/bin/python`` and read one JSON object from its stdout. It imports
nothing of this project: it is what vla-eval's episode runners do, plus hostile frames in the middle of a
session (a frame that is not msgpack, an observation with a float camera) to see each answered with a
typed ``error`` and the session go on.

    python vla_eval_client_script.py --url ws://127.0.0.1:8000/v1/vla-eval
"""

from __future__ import annotations

import argparse
import json
import sys

import anyio
import numpy as np
from vla_eval.connection import Connection


def camera(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)


async def main(url: str) -> dict:
    rng = np.random.default_rng(0)
    out: dict = {}
    conn = Connection(url, timeout=120)
    await conn.connect(benchmark="hostile_frames")
    out["server_info"] = conn.server_info
    await conn.start_episode({"task": {"name": "reach", "task_description": "reach the cube"}})
    obs = {"images": {"front": camera(rng), "wrist": camera(rng)}, "task_description": "reach", "states": np.zeros(4)}
    out["first"] = list((await conn.act(obs))["actions"].shape)
    try:  # a float camera: vla-eval's client raises on the error frame
        await conn.act({"images": {"front": rng.random((64, 64, 3)).astype(np.float32)}})
        out["float_camera"] = None
    except RuntimeError as exc:
        out["float_camera"] = str(exc)
    await conn._ws.send(b"\xc1 not msgpack")  # below vla-eval's API: what a broken peer would send
    reply = await conn.recv(timeout=60)
    out["garbage"] = {"type": reply.type.value, "payload": reply.payload}
    out["after"] = [list((await conn.act(obs))["actions"].shape) for _ in range(3)]
    await conn.end_episode({"metrics": {"success": False}})
    await conn.close()
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    json.dump(anyio.run(main, parser.parse_args().url), sys.stdout, default=str)
