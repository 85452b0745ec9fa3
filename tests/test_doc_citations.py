"""The repository's citations stay true: every `docs/<file>.md#<anchor>` the code names, and
every `<file>.md#<anchor>` link of the docs, resolves to a file and a heading of it; and nothing
names a file outside the repository (a user's clone has no design notes or data beside it)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE_CITATION = re.compile(r"docs/([\w./-]+\.md)#([\w-]+)")
MD_LINK = re.compile(r"\]\(([\w./-]+\.md)#([\w-]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"#{1,6} (.+?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def files(*trees: str, suffix: str) -> list[Path]:
    return sorted(p for t in trees for p in (ROOT / t).rglob(f"*{suffix}")
                  if ".venv" not in p.parts)


def broken(citations: list[tuple[Path, Path, str]]) -> list[str]:
    bad = []
    for where, target, anchor in citations:
        if not target.is_file():
            bad.append(f"{where.relative_to(ROOT)}: no file {target.relative_to(ROOT)}")
        elif anchor not in anchors(target):
            bad.append(f"{where.relative_to(ROOT)}: {target.relative_to(ROOT)} has no "
                       f"heading #{anchor}")
    return bad


def test_slug_is_githubs() -> None:
    assert slug("The fit (`fit_l4()`)") == "the-fit-fit_l4"
    assert slug("Thermal profile (L4)") == "thermal-profile-l4"
    assert slug("SGLang KV pool sizing") == "sglang-kv-pool-sizing"


def test_every_docs_anchor_the_code_cites_exists() -> None:
    citations = [(p, ROOT / "docs" / m.group(1), m.group(2))
                 for p in files("src", "tests", "benchmarks", suffix=".py")
                 for m in CODE_CITATION.finditer(p.read_text(encoding="utf-8"))]
    in_src = {t.name for p, t, _ in citations if p.is_relative_to(ROOT / "src")}
    assert "facts.md" in in_src  # the scan finds what src cites
    assert broken(citations) == []


def test_every_anchor_link_of_the_docs_exists() -> None:
    citations = []
    for p in [ROOT / "README.md", *files("docs", suffix=".md")]:
        text = p.read_text(encoding="utf-8")
        citations += [(p, (p.parent / m.group(1)).resolve(), m.group(2))
                      for m in MD_LINK.finditer(text)]
        citations += [(p, ROOT / "docs" / m.group(1), m.group(2))
                      for m in CODE_CITATION.finditer(text)]
    assert len(citations) > 10
    assert broken(citations) == []


def test_nothing_names_a_file_outside_the_repository() -> None:
    outside = ("../" + "shared", "DESIGN" + ".md")
    named = [f"{p.relative_to(ROOT)}: {word}"
             for p in [ROOT / "Makefile", ROOT / "README.md", ROOT / "pyproject.toml",
                       *files("src", "tests", "benchmarks", "docs", "deploy", suffix="")]
             if p.is_file() and p.suffix not in (".jsonl", ".pyc", ".png")
             for word in outside if word in p.read_text(encoding="utf-8", errors="replace")]
    assert named == []
