"""User-facing text speaks of the product, never of the project's internal issue numbers.

Users cannot see the issue tracker, so "issue 27's campaign" or "(issue 29)" tells them nothing: the text
names the thing itself (a file, a command, "the self-distillation campaign"). Checked: README.md,
DEVELOPERS.md, every docs/*.md and every shipped model card (sbd/adapters/*/README.md). A reference split
over a line break ("issue\\n28's") counts too; each hit is reported as file:line.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ISSUE_NUMBER = re.compile(r"\bissues?\s*#?\s*\d+", re.IGNORECASE)  # issue 27, Issue 27's, issues 27/28, issue #5


def user_text_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "DEVELOPERS.md"]
    files += sorted((ROOT / "docs").glob("*.md"))
    files += sorted((ROOT / "sbd" / "adapters").glob("*/README.md"))
    return [f for f in files if f.is_file()]


def issue_references(text: str) -> list[tuple[int, str]]:
    hits = []
    for m in ISSUE_NUMBER.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        hits.append((line, " ".join(m.group(0).split())))
    return hits


def test_the_checked_files_exist():
    names = {f.relative_to(ROOT).as_posix() for f in user_text_files()}
    assert {"README.md", "DEVELOPERS.md"} <= names
    assert any(n.startswith("docs/") for n in names)
    assert any(n.startswith("sbd/adapters/") for n in names)


def test_the_pattern_finds_issue_numbers():
    text = "a\nIssue 27's campaign (issue 29), issues 27/28, issue #5, issue\n    28's target\nno issues here"
    assert [line for line, _ in issue_references(text)] == [2, 2, 2, 2, 2]
    assert issue_references("the tissue 3 layers; issues with 2 cores") == []


def test_user_text_names_no_issue_numbers():
    hits = []
    for path in user_text_files():
        rel = path.relative_to(ROOT).as_posix()
        for line, found in issue_references(path.read_text(encoding="utf-8")):
            hits.append(f"{rel}:{line}: {found!r}")
    assert not hits, ("user-facing text refers to internal issue numbers; name the file, command or thing "
                      "instead:\n" + "\n".join(hits))
