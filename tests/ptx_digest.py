"""The PTX digest the golden tests compare: sha256 of the PTX text without its records of source
positions, which are comments. The header names the source by its absolute path (digests must not
depend on the checkout) and each `// .schedule region N (file:line:col)` marker its source line (a
new comment line, or code moved between include files, would change every digest). Instructions,
registers and immediates are all kept."""
from __future__ import annotations

import hashlib
import re

REGION_MARKER = re.compile(r"^(\s*// \.schedule region \d+) \(.*\)$", re.MULTILINE)


def normalized(ptx: str, path: str, name: str) -> str:
    """`ptx` with the source's path shown as NAME.sasm and the region markers' positions left out."""
    return REGION_MARKER.sub(r"\1", ptx.replace(path, f"{name}.sasm"))


def digest(ptx: str, path: str, name: str) -> str:
    return hashlib.sha256(normalized(ptx, path, name).encode()).hexdigest()
