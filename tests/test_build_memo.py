"""ASMGEMM_BUILD_MEMO (asmgemm.build_memo): a kept build answers the same build again, and only the
same build: other options, other source text, an edited include or a failed build never do."""
from __future__ import annotations

import pytest

from asmgemm import build_memo, pipeline
from asmgemm.errors import AsmError
from asmgemm.pipeline import BuildOptions, build_file

KERNEL = """.version 8.0
.target sm_90
.address_size 64
.include "part.inc"
.const N ?= 4
.entry k(.param .u64 p)
{
    .reg .b32 %r<4>;
    mov.b32 %r1, PART + N;
    ret;
}
"""


@pytest.fixture
def memo(monkeypatch, tmp_path):
    folder = tmp_path / "memo"
    monkeypatch.setenv(build_memo.BUILD_MEMO_ENV, str(folder))
    (tmp_path / "part.inc").write_text(".const PART = 3\n")
    (tmp_path / "k.sasm").write_text(KERNEL)
    builds = []
    real = pipeline._build

    def counted(source, options):
        builds.append(source.path)
        return real(source, options)
    monkeypatch.setattr(pipeline, "_build", counted)
    return tmp_path, folder, builds


def test_the_same_build_is_answered_from_the_memo(memo):
    root, folder, builds = memo
    first = build_file(root / "k.sasm")
    again = build_file(root / "k.sasm")
    assert len(builds) == 1 and again.ptx == first.ptx and again is not first
    assert len(list(folder.glob("build-*.pickle"))) == 1


def test_other_options_or_text_build_again(memo):
    root, _folder, builds = memo
    a = build_file(root / "k.sasm")
    b = build_file(root / "k.sasm", BuildOptions(defines={"N": "5"}))
    assert len(builds) == 2 and a.ptx != b.ptx
    (root / "k.sasm").write_text(KERNEL.replace("ret;", "mov.b32 %r2, 1;\n    ret;"))
    c = build_file(root / "k.sasm")
    assert len(builds) == 3 and c.ptx != a.ptx


def test_an_edited_include_builds_again(memo):
    root, _folder, builds = memo
    a = build_file(root / "k.sasm")
    (root / "part.inc").write_text(".const PART = 30\n")
    b = build_file(root / "k.sasm")
    assert len(builds) == 2 and "%r1, 34;" in b.ptx and "%r1, 7;" in a.ptx


def test_a_failed_build_is_not_kept(memo):
    root, folder, builds = memo
    (root / "k.sasm").write_text(KERNEL.replace("PART + N", "PART +"))
    for _ in range(2):
        with pytest.raises(AsmError):
            build_file(root / "k.sasm")
    assert len(builds) == 2 and not list(folder.glob("build-*.pickle"))


def test_without_the_variable_nothing_is_kept(monkeypatch, tmp_path):
    monkeypatch.delenv(build_memo.BUILD_MEMO_ENV, raising=False)
    assert build_memo.entry_path("x.sasm", "text", BuildOptions()) is None
