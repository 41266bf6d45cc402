"""The product's code and docs say what they mean in place: no citation of files outside this repository."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Design notes kept next to the repository while it was built; a reader of this repository has neither.
OUTSIDE_FILES = ("shared/", "DESIGN.md", "FIELD-NOTES.md")
PRODUCT_FOLDERS = ("docs", "cosmos3_runtime", "policy_server", "robot_clients", "benchmarks")


def test_no_file_outside_the_repository_is_cited():
    files = [ROOT / "README.md"] + [
        p for folder in PRODUCT_FOLDERS for p in sorted((ROOT / folder).rglob("*")) if p.suffix in (".md", ".py")
    ]
    assert len(files) > 20
    citations = [
        f"{path.relative_to(ROOT)}: {needle}"
        for path in files
        for needle in OUTSIDE_FILES
        if needle in path.read_text(encoding="utf-8")
    ]
    assert not citations, "say what is meant in place instead of citing: " + "; ".join(citations)
