"""File modes of what a run writes for others to read.

safetensors (0.8) writes a tensor file to a temporary file and renames it into place; the temporary file
is created mode 0600, so every ``.safetensors`` file it writes (a peft adapter, a merged model, a
checkpoint) is readable by its owner only, where a plain write honours the umask (0644 under the usual
022). ``honour_umask`` gives such files the mode a plain write would have.
"""

from __future__ import annotations

import os
from pathlib import Path


def current_umask() -> int:
    """The process's umask (read from /proc where it is there: setting it to read it is not thread safe)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def honour_umask(path: Path) -> None:
    """Give ``path`` (a file, or every file under a directory) the mode a plain write gives a new file:
    ``0o666`` less the umask."""
    mode = 0o666 & ~current_umask()
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and not p.is_symlink()]
    for file in files:
        os.chmod(file, mode)
