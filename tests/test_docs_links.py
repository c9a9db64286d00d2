"""Every file README.md and docs/*.md point to exists: markdown links, file names in code
spans (`docs/serving.md`, `bench/cli.py`, `llm.py`) and any name.md, resolved from the
repository root, the document's folder or parashift/, or (a bare name) anywhere in the
repository; and README.md's command lines and engine flags parse."""
import argparse
import contextlib
import io
import re
import shlex
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


def _readme_command_lines() -> list[list[str]]:
    """The arguments of every `parashift` command in README.md's shell blocks."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    commands = []
    for line in "\n".join(blocks).splitlines():
        words = shlex.split(line, comments=True)
        starts = [i for i, w in enumerate(words) if w.endswith("bin/parashift") or w == "parashift"]
        if starts:
            commands.append(words[starts[0] + 1:])
    return commands


def test_readme_command_lines_and_engine_flags_parse():
    """Each `parashift ...` line README.md shows parses, and each flag its engine options
    paragraph names is an option of both `generate` and `serve` (vLLM's names)."""
    from parashift.cli import build_parser
    parser = build_parser()
    commands = _readme_command_lines()
    assert len(commands) >= 5, commands
    refused, quiet = [], io.StringIO()
    for argv in commands:
        try:
            with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                parser.parse_args(argv)
        except SystemExit as e:
            if e.code != 0:  # 0: --help
                refused.append(argv)
    assert not refused, f"README.md shows command lines that do not parse: {refused}"
    text = (ROOT / "README.md").read_text()
    paragraph = text[text.index("Engine options use vLLM's names"):]
    paragraph = paragraph[:paragraph.index("\n\n")]
    flags = set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", paragraph))
    commands_of = {a.dest: a for a in parser._actions if isinstance(a, argparse._SubParsersAction)}
    subparsers = commands_of["command"].choices
    for command in ("generate", "serve"):
        options = {o for action in subparsers[command]._actions for o in action.option_strings}
        assert flags - options == set(), f"README.md's engine flags that `{command}` lacks"
    assert "--tensor-parallel-size" in flags and "--layout" in flags, flags
