#!/usr/bin/env python3
"""Checks the documentation's links (make docs-check, part of make ci).

For README.md and every docs/*.md: each relative link must name a file or directory that
exists, and each `#anchor` (in the same file or in another Markdown file) must name a heading
there, with GitHub's anchors: lowercase, punctuation dropped except '-' and '_', spaces to
'-', and '-1', '-2'... for repeated headings. README.md must stay under 300 lines.

The code points at the docs too: in src/ and scripts/, every `docs/<page>.md[#anchor]` must
resolve the same way, and a pointer at a README section ("the README's <name> section",
"see README, <name>") must name a heading the README has.
Exit 0 when everything resolves, 1 with one line per problem otherwise. Standard library only.
"""

import os
import re
import sys
from urllib.parse import unquote

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
README_MAX_LINES = 300

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and [text](target "title"); images too. Targets have no spaces.
INLINE_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
INLINE_CODE = re.compile(r"(`+)(?:.*?[^`])?\1(?!`)")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: keep their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def prose_lines(path):
    """(line number, line) outside fenced code blocks."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    fenced = False
    for number, line in enumerate(lines, 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


_anchors = {}


def anchors(path):
    """Every anchor a Markdown file defines."""
    if path not in _anchors:
        seen = {}
        found = set()
        for _, line in prose_lines(path):
            m = HEADING.match(line)
            if m:
                base = slug(m.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
            for name in HTML_ANCHOR.findall(line):
                found.add(name)
        _anchors[path] = found
    return _anchors[path]


def links(path):
    """(line number, target) of every link outside code."""
    for number, line in prose_lines(path):
        text = INLINE_CODE.sub("", line)
        for target in INLINE_LINK.findall(text):
            yield number, target
        m = REFERENCE_DEF.match(text)
        if m:
            yield number, m.group(1)


def check_link(source, number, target):
    """A message when target does not resolve from source, else None."""
    where = f"{os.path.relpath(source, ROOT)}:{number}"
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
        return None  # absolute URL (https:, mailto:): not checked offline
    file_part, _, fragment = target.partition("#")
    file_part = unquote(file_part)
    if file_part:
        if file_part.startswith("/"):
            resolved = os.path.normpath(os.path.join(ROOT, file_part.lstrip("/")))
        else:
            resolved = os.path.normpath(os.path.join(os.path.dirname(source), file_part))
        if not os.path.exists(resolved):
            return f"{where}: broken link '{target}': {os.path.relpath(resolved, ROOT)} does not exist"
    else:
        resolved = source
    if fragment:
        if os.path.isdir(resolved) or not resolved.endswith(".md"):
            return f"{where}: broken link '{target}': an anchor needs a Markdown file"
        if unquote(fragment) not in anchors(resolved):
            return (
                f"{where}: broken link '{target}': no heading with anchor "
                f"'#{fragment}' in {os.path.relpath(resolved, ROOT)}"
            )
    return None


CODE_DIRS = ("src", "scripts")
CODE_SUFFIXES = (".rs", ".py", ".sh", ".html", ".js")
DOC_POINTER = re.compile(r"\bdocs/([A-Za-z0-9_-]+\.md)(#[A-Za-z0-9_-]*[A-Za-z0-9_])?")
README_POINTER = re.compile(
    r"README(?:'s|\.md's)?,?\s+(?:the\s+)?([A-Z][\w -]*?)\s+section|see README,\s+([A-Z][\w -]*?)\)",
    re.IGNORECASE,
)


def code_files():
    for top in CODE_DIRS:
        for folder, dirs, names in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "node_modules")]
            for name in sorted(names):
                if name.endswith(CODE_SUFFIXES):
                    yield os.path.join(folder, name)


def check_code(path):
    """Messages for pointers from code to docs that resolve nowhere."""
    problems = []
    readme = os.path.join(ROOT, "README.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    joined = re.sub(r"\s*\n\s*(?://[/!]?|#|\*)?\s*", " ", text)
    for number, line in enumerate(text.split("\n"), 1):
        for page, anchor in DOC_POINTER.findall(line):
            message = check_link(os.path.join(ROOT, "docs", "x.md"), number, page + anchor)
            if message:
                where = f"{os.path.relpath(path, ROOT)}:{number}"
                problems.append(where + message.split(":", 2)[2])
    for match in README_POINTER.finditer(joined):
        section = (match.group(1) or match.group(2)).strip()
        if slug(section) not in anchors(readme):
            problems.append(
                f"{os.path.relpath(path, ROOT)}: points at the README's '{section}' section, "
                "which the README does not have"
            )
    return problems


def main():
    docs = os.path.join(ROOT, "docs")
    files = [os.path.join(ROOT, "README.md")] + sorted(
        os.path.join(docs, name) for name in os.listdir(docs) if name.endswith(".md")
    )
    problems = []
    for path in files:
        for number, target in links(path):
            message = check_link(path, number, target)
            if message:
                problems.append(message)
    code = list(code_files())
    for path in code:
        problems.extend(check_code(path))
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        count = len(f.read().splitlines())
    if count >= README_MAX_LINES:
        problems.append(
            f"README.md: {count} lines; it must stay under {README_MAX_LINES} "
            "(move reference material into docs/)"
        )
    for message in problems:
        print(message, file=sys.stderr)
    if problems:
        print(f"docs check: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(
        f"docs check: {len(files)} files and {len(code)} source files, every link, anchor and "
        f"pointer resolves; README.md {count} lines"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
