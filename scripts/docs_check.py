#!/usr/bin/env python3
"""The docs check: every relative link in the README, ARCHITECTURE and the book under docs/
names a file that exists (and, for a Markdown file, a heading that exists when it names one),
the README stays under 200 lines and ARCHITECTURE under 400, and the book builds with mdBook when it is installed
(`scripts/setup.sh --test` installs it).

    scripts/docs_check.py
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMITS = {"README.md": 200, "ARCHITECTURE.md": 400}
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub and mdBook make it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def main() -> int:
    problems = []
    files = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs/src").glob("*.md"))]
    for md in files:
        text, fenced = [], False
        for line in md.read_text().splitlines():
            if line.startswith("```"):
                fenced = not fenced
            elif not fenced:
                text.append(line)
        for target in LINK.findall("\n".join(text)):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            where = (md.parent / path).resolve() if path else md
            name = md.relative_to(ROOT)
            if not where.exists():
                problems.append(f"{name}: the link {target} names no file")
            elif anchor and where.suffix == ".md" and anchor not in anchors(where):
                problems.append(f"{name}: the link {target} names no heading of {path or name}")
    for name, limit in LIMITS.items():
        lines = len((ROOT / name).read_text().splitlines())
        if lines > limit:
            problems.append(f"{name} has {lines} lines; keep it under {limit} (move guides to docs/)")
    # scripts/setup.sh --test installs it under target/tools; one on the PATH does as well.
    mdbook = ROOT / "target/tools/bin/mdbook"
    mdbook = str(mdbook) if mdbook.is_file() else shutil.which("mdbook")
    if mdbook:
        built = subprocess.run([mdbook, "build", str(ROOT / "docs"), "--dest-dir",
                                str(ROOT / "target/book")], capture_output=True, text=True)
        if built.returncode != 0:
            problems.append("mdbook build docs failed:\n" + built.stderr)
    else:
        print("docs: mdbook is not installed; the book was not built", file=sys.stderr)
    for p in problems:
        print(f"docs: {p}", file=sys.stderr)
    if not problems:
        print(f"docs: {len(files)} pages, every link resolves")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
