#!/usr/bin/env python3
"""Checks the docs: every relative link in README.md, docs/*.md, docs/decisions and the book
resolves to an existing file (anchors are not checked), and so does every path of the tree
they quote in backticks (`crates/…`, `scripts/…`, `testdata/…`; not patterns); with --moved OLD_README, also that every line of
OLD_README's fenced code blocks appears in a fenced block of README.md or the book (the
check run when the README's reference moved into docs/book)."""
import pathlib, re, sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "docs/decisions").glob("*.md")),
        *sorted((ROOT / "docs/book/src").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# Pages another branch is adding: a link to one of them is reported but not failed while it
# is missing (empty when nothing is pending).
PENDING: set = set()


def prose(text):
    """The text outside fenced code blocks and inline code spans."""
    out, fence = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def fenced(text):
    lines, fence = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if fence:
            lines.append(line.strip())
    return lines


def broken_links():
    bad = []
    for doc in DOCS:
        if not doc.exists():
            continue
        for target in LINK.findall(prose(doc.read_text())):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            path = (doc.parent / target.split("#", 1)[0]).resolve()
            if path.exists():
                continue
            if path in PENDING:
                print(f"doccheck: pending (not yet in the tree): {doc.relative_to(ROOT)}: {target}")
            else:
                bad.append(f"{doc.relative_to(ROOT)}: {target}")
    return bad


def stale_paths():
    bad = []
    for doc in DOCS:
        if not doc.exists():
            continue
        for path in re.findall(r"`((?:crates|scripts|testdata|schemas|fuzz)/[^`\s]+)`", doc.read_text()):
            if any(c in path for c in "<*{"):
                continue  # a pattern, not a path
            if not (ROOT / path.rstrip(".,:)")).exists():
                bad.append(f"{doc.relative_to(ROOT)}: {path}")
    return bad


def lost_lines(old):
    have = set(fenced((ROOT / "README.md").read_text()))
    for doc in (ROOT / "docs/book/src").rglob("*.md"):
        have.update(fenced(doc.read_text()))
    return [l for l in fenced(pathlib.Path(old).read_text()) if l and l not in have]


def main():
    problems = [f"broken link: {b}" for b in broken_links()]
    problems += [f"no such file: {b}" for b in stale_paths()]
    if len(sys.argv) == 3 and sys.argv[1] == "--moved":
        problems += [f"lost command line: {l}" for l in lost_lines(sys.argv[2])]
    for p in problems:
        print(f"doccheck: {p}", file=sys.stderr)
    print(f"doccheck: {len(DOCS)} pages, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
