"""ASMGEMM_BUILD_MEMO=DIR: keep every successful build (pipeline.build: parse, expand, register
plan, schedule, emit) in DIR and answer the same build again from there.

The test suite sets it for one session (tests/conftest.py), beside ASMGEMM_TOOL_MEMO: the same
kernel configurations are built by many tests and by both workers of `pytest -n 2`, and a build of
hgemm costs ~0.6 s of Python each time. A build is a pure function of its source text, the files
it includes, its options, the working folder (relative include folders) and asmgemm's own code,
so the key covers the first four and the code (every .py of the package, the scheduler and the
grammar, by content); the files an entry included are compared by content when it is read. A
failed build is never kept.

Entries are Python pickles, and unpickling runs code named in the file: DIR must be a folder only
this user writes (the test suite makes a fresh private one with tempfile.mkdtemp). Nothing else
sets it, and a source file's text never decides what is unpickled.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
import tempfile
import zlib
from importlib import resources
from pathlib import Path

BUILD_MEMO_ENV = "ASMGEMM_BUILD_MEMO"


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    """sha256 over asmgemm's own code: a changed pass or emitter never answers from an old entry."""
    roots = [Path(__file__).resolve().parent, Path(str(resources.files("asmgemm.scheduler"))),
             Path(str(resources.files("asmgemm.grammar")))]
    h = hashlib.sha256()
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.suffix in (".py", ".lark") and p.is_file():
                h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _file_digest(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def entry_path(source_path: str, text: str, options) -> Path | None:
    """Where the memo keeps this build, or None when ASMGEMM_BUILD_MEMO is not set."""
    folder = os.environ.get(BUILD_MEMO_ENV)
    if not folder:
        return None
    opts = {k: (sorted(v.items()) if isinstance(v, dict) else v) for k, v in vars(options).items()}
    h = hashlib.sha256(_code_digest().encode())
    h.update(json.dumps([source_path, os.getcwd(), opts], default=str, sort_keys=True).encode())
    h.update(text.encode("utf-8"))
    return Path(folder) / f"build-{h.hexdigest()}.pickle"


def read(path: Path | None):
    """The kept build at `path`, or None: no entry, an unreadable one, or one whose included files
    changed since."""
    if path is None:
        return None
    try:
        includes, result = pickle.loads(zlib.decompress(path.read_bytes()))
    except (OSError, zlib.error, pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError):
        return None
    if any(_file_digest(p) != digest for p, digest in includes):
        return None
    return result


def write(path: Path | None, result) -> None:
    """Keep a successful build, written whole (another worker may read the folder at any time)."""
    if path is None:
        return
    includes = [(str(p), _file_digest(str(p))) for p in result.includes]
    try:
        # compressed (fast level): a sweep keeps thousands of builds, ~0.4 MB each as plain pickles
        data = zlib.compress(pickle.dumps((includes, result), protocol=pickle.HIGHEST_PROTOCOL), 1)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError):
        return          # a result that does not pickle is built again next time
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass            # a memo that cannot be written costs the memo, not the build
