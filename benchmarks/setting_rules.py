"""Where each request setting's value rule is implemented: a figure of issue 39 ("rules per setting: 1").

A rule is a comparison that bounds or admits a setting's value against the model: the seed against
``max_seed``, the rate against ``min_fps``/``max_fps``, the steps against ``max_steps`` or the distilled
list's length, the guidance against ``max_guidance_scale``, the tier against the served tiers, the horizon
against its range and multiple, the state against the profile's ``state_dim`` and ``history_length``, the
shift against ``min_shift``/``max_shift``. Each function or method of the product (``cosmos3_runtime/``,
``policy_server/``, ``robot_clients/``) holding such a comparison is one implementation of that rule.

    python benchmarks/setting_rules.py          # each setting, its implementations (module:line function)

The keeper is ``cosmos3_runtime/description.py`` (and ``profiles.py`` for the state): every other door asks
it, so each setting should have exactly one implementation.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cosmos3_runtime", "policy_server", "robot_clients")

# The names a rule's comparison (or the bounds it hands to a check) reads; for the state, a comparison that
# reads the profile's width together with the array's shape (``state_dim is None`` only asks whether a
# domain takes a state at all). The simulators' own episode limits (robot_clients/sim) are not settings.
RULE_NAMES: dict[str, frozenset[str]] = {
    "seed": frozenset({"max_seed"}),
    "fps": frozenset({"min_fps", "max_fps"}),
    "num_steps": frozenset({"max_steps"}),
    "guidance_scale": frozenset({"max_guidance_scale"}),
    "resolution_tier": frozenset({"resolution_tiers", "tiers"}),
    "action_horizon": frozenset({"min_action_horizon", "max_action_horizon"}),
    "state": frozenset({"state_dim"}),
    "shift": frozenset({"min_shift", "max_shift"}),
}
ALSO_READ = {"state": frozenset({"shape"})}
# Functions that compare with the served tiers without judging a request's tier: they list or pick the
# canvases of the served tiers (SGLang names a tier by its canvas's pixel size; the tier it names then goes
# through the one check). Printed apart, with the reason, so the list stays honest.
NOT_RULES = {
    ("resolution_tier", "ModelDescription.of_spec"): "lists the served tiers' canvases",
    ("resolution_tier", "supported_resolutions"): "lists the served tiers' canvases for SGLang",
    ("resolution_tier", "tier_for_size"): "SGLang's width x height to the tier whose canvas it is",
    ("resolution_tier", "video_fields"): "SGLang's size to a tier, through tier_for_size's canvases",
}
SKIPPED = ("robot_clients/sim/",)


@dataclass(frozen=True)
class RulePlace:
    """One function that implements a setting's rule."""

    setting: str
    module: str
    line: int
    function: str


def _names(node: ast.AST) -> set[str]:
    found = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Attribute):
            found.add(child.attr)
        elif isinstance(child, ast.Name):
            found.add(child.id)
    return found


def _limits_handed_to_a_check(call: ast.Call) -> set[str]:
    """The limits (``lim.X``, ``limits.X``) a call to a function (not a class) passes as arguments."""
    callee = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    if not callee or callee[0].isupper():
        return set()
    found = set()
    for arg in call.args:
        for node in ast.walk(arg):
            if isinstance(node, ast.Attribute):
                owner = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
                if owner in ("lim", "limits"):
                    found.add(node.attr)
    return found


def _functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function of a module with its qualified name (methods as ``Class.method``)."""
    out: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((prefix + child.name, child))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")

    visit(tree, "")
    return out


def rule_places() -> list[RulePlace]:
    """Every (setting, function) whose comparisons read one of the setting's rule names."""
    places = set()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = str(path.relative_to(ROOT))
            if module.startswith(SKIPPED):
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            for name, function in _functions(tree):
                nested = {id(n) for _, inner in _functions(function) for n in ast.walk(inner) if inner is not function}
                for node in ast.walk(function):
                    if not isinstance(node, (ast.Compare, ast.Call)) or id(node) in nested:
                        continue
                    # A call counts when it hands a bound read from the limits to a check function
                    # (``_number_in(v, lim.min_fps, lim.max_fps)``), not when it builds a value from them.
                    read = _names(node) if isinstance(node, ast.Compare) else _limits_handed_to_a_check(node)
                    for setting, names in RULE_NAMES.items():
                        if read & names and ALSO_READ.get(setting, names) & read:
                            places.add(RulePlace(setting, module, function.lineno, name))
    return sorted(places, key=lambda p: (p.setting, p.module, p.line))


def rules_per_setting() -> dict[str, list[RulePlace]]:
    """Each setting's rule implementations, less the :data:`NOT_RULES` places."""
    places = rule_places()
    return {
        setting: [p for p in places if p.setting == setting and (setting, p.function) not in NOT_RULES]
        for setting in RULE_NAMES
    }


def main() -> int:
    for setting, mine in rules_per_setting().items():
        print(f"{setting:<16} {len(mine)}  " + ", ".join(f"{p.module}:{p.line} {p.function}" for p in mine))
    for (setting, function), why in NOT_RULES.items():
        print(f"  not a rule of {setting}: {function} ({why})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
