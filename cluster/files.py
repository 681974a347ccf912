"""Files: the cache directory, and durable writes of a run's files (a reader sees the old content
or the new, never a part).

Checkpoints (learner.trainer), the `latest` pointer and metrics.parquet (jobs.training) are
written beside their final name, flushed to disk, then renamed over it; the directory entry is
flushed too, so a power loss after the rename cannot bring back the old name's content.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def default_cache_dir() -> Path:
    """Where built artefacts are kept between runs (tiny models, ALFWorld's compiled games):
    $APPRENTICE_CACHE, else ~/.cache/apprentice."""
    return Path(os.environ.get("APPRENTICE_CACHE", Path.home() / ".cache" / "apprentice"))


def fsync_path(path: str | Path) -> None:
    """Flush one file or directory (its entries) to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_tree(root: Path) -> None:
    """Flush every file and directory under `root`, so a rename that follows never publishes a
    directory whose bytes a power loss would drop."""
    for directory, _, names in os.walk(root):
        for name in names:
            fsync_path(os.path.join(directory, name))
        fsync_path(directory)


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` writes the new content to a temporary file beside `path`, which then
    replaces `path` in one rename."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    fsync_path(tmp)
    os.replace(tmp, path)
    fsync_path(path.parent)
