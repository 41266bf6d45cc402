"""Untyped spellings of the request settings: outside the table, none.

The request settings are declared once, in ``robot_clients/client_frames.py`` (``REQUEST_SETTINGS``). A
product module that needs several of them names them in a typed form that mypy or the table checks: the
table's own entries (``setting_names(DOMAIN_NAME, SEED)``), a dataclass's fields, a schema's fields,
keyword arguments. What it must not do is spell several of them in strings, where a renamed or added
setting is missed silently. :func:`untyped_spellings` finds those spellings in the product modules
(``cosmos3_runtime/``, ``policy_server/``, ``robot_clients/``, the table itself left out), read with
:mod:`ast`, never imported. A setting name is a name of the table or one of its aliases. It counts:

- a tuple, list or set display (a ``frozenset({...})`` is a set display inside a call) whose string
  constants include two or more setting names, whatever else it holds;
- a dict display whose string-constant keys include two or more setting names (its values do not count);
- a string constant that is nothing but a list of setting names, two or more, split on whitespace,
  commas, semicolons, bars or slashes (``"seed,prompt"``, ``"seed prompt".split()``).

It does not count prose: a docstring, a piece of an f-string, or any string with a word that is no setting
name (an error message, a help text, a schema's description). Keyword arguments, attribute names and
dataclass fields are typed forms and do not count either.

The allowed spellings are listed below with their reasons, by module and the top-level name (function,
class or assigned constant) they sit in. ``python tests/test_setting_spellings.py`` prints every spelling,
allowed or not.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from robot_clients.client_frames import REQUEST_SETTINGS

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cosmos3_runtime", "policy_server", "robot_clients")
TABLE = "robot_clients/client_frames.py"
SETTING_NAMES = frozenset(
    {setting.name for setting in REQUEST_SETTINGS}
    | {alias for setting in REQUEST_SETTINGS for alias in setting.aliases}
)
_SEPARATORS = re.compile(r"[\s,;|/]+")

# Spellings that are not ours, by (module, top-level name), with why each stays.
ALLOWED = {
    # SGLang's names of our settings: SGLang's spelling of its own wire, which must keep SGLang's keys if we
    # rename a setting. tests/test_request_settings_table.py checks its keys against the table.
    ("policy_server/sglang/parameters.py", "SGLANG_NAMES"): "SGLang's mapping",
    # SGLang's replies and metadata, in SGLang's keys (`num_inference_steps`, its action item's fields):
    # its wire format, which happens to share some names with ours.
    ("policy_server/sglang/actions.py", "build_reply"): "SGLang's reply",
    ("policy_server/sglang/actions.py", "sglang_metadata"): "SGLang's metadata",
    # The policy_profiles.json format (docs/runtime.md): PolicyProfile's fields, of which the domain's
    # defaults for some settings share the settings' names. A file format, checked key by key against
    # PolicyProfile's fields when loaded (an unknown key is refused), not a form of the request settings.
    ("cosmos3_runtime/profiles.py", "NVIDIA_DROID_CONTRACT"): "a profile file's entry",
    ("cosmos3_runtime/profiles.py", "NVIDIA_DROID_SAMPLER"): "a profile file's entry",
    ("cosmos3_runtime/training.py", "write_profile"): "a profile file's entry",
}


@dataclass(frozen=True)
class Spelling:
    """Two or more setting names spelled in one literal."""

    module: str  # its path from the repository root
    line: int
    scope: str  # the top-level function, class or assigned name it sits in ("" at module level)
    kind: str  # "sequence", "dict keys" or "string"
    names: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.module}:{self.line} ({self.scope or 'module'}): {self.kind} {', '.join(self.names)}"


def _scope(statement: ast.stmt) -> str:
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return statement.name
    targets = statement.targets if isinstance(statement, ast.Assign) else []
    if isinstance(statement, ast.AnnAssign):
        targets = [statement.target]
    return next((target.id for target in targets if isinstance(target, ast.Name)), "")


def _prose(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are prose by position: docstrings and pieces of f-strings."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
        elif isinstance(node, ast.JoinedStr):
            ids.update(id(value) for value in node.values)
    return ids


def _names(nodes: list[ast.expr | None]) -> tuple[str, ...]:
    """The setting names among ``nodes`` that are string constants, each once, in order."""
    names = [node.value for node in nodes if isinstance(node, ast.Constant) and node.value in SETTING_NAMES]
    return tuple(dict.fromkeys(names))


def _spelled(node: ast.AST, prose: set[int]) -> tuple[str, tuple[str, ...]] | None:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return "sequence", _names(list(node.elts))
    if isinstance(node, ast.Dict):
        return "dict keys", _names(list(node.keys))
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
        words = [word for word in _SEPARATORS.split(node.value) if word]
        if len(words) >= 2 and all(word in SETTING_NAMES for word in words):
            return "string", tuple(dict.fromkeys(words))
    return None


def untyped_spellings(source: str, module: str) -> list[Spelling]:
    """Every literal of ``source`` (the module at path ``module``) that spells two or more setting names."""
    tree = ast.parse(source)
    prose = _prose(tree)
    found = []
    for statement in tree.body:
        scope = _scope(statement)
        for node in ast.walk(statement):
            spelled = _spelled(node, prose)
            if spelled is not None and len(set(spelled[1])) >= 2:
                found.append(Spelling(module, getattr(node, "lineno", 0), scope, spelled[0], spelled[1]))
    return sorted(found, key=lambda spelling: spelling.line)


def product_spellings() -> list[Spelling]:
    """The spellings of every product module but the table."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = path.relative_to(ROOT).as_posix()
            if module != TABLE:
                found += untyped_spellings(path.read_text(encoding="utf-8"), module)
    return found


def allowed(spelling: Spelling) -> bool:
    return (spelling.module, spelling.scope) in ALLOWED


def test_no_module_spells_two_settings_in_strings_outside_the_table():
    refused = [str(spelling) for spelling in product_spellings() if not allowed(spelling)]
    assert refused == [], "name them in a typed form (see this module's docstring):\n" + "\n".join(refused)


def test_every_allowed_spelling_is_still_there():
    # An entry whose spelling is gone must go too, or it would allow the next one unseen.
    present = {(spelling.module, spelling.scope) for spelling in product_spellings()}
    assert set(ALLOWED) <= present, set(ALLOWED) - present


PLANTED = '''
"""A docstring naming seed, prompt and fps is prose."""
from dataclasses import dataclass

NAMES = ("seed", "prompt")
LISTED = ["fps", "other", "shift"]
TAKEN = frozenset({"domain_name", "num_inference_steps"})
DEFAULTS = {"seed": 1, "view_point": "ego_view", **EXTRA}
SPLIT = "action_mode domain_name".split()
JOINED = "seed,prompt"


def fine(config):
    """Takes the seed and the prompt."""
    one = ("seed", "image")
    values = {"seed": 1, "image": None, "shift": config.shift}
    run(seed=1, prompt="x", fps=2.0)
    raise ValueError(f"`seed` and `prompt` cannot both be {one}")
    raise ValueError("send seed or prompt, not both")
    return config.seed, config.prompt, values


@dataclass
class Settings:
    seed: int
    prompt: str
'''


def test_the_checker_finds_each_planted_spelling_and_no_typed_form():
    found = untyped_spellings(PLANTED, "planted.py")
    assert [(s.line, s.scope, s.kind, s.names) for s in found] == [
        (5, "NAMES", "sequence", ("seed", "prompt")),
        (6, "LISTED", "sequence", ("fps", "shift")),
        (7, "TAKEN", "sequence", ("domain_name", "num_inference_steps")),
        (8, "DEFAULTS", "dict keys", ("seed", "view_point")),
        (9, "SPLIT", "string", ("action_mode", "domain_name")),
        (10, "JOINED", "string", ("seed", "prompt")),
        (16, "fine", "dict keys", ("seed", "shift")),
    ]


@pytest.mark.parametrize("literal", ['("seed", "seed")', '{"prompt": 1, "image": 2}', '"seed"', "(SEED, PROMPT)"])
def test_one_setting_name_is_no_spelling(literal):
    assert untyped_spellings(f"X = {literal}\n", "planted.py") == []


if __name__ == "__main__":
    for spelling in product_spellings():
        note = ALLOWED.get((spelling.module, spelling.scope)) or "NOT ALLOWED"
        print(f"{spelling}  [{note}]")
    sys.exit(0)
