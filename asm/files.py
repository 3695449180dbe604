"""Files asmgemm reads and writes: `read_source` (a .sasm/.ptx file as text, or a located error),
`read_json` (a JSON document, gzipped or not: sweep samples, kept measurements), the one
atomic-write helper and the one cache-folder lookup. Reading lives here, not in source.py, because
its errors are AsmErrors and errors.py builds on source.py's positions.

Every output (PTX, cubin, JSON reports, the kernel and tuning caches, benchmark baselines) goes
through `write_files` (several outputs of one command, committed together) or `write_atomic`
(one output): a temporary file in the destination's folder, then a rename, so a reader sees the
old file or the new one, never half of one, and a failed or interrupted command leaves nothing
behind.

What a destination may be:
  * a new or existing regular file: replaced by the rename; an existing file keeps its mode, a new
    one gets 0666 less the umask (what a plain open() gives);
  * a symbolic link: followed; the file it points to is replaced, the link stays;
  * an existing character device or FIFO (`-o /dev/null`, `-o >(gzip > x.gz)`): opened and
    written in place, never replaced by a regular file;
  * never a folder, another kind of special file, one of the command's inputs (the same file by
    device and inode, through whatever spelling or link), or the destination of another output
    of the same command. Each of these is an AsmError before anything is written.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import secrets
import stat
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .errors import AsmError
from .source import SourceFile, Span, normalise_text


def cache_root() -> Path:
    """$ASMGEMM_CACHE_DIR, else $XDG_CACHE_HOME/asmgemm, else ~/.cache/asmgemm. The kernel cache
    (kernels/) and the tuning cache (tune.json) live under it."""
    base = os.environ.get("ASMGEMM_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "asmgemm"


class CacheWarning(RuntimeWarning):
    """asmgemm found a damaged or unusable cache (a kernel-cache entry, the tuning cache, a cache
    folder it cannot write) and went on without it: rebuilt, ran untuned, or built in memory."""


_warned: set[str] = set()


def warn_cache(message: str, *, once: str | None = None) -> None:
    """One CacheWarning (once per process for the key `once`), attributed to the first caller
    outside asmgemm, so Python shows the user's line; the commands print it as one line
    (`cache_warnings_as_lines`)."""
    if once is not None:
        if once in _warned:
            return
        _warned.add(once)
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(0), 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, CacheWarning, stacklevel=level)


@contextlib.contextmanager
def cache_warnings_as_lines():
    """Within the block, each CacheWarning is printed as one line on standard error,
    `asmgemm: warning: ...` (how the commands show them); other warnings as Python shows them."""
    with warnings.catch_warnings():
        original = warnings.showwarning
        warnings.simplefilter("always", CacheWarning)     # warn_cache already says each thing once

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, CacheWarning):
                text = str(message).removeprefix("asmgemm: ")
                print(f"asmgemm: warning: {text}", file=sys.stderr, flush=True)
            else:
                original(message, category, filename, lineno, file, line)
        warnings.showwarning = show
        yield


def _umask() -> int:
    """The process's umask, read without changing it where the system says it (Linux), so that a
    thread creating a file meanwhile is not given a wrong mode."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def _mode_for(path: Path) -> int:
    """The mode a plain open() would leave: the existing regular file's (without set-user/group-ID
    bits), else 0666 less the umask (mkstemp alone would make every output 0600)."""
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode):
            return st.st_mode & 0o1777
    except OSError:
        pass
    return 0o666 & ~_umask()


@dataclass
class _Dest:
    shown: str                 # the path as the caller spelled it
    target: Path               # where the bytes go: a file by its real path (links followed), a device by its name
    data: bytes | tuple[str, ...]   # ASCII text in pieces, encoded a piece at a time as written (_write_data)
    identity: tuple | None     # (st_dev, st_ino) of the existing file, None for a new one
    in_place: bool             # an existing character device or FIFO: opened and written, no rename
    char_device: bool = False
    tmp: str | None = None
    backup: str | None = None
    committed: bool = False


def _identities(paths: Iterable) -> dict[tuple, str]:
    out = {}
    for p in paths:
        if p is None:
            continue
        with contextlib.suppress(OSError, ValueError):
            st = os.stat(p)
            out.setdefault((st.st_dev, st.st_ino), str(p))
    return out


def _plan(path, data, inputs: dict[tuple, str]) -> _Dest:
    shown = os.fspath(path)
    if shown == "":
        raise AsmError("cannot write to an empty path")
    # ASCII text (PTX) is encoded as it is written, a piece at a time: encoded whole, a large
    # kernel's PTX was held twice at the build's peak. Other text is encoded here, so that one that
    # cannot be is refused before anything is written. Text may come in pieces (a str each), written
    # one after another: the emitter's (emit.EmittedPtx.pieces), never joined.
    if isinstance(data, (str, list, tuple)):
        pieces = (data,) if isinstance(data, str) else tuple(data)
        raw = pieces if all(p.isascii() for p in pieces) else "".join(pieces).encode("utf-8")
    else:
        raw = bytes(data)
    try:
        st = os.stat(shown)            # follows symbolic links (and /dev/stdout's /proc link)
    except FileNotFoundError:
        st = None
    except (OSError, ValueError) as exc:
        raise AsmError(f"cannot write {shown}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        # a device or FIFO is opened by the name given; a file is replaced where its links lead
        target = Path(shown) if st is not None and not stat.S_ISREG(st.st_mode) else Path(os.path.realpath(shown))
    except (OSError, ValueError) as exc:
        raise AsmError(f"cannot write {shown}: {exc}") from None
    in_place = char_device = False
    identity = None
    if st is not None:
        identity = (st.st_dev, st.st_ino)
        if identity in inputs:
            same = inputs[identity]
            what = "the input" if os.path.abspath(same) == os.path.abspath(shown) else f"the input {same}"
            raise AsmError(f"refusing to write {shown}: it is {what}, which the output would replace",
                           hint="name a different output file (e.g. -o out.ptx)")
        if stat.S_ISDIR(st.st_mode):
            raise AsmError(f"cannot write {shown}: it is a folder", hint="name a file inside it")
        if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            in_place, char_device = True, stat.S_ISCHR(st.st_mode)
            if not os.access(target, os.W_OK):
                raise AsmError(f"cannot write {shown}: permission denied")
        elif not stat.S_ISREG(st.st_mode):
            raise AsmError(f"cannot write {shown}: not a regular file (nor a character device or FIFO)")
    if not in_place:
        folder = target.parent
        shown_folder = os.path.dirname(shown) or "."
        if not folder.is_dir():
            raise AsmError(f"cannot write {shown}: folder {shown_folder} does not exist")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise AsmError(f"cannot write {shown}: folder {shown_folder} is not writable")
    return _Dest(shown, target, raw, identity, in_place, char_device)


def _plan_all(outputs, inputs) -> list[_Dest]:
    ids = _identities(inputs)
    dests = [_plan(path, data, ids) for path, data in outputs]
    seen: dict[object, _Dest] = {}
    for d in dests:
        key = d.identity if d.identity is not None else str(d.target)
        other = seen.get(key)
        if other is not None and not d.char_device:     # -o /dev/null --cubin /dev/null is fine
            if other.shown == d.shown:
                raise AsmError(f"{d.shown} is named for two outputs: each output needs its own file")
            raise AsmError(f"{other.shown} and {d.shown} are the same file: each output needs its own")
        seen[key] = d
    return dests


def check_outputs(paths: Iterable, *, inputs: Iterable = ()) -> None:
    """Raise the AsmError that writing to `paths` would raise (missing or read-only folder, a folder,
    an input, two outputs on one file) without writing anything: for commands that work a long time
    before they write."""
    _plan_all([(p, b"") for p in paths], inputs)


def _write_temp(d: _Dest, durable: bool) -> None:
    fd, d.tmp = tempfile.mkstemp(prefix=f".{d.target.name}.", suffix=".tmp", dir=d.target.parent)
    with os.fdopen(fd, "wb") as fh:
        _write_data(fh, d.data)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    os.chmod(d.tmp, _mode_for(d.target))


def _link_backup(d: _Dest) -> None:
    """A hard link to the old file, so a later failure can put it back (best effort: a file system
    without hard links gets no backup)."""
    if d.identity is None:
        return
    for _ in range(8):
        name = d.target.parent / f".{d.target.name}.{secrets.token_hex(6)}.bak"
        try:
            os.link(d.target, name)
        except FileExistsError:
            continue
        except OSError:
            return
        d.backup = str(name)
        return


def _write_in_place(d: _Dest) -> None:
    with open(d.target, "wb") as fh:
        _write_data(fh, d.data)


_WRITE_CHARS = 1 << 20


def _write_data(fh, data: bytes | tuple[str, ...]) -> None:
    if isinstance(data, bytes):
        fh.write(data)
        return
    for piece in data:
        for at in range(0, len(piece), _WRITE_CHARS):
            fh.write(piece[at:at + _WRITE_CHARS].encode("ascii"))


def write_files(outputs: Iterable[tuple[str | os.PathLike, str | bytes | tuple[str, ...]]], *, inputs: Iterable = (),
                durable: bool = False) -> None:
    """Write several outputs of one command as one commit: every destination is checked first
    (folder exists and is writable, not a folder, not one of `inputs`, no two outputs on one file),
    then every temporary file is written, then all are renamed into place (character devices and
    FIFOs are written in place last). On any failure, KeyboardInterrupt included, the temporary
    files are removed and every old file is left as it was (renames already done are undone).

    durable=True also fsyncs each file before its rename (caches other processes read
    concurrently). Raises AsmError (never OSError)."""
    dests = _plan_all(list(outputs), inputs)
    several = len(dests) > 1
    current = None
    try:
        for d in dests:
            if not d.in_place:
                current = d
                _write_temp(d, durable)
        for d in dests:
            if not d.in_place:
                current = d
                if several:
                    _link_backup(d)
                os.replace(d.tmp, d.target)
                d.tmp, d.committed = None, True
        for d in dests:
            if d.in_place:
                current = d
                _write_in_place(d)
        if durable:
            for folder in {d.target.parent for d in dests if d.committed}:
                with contextlib.suppress(OSError):
                    fd = os.open(folder, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
    except BaseException as exc:
        for d in reversed(dests):
            if d.committed:
                with contextlib.suppress(OSError):
                    if d.backup:
                        os.replace(d.backup, d.target)
                        d.backup = None
                    elif d.identity is None:
                        os.unlink(d.target)
            if d.tmp:
                with contextlib.suppress(OSError):
                    os.unlink(d.tmp)
        if isinstance(exc, OSError):
            shown = current.shown if current else "the outputs"
            raise AsmError(f"cannot write {shown}: {exc.strerror or exc}") from None
        raise
    finally:
        for d in dests:
            if d.backup:
                with contextlib.suppress(OSError):
                    os.unlink(d.backup)


def write_atomic(path: str | os.PathLike, data: str | bytes, *, durable: bool = False,
                 inputs: Iterable = ()) -> None:
    """Write one output: `write_files([(path, data)], ...)`."""
    write_files([(path, data)], inputs=inputs, durable=durable)


# ---- reading a JSON document ---------------------------------------------------------------
def read_json(path: str | Path, what: str = "a JSON document"):
    """A .json or .json.gz file's document; a missing, damaged or invalid one is an AsmError that
    names the file (and the line and column of invalid JSON)."""
    name = str(path)
    try:
        raw = Path(path).read_bytes()
        if name.endswith(".gz"):
            raw = gzip.decompress(raw)
        return json.loads(raw.decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise AsmError(f"{name}:{exc.lineno}:{exc.colno}: error: not valid JSON: {exc.msg}") from None
    except (OSError, UnicodeDecodeError, EOFError, ValueError) as exc:    # (gzip: a damaged stream)
        raise AsmError(f"cannot read {what} {name}: {exc}") from None


# ---- reading a source file -----------------------------------------------------------------
def read_source(path: str | Path, *, shown_as: str | None = None) -> SourceFile:
    """Read a .sasm/.ptx file as UTF-8; undecodable bytes are a user error with a position."""
    p = Path(path)
    name = shown_as or str(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise AsmError(f"no such file: {name}") from None
    except IsADirectoryError:
        raise AsmError(f"{name} is a directory, not a source file") from None
    except OSError as exc:
        raise AsmError(f"cannot read {name}: {exc.strerror}") from None
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        src = SourceFile.from_text(name, "\ufffd")
        raise AsmError("this file is UTF-16 (it starts with a UTF-16 byte-order mark); "
                       "source files must be UTF-8: save it as UTF-8", Span(src, 0, 1))
    if data.startswith(b"\xef\xbb\xbf"):   # a UTF-8 byte-order mark: not part of the text
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        # Report the position of the bad byte in terms the editor shows: line and column.
        # The rest of the file is shown decoded with U+FFFD for bad bytes; the offset is taken
        # after line endings are normalised, as for any other error.
        at = len(normalise_text(data[: exc.start].decode("utf-8", errors="replace")))
        src = SourceFile.from_text(name, data.decode("utf-8", errors="replace"))
        raise AsmError(
            f"invalid UTF-8 byte 0x{data[exc.start]:02x} (source files must be UTF-8 text)",
            Span(src, at, at + 1),
        ) from None
    if "\x00" in text:
        src = SourceFile.from_text(name, text)
        i = src.text.index("\x00")
        raise AsmError("NUL byte in source: this looks like a binary file, not .sasm/.ptx text",
                       Span(src, i, i + 1))
    return SourceFile.from_text(name, text)
