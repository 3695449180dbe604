"""The docs stay true to the tree: the generated tables match kernels_ptx/kernels.toml, every
relative link points at a file that exists, the README stays a front door (<= 150 lines, issue 34),
the experiment log's headings are dated and in date order, and tools/data holds only cited files."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import load_tool

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "tools" / "README.md",
               ROOT / "tools" / "data" / "README.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def test_generated_tables_match_the_kernel_specs(capsys):
    assert load_tool("gen_kernel_selection").main(["--check"]) == 0, capsys.readouterr().err


def test_a_stale_table_is_found(tmp_path, monkeypatch):
    gen = load_tool("gen_kernel_selection")
    for rel in gen.TARGET_FILES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        text = (ROOT / rel).read_text(encoding="utf-8")
        (tmp_path / rel).write_text(text.replace("| `sgemm` (sgemm.sasm) |", "| `sgemm` (old.sasm) |"), encoding="utf-8")
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    assert gen.main(["--check"]) == 1


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files(doc):
    broken = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (doc.parent / target.split("#", 1)[0]).exists():
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: links to missing files: {broken}"


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move detail into docs/"


@pytest.mark.parametrize("log", sorted((ROOT / "docs" / "log").glob("*.md")), ids=lambda p: p.name)
def test_log_headings_are_dated_in_order(log):
    if log.name == "README.md":
        return
    dates = []
    for line in log.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            found = DATE.findall(line)
            assert found, f"{log.name}: undated heading {line!r}"
            dates.append(found[0])
    assert dates == sorted(dates), f"{log.name}: headings out of date order: {dates}"


def test_tools_data_holds_only_cited_files():
    texts = []
    for folder in ("asm", "tests", "scheduler", "kernels_ptx", "tools"):
        for p in (ROOT / folder).rglob("*"):
            if p.is_file() and p.suffix in (".py", ".sh", ".toml", ".sasm", ".inc") and "data" not in p.parts[-2:-1]:
                texts.append(p.read_text(encoding="utf-8", errors="replace"))
    corpus = "\n".join(texts)
    # a folder a script globs over ("tools/data/dispatch/sweep_*") cites every file under it
    prefixes = {m for m in re.findall(r"tools/data/[\w.-]+/[\w.-]*", corpus)}
    uncited = []
    data = ROOT / "tools" / "data"
    for p in data.rglob("*"):
        if not p.is_file() or p.name == "README.md":
            continue
        rel = "tools/data/" + p.relative_to(data).as_posix()
        if p.name not in corpus and not any(rel.startswith(prefix) for prefix in prefixes):
            uncited.append(rel)
    assert not uncited, f"tools/data files nothing cites (git history keeps them; git rm them): {uncited}"


def test_tools_data_stays_under_one_megabyte():
    """Issue 34: tools/data keeps only what is cited, under 1 MB (larger results gzipped); git
    history keeps the rest."""
    total = sum(p.stat().st_size for p in (ROOT / "tools" / "data").rglob("*") if p.is_file())
    assert total < 1_000_000, f"tools/data holds {total} bytes; gzip (-9 -n) or drop uncited results"
