"""Count the places in the product that name three or more request settings (issue 22's figure).

The request settings are declared once, in ``robot_clients.client_frames.REQUEST_SETTINGS``; every other
place that spells out several of them by name is a second copy that a new setting has to find. This
script finds them with ``ast`` and ``tokenize``, so the figure is reproducible:

    python benchmarks/setting_places.py          # the count, then each place with the settings it names
    python benchmarks/setting_places.py --code-only --threshold 5 --without control_hz

The second line is the narrower rule that gives issue 22's own "38" at the round's start (eb98ac1, before the
table existed, over the ten settings of that day): code spellings only, five or more settings a place.

**A place** is one of:

- a docstring (of a module, a class or a function);
- a function's body (a ``def``, ``async def``), without its docstring and without the functions and
  classes defined inside it, which are places of their own; a ``lambda`` belongs to the body around it;
- a class's body: its own statements (fields, constants), without its docstring and its methods;
- one statement at module level that is no ``def`` or ``class`` (an assignment, a call, an import);
- one block of consecutive comment lines at module level, outside any statement.

A comment inside a function, a class or a module-level statement belongs to that place.

**A place names a setting** when it spells the setting's name, or one of its aliases
(``RequestSetting.aliases``): as a declaration (a field annotated in a class body or at module level,
a function's parameter, a call's keyword argument, an imported name) or as a whole word (bounded by
anything but letters, digits and ``_``) inside a string, an f-string's text, a docstring or a comment.
Each place is counted once, however many times it names its settings; it counts when it names three or
more different settings. Reading a typed field (``request.seed``, a variable ``seed``) is a use that a
type checker follows, not a spelling, and does not count.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cosmos3_runtime", "policy_server", "robot_clients")
THRESHOLD = 3


@dataclass(frozen=True)
class Place:
    module: str  # path from the repository root
    line: int
    kind: str  # "docstring", "function", "class", "statement", "comment"
    name: str  # the function's or class's qualified name, else the first line's text
    settings: frozenset[str]


def setting_words(without: frozenset[str] = frozenset()) -> dict[str, str]:
    """Each word that names a setting (its name, its aliases) with the setting it names."""
    sys.path.insert(0, str(ROOT))
    from robot_clients.client_frames import REQUEST_SETTINGS

    settings = [setting for setting in REQUEST_SETTINGS if setting.name not in without]
    words = {setting.name: setting.name for setting in settings}
    words.update({alias: setting.name for setting in settings for alias in setting.aliases})
    return words


def _docstring_node(node: ast.AST) -> ast.Constant | None:
    body = getattr(node, "body", None)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            return body[0].value
    return None


class _Collector:
    def __init__(self, module: str, source: str, words: dict[str, str], code_only: bool = False) -> None:
        self.module = module
        self.words = words
        # Code spellings only: docstrings and comments name nothing; a string names a setting when it is its name.
        self.code_only = code_only
        self.pattern = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(map(re.escape, words)) + r")(?![A-Za-z0-9_])")
        self.places: list[Place] = []
        self.comments = [
            (token.start[0], token.string)
            for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type == tokenize.COMMENT
        ]
        self.claimed: set[int] = set()  # comment lines that fall inside a place

    def in_text(self, text: str) -> set[str]:
        if self.code_only:
            return set()
        return {self.words[word] for word in self.pattern.findall(text)}

    def in_string(self, text: str) -> set[str]:
        if self.code_only:
            return {self.words[text]} if text in self.words else set()
        return self.in_text(text)

    def add(self, line: int, kind: str, name: str, settings: set[str]) -> None:
        self.places.append(Place(self.module, line, kind, name, frozenset(settings)))

    def comment_settings(self, first: int, last: int, nested: list[tuple[int, int]]) -> set[str]:
        found: set[str] = set()
        for line, text in self.comments:
            if first <= line <= last and not any(start <= line <= end for start, end in nested):
                found |= self.in_text(text)
                self.claimed.add(line)
        return found

    def names_in(self, node: ast.AST, skip: ast.AST | None) -> set[str]:
        """Settings named by identifiers and strings under ``node``, not entering nested defs or classes."""
        found: set[str] = set()
        stack = [node]
        while stack:
            current = stack.pop()
            if current is skip:
                continue
            if current is not node and isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            identifier = None
            if isinstance(current, ast.AnnAssign) and isinstance(current.target, ast.Name):
                identifier = current.target.id  # a field declared
            elif isinstance(current, ast.arg):
                identifier = current.arg
            elif isinstance(current, ast.keyword):
                identifier = current.arg
            elif isinstance(current, ast.alias):
                identifier = current.asname or current.name.rsplit(".", 1)[-1]
            elif isinstance(current, ast.Constant) and isinstance(current.value, str):
                found |= self.in_string(current.value)
            if identifier is not None and identifier in self.words:
                found.add(self.words[identifier])
            stack.extend(ast.iter_child_nodes(current))
        return found

    def scope(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, qualname: str) -> None:
        doc = _docstring_node(node)
        if doc is not None:
            self.add(doc.lineno, "docstring", qualname, self.in_text(doc.value))
        nested = [child for child in ast.walk(node) if child is not node and _is_scope(child)]
        outer_nested = [child for child in nested if _parent_scope(node, child)]
        found: set[str] = set()
        body: list[ast.AST] = [*node.body]
        if not isinstance(node, ast.ClassDef):
            body += [node.args, *node.decorator_list]
            if node.returns is not None:
                body.append(node.returns)
        else:
            body += [*node.bases, *node.keywords, *node.decorator_list]
        for statement in body:
            if not _is_scope(statement):  # a method or a nested class is a place of its own
                found |= self.names_in(statement, doc)
        spans = [(child.lineno, child.end_lineno or child.lineno) for child in nested]
        found |= self.comment_settings(node.lineno, node.end_lineno or node.lineno, spans)
        self.add(node.lineno, "class" if isinstance(node, ast.ClassDef) else "function", qualname, found)
        for child in outer_nested:
            self.scope(child, f"{qualname}.{child.name}")


def _is_scope(node: ast.AST) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))


def _parent_scope(parent: ast.AST, child: ast.AST) -> bool:
    """Whether ``child`` is a scope directly inside ``parent`` (no scope between them)."""
    stack = list(ast.iter_child_nodes(parent))
    while stack:
        current = stack.pop()
        if current is child:
            return True
        if not _is_scope(current):
            stack.extend(ast.iter_child_nodes(current))
    return False


def module_places(path: Path, words: dict[str, str], code_only: bool = False) -> list[Place]:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    module = path.relative_to(ROOT).as_posix()
    collector = _Collector(module, source, words, code_only)
    doc = _docstring_node(tree)
    if doc is not None:
        collector.add(doc.lineno, "docstring", "(module)", collector.in_text(doc.value))
    for statement in tree.body:
        if doc is not None and statement.lineno == doc.lineno:
            continue  # the module's docstring, a place of its own
        if _is_scope(statement):
            collector.scope(statement, statement.name)  # type: ignore[attr-defined]
            continue
        found = collector.names_in(statement, None)
        nested = [(child.lineno, child.end_lineno or child.lineno) for child in ast.walk(statement) if _is_scope(child)]
        found |= collector.comment_settings(statement.lineno, statement.end_lineno or statement.lineno, nested)
        first_line = source.splitlines()[statement.lineno - 1].strip()[:60]
        collector.add(statement.lineno, "statement", first_line, found)
    # Module-level comment blocks outside every statement: consecutive lines make one block.
    block: list[tuple[int, str]] = []
    for line, text in [*collector.comments, (10**9, "")]:
        if line in collector.claimed:
            continue
        if block and line != block[-1][0] + 1:
            settings: set[str] = set()
            for _, comment in block:
                settings |= collector.in_text(comment)
            collector.add(block[0][0], "comment", block[0][1][:60], settings)
            block = []
        block.append((line, text))
    return collector.places


def product_places(code_only: bool = False, without: frozenset[str] = frozenset()) -> list[Place]:
    """Every place of the product, with the settings it names."""
    words = setting_words(without)
    paths = sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))
    return [place for path in paths for place in module_places(path, words, code_only)]


def places_naming_several(
    threshold: int = THRESHOLD, code_only: bool = False, without: frozenset[str] = frozenset()
) -> list[Place]:
    return [place for place in product_places(code_only, without) if len(place.settings) >= threshold]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--threshold", type=int, default=THRESHOLD, help="settings a place names to count")
    parser.add_argument("--code-only", action="store_true", help="read no docstring, comment or prose string")
    parser.add_argument("--without", action="append", default=[], help="a setting not to count (repeatable)")
    args = parser.parse_args()
    places = places_naming_several(args.threshold, args.code_only, frozenset(args.without))
    modules = {place.module for place in places}
    print(f"{len(places)} places in {len(modules)} modules name {args.threshold} or more request settings")
    for place in places:
        print(f"{place.module}:{place.line} {place.kind} {place.name}: {', '.join(sorted(place.settings))}")


if __name__ == "__main__":
    main()
