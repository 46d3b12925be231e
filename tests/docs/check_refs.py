#!/usr/bin/env python3
"""Every file a comment or a doc cites is in the repository (docs/STYLE.md "Tests and tooling").

Checks, over every source and doc git knows or would add:
- a path into the tree (`daemon/src/service/save.cc`, `docs/SECURITY.md`, `bench/RESULTS.md`)
  names a file or folder that exists, from the repository root or from the citing file's folder;
- a bare `NAME.md` names a Markdown file somewhere in the tree;
- a relative Markdown link `[text](path)` resolves from the linking page;
- a link's `#anchor` is a heading of the page it points to;
- a cited section (`docs/OPERATIONS.md "Tiers"`, `README "Using it from C++"`) is a heading of that
  page (or the start of one);
- the design is cited as `docs/DESIGN.md` (never a bare `DESIGN`), and a cited invariant number is
  one of its invariants.
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
MD_LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)")
SECTION_CITE = re.compile(r'((?:[\w./-]+/)?[\w.-]+\.md|README)(?::)? ((?:\\?"[^"\\]+\\?"(?:, )?)+)')
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


def anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


_HEADINGS: dict[Path, list[str]] = {}


def headings(page: Path) -> list[str]:
    if page not in _HEADINGS:
        text = page.read_text(errors="replace") if page.is_file() else ""
        text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
        _HEADINGS[page] = [m.group(1).strip() for m in re.finditer(r"^#+\s+(.+)$", text, re.M)]
    return _HEADINGS[page]


def cited_page(ref: str, here: Path) -> Path | None:
    if ref == "README":
        return ROOT / "README.md"
    for p in (ROOT / ref, here.parent / ref, ROOT / "docs" / ref):
        if p.is_file():
            return p
    return None


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
    _, invariant_count = design
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
            target, frag = m.group(1), m.group(2)
            if "://" in target or target.startswith("mailto:"):
                continue
            page = (path.parent / target) if target else path
            if not page.exists():
                problems.append(f"links to {target}, which does not exist")
            elif frag and page.suffix == ".md" and frag not in {anchor(h) for h in headings(page)}:
                problems.append(f"links to {target}#{frag}, which has no such heading")
    for m in SECTION_CITE.finditer(line):
        page = cited_page(m.group(1), path)
        if page is None:
            continue  # a missing file is reported above
        titles = [h.lower() for h in headings(page)]
        for section in re.findall(r'\\?"([^"\\]+)\\?"', m.group(2)):
            if not any(t == section.lower() or t.startswith(section.lower()) for t in titles):
                problems.append(f'cites {m.group(1)} "{section}", which has no such section')
    for m in DESIGN_CITE.finditer(line):
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
