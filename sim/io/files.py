"""Files every package writes the same way: user-given names made safe as file names, and
atomic writes (a crash mid-write leaves the old file, never half a new one)."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]+")
_MAX_NAME_CHARS = 80


def file_name(name: str) -> str:
    """The one way a user-given name (scenario, strategy, sweep) becomes a file name: one plain
    path component that cannot leave its folder. A name of letters, digits and `_.+-` (not
    leading with `.` or `-`) is kept; any other is slugged (separators, `..`, control and
    non-ASCII characters become `_`) and suffixed with a hash of the original, so two names
    never share files."""
    slug = _UNSAFE.sub("_", name).lstrip(".-~_")
    if slug == name and len(name) <= _MAX_NAME_CHARS:
        return name
    digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{slug[:_MAX_NAME_CHARS] or 'unnamed'}-{digest}"


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename, so no half file remains."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes files private; reports are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
