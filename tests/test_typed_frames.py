"""Every frame a server session sends is built by its one builder in ``robot_clients/protocol.py``.

A ``{"type": ...}`` dict spelled out anywhere else in the product is listed here. The places that are not
frames of our protocols say what they are instead: ASGI messages, JSON Schema, SGLang's action-array type
and the envelope of vla-eval's own protocol (its one builder, in the module that translates it).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOT_OUR_FRAMES = {
    "policy_server/foundation/auth.py": "ASGI messages (http.response.start, http.response.body)",
    "policy_server/http/schemas.py": "JSON Schema of the OpenAPI document",
    "policy_server/http/bodies.py": "JSON Schema of the OpenAPI document",
    "policy_server/sglang/actions.py": "SGLang's action array (its `type: continuous`)",
    "policy_server/vla_eval/translation.py": "vla-eval's own envelope, its one builder (vla-eval's protocol)",
}


def type_dicts(path: Path) -> list[int]:
    """The lines of ``path`` where a dict literal has a ``"type"`` key."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Dict)
        and any(isinstance(key, ast.Constant) and key.value == "type" for key in node.keys)
    ]


def test_no_frame_dict_is_spelled_out_outside_the_protocol_module():
    found = {}
    for package in ("policy_server", "robot_clients", "cosmos3_runtime"):
        for path in sorted((ROOT / package).rglob("*.py")):
            module = str(path.relative_to(ROOT))
            if module == "robot_clients/protocol.py" or module in NOT_OUR_FRAMES:
                continue
            if lines := type_dicts(path):
                found[module] = lines
    assert found == {}


def test_the_scan_finds_a_frame_dict(tmp_path):
    """The scan can fail: an inline frame is found."""
    session = tmp_path / "session.py"
    session.write_text('def reply(send):\n    send({"type": "session", "session_id": "x"})\n')
    assert type_dicts(session) == [2]
