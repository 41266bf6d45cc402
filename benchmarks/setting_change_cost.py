"""The change cost of one more engine setting, by a dry run over today's settings (an issue 39 figure).

A new setting the model uses must be named wherever every setting the model uses is named today: those
places spell each setting out (a dataclass field, a schema field, a keyword, a dict key). So the dry run
lists the product modules that name every one of the engine settings below (as an identifier, attribute,
keyword, field or string constant); a new setting also touches the one module where it takes effect (the
sampler, say), which no dry run can know.

    python benchmarks/setting_change_cost.py            # the modules, and each setting's count of modules

For the record: putting ``shift`` on the wire (it was an engine setting already) took five product modules,
the wire table, ``SessionConfig``, the HTTP schemas, the client's ``ActionChunk`` and the worker's schedule
comparison, which then moved to the request (``RequestSettings.schedule``).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cosmos3_runtime", "policy_server", "robot_clients")
# The settings the engine uses (RequestSettings' fields but the interval, which no client sends by name).
ENGINE_SETTINGS = ("prompt", "seed", "num_steps", "guidance_scale", "shift", "fps", "resolution_tier", "view_point")


def names_in(path: Path) -> set[str]:
    """Every identifier, attribute, keyword, parameter and string constant of ``path``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
    return names


def modules_naming_every_setting() -> list[str]:
    """The product modules that name every engine setting: what one more would change."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if set(ENGINE_SETTINGS) <= names_in(path):
                found.append(str(path.relative_to(ROOT)))
    return found


def main() -> int:
    modules = modules_naming_every_setting()
    print(f"{len(modules)} product modules name every engine setting ({', '.join(ENGINE_SETTINGS)}):")
    for module in modules:
        print(f"  {module}")
    print("plus the module where a new setting takes effect")
    return 0


if __name__ == "__main__":
    sys.exit(main())
