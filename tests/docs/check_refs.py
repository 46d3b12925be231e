#!/usr/bin/env python3
"""Every file a comment or a doc cites is in the repository (docs/STYLE.md "Tests and tooling").

Checks, over every source and doc git knows or would add:
- a path into the tree (`daemon/src/service/save.cc`, `docs/SECURITY.md`, `bench/RESULTS.md`)
  names a file or folder that exists, from the repository root or from the citing file's folder;
- a bare `NAME.md` names a Markdown file somewhere in the tree;
- a relative Markdown link `[text](path)` resolves from the linking page;
- the design is cited as `docs/DESIGN.md` (never a bare `DESIGN`), a cited section
  (`docs/DESIGN.md "Load"`) is a heading of docs/DESIGN.md and a cited invariant number is one
  of its invariants.
Prints each broken reference as FILE:LINE: what, and exits 1 if there is any.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = {".cc", ".h", ".cu", ".py", ".pyi", ".md", ".proto", ".sh", ".txt", ".yaml", ".toml"}
NAMES = {"Makefile", "CMakeLists.txt"}
TREE_DIRS = "daemon|client|plugins|tests|bench|deploy|docs|proto"
TREE_PATH = re.compile(
    rf"(?<![\w./<-])((?:{TREE_DIRS})/[A-Za-z0-9_./-]*[A-Za-z0-9_])(?![\w<>*{{}}-])"
)
BARE_MD = re.compile(r"(?<![\w./<-])([A-Za-z0-9_-]+\.md)\b")
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
DESIGN_CITE = re.compile(r'docs/DESIGN\.md((?:[ ,;:and]*"[^"]+")*)(?:\s+invariants?\s+(\d+))?')
BARE_DESIGN = re.compile(r"(?<![/\w])DESIGN(?!\.md)\b")


def tracked_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    files = []
    for name in filter(None, out.split("\0")):
        p = ROOT / name
        if p.is_file() and (p.suffix in SUFFIXES or p.name in NAMES):
            files.append(p)
    return files


def design_sections() -> tuple[set[str], int]:
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    headings = {m.group(1).strip() for m in re.finditer(r"^#+\s+(.+)$", text, re.M)}
    invariants = text.split("## Invariants", 1)[-1]
    count = len(re.findall(r"^(\d+)\. ", invariants, re.M))
    return headings, count


# What `make bench` writes (ignored by git): a benchmark's raw rows, cited by bench/RESULTS.md as
# where a run put them, not as files of the repository.
OUTPUTS = ("bench/results/",)


def exists(ref: str, here: Path) -> bool:
    ref = ref.rstrip(".")
    if ref.startswith(OUTPUTS):
        return True
    return (ROOT / ref).exists() or (here.parent / ref).exists()


def check_line(
    path: Path, line: str, md_names: set[str], design: tuple[set[str], int]
) -> list[str]:
    problems = []
    headings, invariant_count = design
    for m in TREE_PATH.finditer(line):
        ref = m.group(1)
        if "." not in Path(ref).name and not (ROOT / ref).exists():
            continue  # a folder-like word in prose ("tests/python-style"): only files are checked
        if not exists(ref, path):
            problems.append(f"cites {ref}, which is not in the repository")
    for m in BARE_MD.finditer(line):
        if m.group(1) not in md_names:
            problems.append(f"cites {m.group(1)}, which is not in the repository")
    if path.suffix == ".md":
        for m in MD_LINK.finditer(line):
            target = m.group(1)
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (path.parent / target).exists():
                problems.append(f"links to {target}, which does not exist")
    for m in DESIGN_CITE.finditer(line):
        for section in re.findall(r'"([^"]+)"', m.group(1) or ""):
            if section not in headings:
                problems.append(f'cites docs/DESIGN.md "{section}", which has no such section')
        if m.group(2) and not 1 <= int(m.group(2)) <= invariant_count:
            problems.append(f"cites docs/DESIGN.md invariant {m.group(2)}, which does not exist")
    if path.suffix != ".md" or path.name != "DESIGN.md":
        for _ in BARE_DESIGN.finditer(line):
            problems.append("cites DESIGN: cite docs/DESIGN.md and its section")
    return problems


def main() -> int:
    files = tracked_files()
    md_names = {p.name for p in files if p.suffix == ".md"}
    design = design_sections()
    me = Path(__file__).resolve()
    found = 0
    for path in files:
        if path == me:
            continue
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError as e:
            print(f"{path.relative_to(ROOT)}: {e}")
            found += 1
            continue
        for no, line in enumerate(lines, 1):
            for problem in check_line(path, line, md_names, design):
                print(f"{path.relative_to(ROOT)}:{no}: {problem}")
                found += 1
    if found:
        print(f"check_refs: {found} broken references")
        return 1
    print(f"check_refs: every reference in {len(files)} files resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
