"""Every file README.md and docs/*.md point to exists: markdown links, file names in code
spans (`docs/serving.md`, `bench/cli.py`, `llm.py`) and any name.md, resolved from the
repository root, the document's folder or parashift/, or (a bare name) anywhere in the
repository."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)*\.(?:md|py|sh|toml|cfg|ini|yaml|yml))`")
MARKDOWN_NAME = re.compile(r"(?<![\w/.-])([\w-]+\.md)\b")  # a bare `name.md`, quoted or not


def tracked_names() -> set[str]:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    return {Path(f).name for f in files}


def references(doc: Path) -> list[str]:
    text = doc.read_text()
    links = [l.split("#")[0] for l in LINK.findall(text) if not re.match(r"\w+:|#", l)]
    return [l for l in links if l] + CODE_PATH.findall(text) + MARKDOWN_NAME.findall(text)


def exists(reference: str, doc: Path, names: set[str]) -> bool:
    if "/" not in reference:
        return reference in names
    return any((base / reference).exists() for base in (ROOT, doc.parent, ROOT / "parashift"))


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_referenced_file_exists(doc):
    names = tracked_names()
    missing = [r for r in references(doc) if not exists(r, doc, names)]
    assert not missing, f"{doc.relative_to(ROOT)} points to files that do not exist: {missing}"
