"""The grammars' LALR tables, kept between processes.

Lark analyses grammar/sasm.lark in about half a second on every start, a quarter of the time a
2 MB source may take to build. The tables it computes are plain data (Lark.memo_serialize), kept
here as JSON under the cache folder, keyed by a hash of the grammar text, the options and Lark's
version. JSON, not Lark's own pickle cache: reading this file back can only ever give data, never
run code. Tuples and integer keys, which JSON lacks, are written as {"t": [...]} and
{"d": [[key, value], ...]}.

A file that is missing, of another key, or damaged is rebuilt from the grammar (and written
again); a folder that cannot be written leaves every start analysing the grammar afresh, as before.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from lark import Lark
from lark import __version__ as lark_version
from lark.grammar import Rule
from lark.lexer import TerminalDef

from .files import cache_root

FOLDER = "parsers"


def cached_lark(name: str, text: str, **options):
    key = hashlib.sha256(json.dumps([text, sorted((k, repr(v)) for k, v in options.items()), lark_version])
                         .encode()).hexdigest()[:32]
    path = _folder() / f"{Path(name).stem}-{key}.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("key") == key:
            return Lark._load_from_dict(_decode(doc["data"]), _decode(doc["memo"]))
    except Exception:                   # missing or damaged: the grammar is analysed again below
        pass
    parser = Lark(text, **options)
    try:
        data, memo = parser.memo_serialize([TerminalDef, Rule])
        _write(path, json.dumps({"key": key, "data": _encode(data), "memo": _encode(memo)}))
    except Exception:                   # unwritable, or data JSON cannot hold: analysed next time too
        pass
    return parser


def _folder() -> Path:
    return cache_root() / FOLDER


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)           # whole or not at all, for processes starting meanwhile
    except BaseException:
        os.unlink(tmp)
        raise


def _encode(x):
    if isinstance(x, dict):
        return {"d": [[_encode(k), _encode(v)] for k, v in x.items()]}
    if isinstance(x, tuple):
        return {"t": [_encode(v) for v in x]}
    if isinstance(x, list):
        return [_encode(v) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise TypeError(f"not plain data: {type(x).__name__}")


def _decode(x):
    if isinstance(x, list):
        return [_decode(v) for v in x]
    if isinstance(x, dict):
        if "d" in x:
            return {_decode(k): _decode(v) for k, v in x["d"]}
        return tuple(_decode(v) for v in x["t"])
    return x
