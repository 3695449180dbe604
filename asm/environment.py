"""Reading environment variables on a per-call path.

`os.environ.get(name)` of a variable that is not set costs ~2.5 us on this project's CI host (and
~1.5 us on the H100's): Mapping.get calls __getitem__, which encodes the name and raises KeyError
for the missing key, and Mapping.get catches it. asmgemm.gemm's repeated call reads two such
variables (the spec files' $ASMGEMM_KERNEL_SPECS, the tuning cache's $ASMGEMM_NO_TUNE_CACHE) on
every call, usually unset, so those two reads were a sixth of its host time (tools/host_profile.py).
`env_value` answers the same as os.environ.get, from the dict os.environ keeps its encoded items in
(CPython's os._Environ: its _data, encodekey and decodevalue, there since Python 3.2), without the
exception; where os.environ is something else (replaced by a plain mapping) it asks that mapping.
Writes through os.environ (monkeypatch.setenv, `os.environ[k] = v`, del) update the same dict, so
a change is seen on the next read, as with os.environ.get; os.putenv alone is not, for both.
"""
from __future__ import annotations

import os

_encoded: dict[str, object] = {}        # name -> os.environ's key for it (bytes on POSIX, upper-case str on Windows)


def env_value(name: str, default: str | None = None) -> str | None:
    """os.environ.get(name, default), without raising KeyError inside for an unset name."""
    environ = os.environ
    data = getattr(environ, "_data", None)
    if type(data) is not dict:
        return environ.get(name, default)
    key = _encoded.get(name)
    if key is None:
        key = _encoded[name] = environ.encodekey(name)
    raw = data.get(key)
    return default if raw is None else environ.decodevalue(raw)


def raw_values(names: tuple[str, ...]):
    """(os.environ, the dict it keeps its encoded items in, ((key, raw value), ...) for `names`) for a
    caller that checks cheaply, call after call, that those variables did not change: they did not
    while os.environ is the same object and `data.get(key) is value` for each pair (a write through
    os.environ stores a new value object; an unset name reads None). None where os.environ keeps
    no such dict (replaced by a plain mapping): then ask env_value every time."""
    environ = os.environ
    data = getattr(environ, "_data", None)
    if type(data) is not dict:
        return None
    pairs = []
    for name in names:
        key = _encoded.get(name)
        if key is None:
            key = _encoded[name] = environ.encodekey(name)
        pairs.append((key, data.get(key)))
    return environ, data, tuple(pairs)
