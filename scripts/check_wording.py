#!/usr/bin/env python3
"""Check that the repository speaks only of the software.

Every file git tracks is scanned, its path and (for text files) each of its
lines, for wording that narrates how the project was developed instead of
describing what it is and does: the patterns are in PATTERNS below. Each hit is
printed as ``path:line: text  [what]`` (line 0 is the file's path itself), and
the exit status is 1 when there is any, 0 when there is none, 2 when the
directory is not a git checkout.

    python3 scripts/check_wording.py [REPO]      (default: this script's checkout)

Standard library only; CI runs it before the tests, and tests/test_wording.py
runs it too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Iterator, NamedTuple

# A number followed by one of these is a quantity ("4 MiB", "16 threads",
# "issue 2 reads"), not the number of a work item.
_QUANTITY = (
    r"(?![\d\s/.,x×-]*(?:[KMGTP]i?B\b|[KMGTP]\b|bytes?\b|bits?\b|threads?\b|workers?\b|reads?\b|writes?\b"
    r"|copies\b|copy\b|pieces?\b|chunks?\b|requests?\b|calls?\b|ops?\b|I/Os?\b|times\b|ms\b|us\b|µs\b|ns\b"
    r"|s\b|seconds?\b|minutes?\b|%))"
)

# An abbreviated or full commit hash (with at least one digit, so that words
# such as "defaced" are not taken for one).
_HASH = r"(?=[0-9a-f]*\d)[0-9a-f]{7,40}"

# --- patterns: begin (the checker does not scan the lines up to "patterns: end")
# (name, pattern, applies to: "text", "path" or "both"); all case-insensitive.
PATTERNS: list[tuple[str, str, str]] = [
    ("work session", r"\bsessions?\b", "both"),
    ("numbered session or round", r"\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth)\s+(?:sessions?|rounds?)\b", "both"),
    ("round of work", r"\brounds? of work\b", "both"),
    ("numbered issue", r"\bissues?\s*#\s*\d+|\bissues?\s+\d+\b" + _QUANTITY, "both"),
    ("numbered task", r"\btasks?\s*#\s*\d+|\btasks?\s+\d+\b" + _QUANTITY, "both"),
    ("numbered requirement", r"\brequirements?\s*#?\s*\(?\d+\b" + _QUANTITY, "both"),
    ("lent machine", r"\blent\b", "both"),
    ("borrowed machine",
     r"\bborrowed\s+(?:[\w-]+\s+){0,2}?(?:machines?|hosts?|nodes?|boxes|VMs?|GPUs?|H\d00s?|devices?|instances?)\b"
     r"|\bborrow(?:s|ing)?\s+(?:[\w-]+\s+){0,2}?(?:machines?|hosts?|nodes?|boxes|VMs?|instances?)\b"
     r"|\b(?:machines?|hosts?|nodes?|VMs?|GPUs?|instances?)\s+(?:(?:was|were|is|are|being)\s+)?borrowed\b",
     "both"),
    ("device time budget", r"\bdevice[- ]time\b", "both"),
    ("workstation path", r"/work/", "both"),
    ("workstation path", r"\bshared/reference\b", "both"),
    ("commit to re-apply",
     r"\bto re-?apply\b"
     r"|\bre-?appl(?:y|ied|ying)\b.*\b(?:commit|revert(?:ed)?|" + _HASH + r")\b"
     r"|\b(?:commit|revert(?:ed)?|" + _HASH + r")\b.*\bre-?appl(?:y|ied|ying)\b",
     "both"),
    ("commit hash", r"\bcommits?\s+" + _HASH + r"\b", "both"),
    ("experiment branch", r"(?<![\w/.-])exp/[\w.-]+", "both"),
    ("session-numbered file name", r"(?:^|[-_/])s\d+-\d{4}(?=[-_.]|$)", "path"),
]

# Uses that do not count, by pattern name: a hit inside one of these, or a hit
# used as code (x.name, name.x, name(...)), is not narration.
ALLOWED: dict[str, str] = {
    # pytest's test session: fixture scope, hook definitions and the Session class
    "work session": r"""scope\s*=\s*["']session["']|\bpytest_\w+\s*\([^)]*\)|\bpytest\.Session\b""",
}
# --- patterns: end

_COMPILED = [
    (name, re.compile(pattern, re.IGNORECASE), where,
     re.compile(ALLOWED[name], re.IGNORECASE) if name in ALLOWED else None)
    for name, pattern, where in PATTERNS
]
_SELF = "scripts/check_wording.py"


class Hit(NamedTuple):
    path: str
    line: int  # 0: the path itself
    text: str
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}  [{self.what}]"


def _is_identifier_use(line: str, start: int, end: int) -> bool:
    """True for a match used as code: an attribute (x.name), a member access
    (name.x), a call or an index (name(...), name[...])."""
    before = line[start - 1] if start > 0 else ""
    after = line[end : end + 2]
    return before == "." or after[:1] in ("(", "[") or (after[:1] == "." and after[1:2].isidentifier())


def _matches(text: str, where: str) -> list[str]:
    return list(dict.fromkeys(_each_match(text, where)))


def _each_match(text: str, where: str) -> Iterator[str]:
    for name, regex, applies, allow in _COMPILED:
        if applies not in (where, "both"):
            continue
        allowed = [m.span() for m in allow.finditer(text)] if allow and where == "text" else []
        for m in regex.finditer(text):
            if allow and where == "text":
                inside = any(a <= m.start() and m.end() <= b for a, b in allowed)
                if inside or _is_identifier_use(text, m.start(), m.end()):
                    continue
            yield name
            break


def check_text(path: str, text: str) -> list[Hit]:
    """The hits in one file's text (``path`` only names it)."""
    hits = []
    skipping = False
    for number, line in enumerate(text.splitlines(), 1):
        if path == _SELF:
            if "--- patterns: begin" in line:
                skipping = True
            elif "--- patterns: end" in line:
                skipping = False
                continue
            if skipping:
                continue
        names = _matches(line, "text")
        if names:
            hits.append(Hit(path, number, line.strip()[:200], ", ".join(names)))
    return hits


def check_path(path: str) -> list[Hit]:
    names = _matches(path, "path")
    return [Hit(path, 0, "(the file's path)", ", ".join(names))] if names else []


def _read_text(full: str) -> str | None:
    """The file's text, or None for a binary, unreadable or missing file."""
    if os.path.islink(full) or not os.path.isfile(full):
        return None
    try:
        with open(full, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def tracked_files(root: str) -> list[str]:
    out = subprocess.run(
        ["git", "-C", root, "ls-files", "-z"], check=True, capture_output=True
    ).stdout
    # A tracked file deleted in the working tree (not yet committed) is not there to judge.
    names = [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]
    return [p for p in names if os.path.lexists(os.path.join(root, p))]


def check_repo(root: str) -> list[Hit]:
    hits = []
    for path in tracked_files(root):
        hits += check_path(path)
        text = _read_text(os.path.join(root, path))
        if text is not None:
            hits += check_text(path, text)
    return hits


def main(argv: list[str]) -> int:
    here = argv[1] if len(argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    try:
        root = subprocess.run(
            ["git", "-C", here, "rev-parse", "--show-toplevel"], check=True, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"check_wording: {here} is not in a git checkout ({exc})", file=sys.stderr)
        return 2
    hits = check_repo(root)
    for hit in hits:
        print(hit)
    if hits:
        print(f"check_wording: {len(hits)} line(s) narrate development; describe the software instead",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
