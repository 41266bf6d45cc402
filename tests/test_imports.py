"""What importing a module costs: the robot's light modules load nothing but numpy and msgpack.

A robot installs ``robot_clients`` for the codec and the protocol; a chunker running a local policy
must not pull websockets in. Each check runs in a fresh interpreter, since this one has loaded
everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def third_party_modules(module: str) -> set[str]:
    """Top-level modules outside the standard library (and outside ``robot_clients``) that importing
    ``module`` loads, measured in a fresh interpreter."""
    script = (f"import json, sys; import {module}; "
              "print(json.dumps(sorted({name.split('.')[0] for name in sys.modules})))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                                       check=True).stdout)
    return {name for name in loaded if name not in sys.stdlib_module_names and not name.startswith("_")
            and name not in ("robot_clients", "cython_runtime")}


@pytest.mark.parametrize("module", ["robot_clients.wire_codec", "robot_clients.protocol",
                                    "robot_clients.client_frames"])
def test_the_codec_and_the_protocol_import_nothing_but_numpy_and_msgpack(module):
    assert third_party_modules(module) <= {"numpy", "msgpack"}


def test_the_protocol_names_import_not_even_numpy():
    assert third_party_modules("robot_clients.protocol") == set()


def test_the_chunker_imports_no_websockets():
    assert third_party_modules("robot_clients.action_chunker") <= {"numpy"}
