"""Each request setting's value rule has one implementation: the model description's (issue 39).

``benchmarks/setting_rules.py`` finds the functions that compare a setting's value with its bounds (the
seed with ``max_seed``, the tier with the served tiers, the state's shape with ``state_dim``...).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _counter():
    spec = importlib.util.spec_from_file_location("setting_rules", ROOT / "benchmarks" / "setting_rules.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up by name
    spec.loader.exec_module(module)
    return module


def test_each_setting_has_one_rule_and_it_is_the_runtimes():
    rules = _counter().rules_per_setting()
    listed = {setting: [f"{p.module}:{p.line} {p.function}" for p in places] for setting, places in rules.items()}
    assert all(len(places) == 1 for places in rules.values()), listed
    keepers = {"cosmos3_runtime/description.py", "cosmos3_runtime/profiles.py"}
    assert {p.module for places in rules.values() for p in places} <= keepers, listed


def test_the_counter_sees_a_second_rule(tmp_path, monkeypatch):
    """A check written again at a door is found (the counter can fail)."""
    counter = _counter()
    door = tmp_path / "policy_server" / "door.py"
    door.parent.mkdir(parents=True)
    door.write_text("def check(seed, limits):\n    return seed <= limits.max_seed\n")
    monkeypatch.setattr(counter, "ROOT", tmp_path)
    monkeypatch.setattr(counter, "PACKAGES", ("policy_server",))
    assert [p.function for p in counter.rules_per_setting()["seed"]] == ["check"]
