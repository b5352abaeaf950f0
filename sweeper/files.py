"""State files written atomically: a reader, a crash or a power cut sees the old file or the
new one, never half of one.

Each write goes to a temp file beside the target (``.NAME.tmp-PID-TOKEN``, same folder so the
rename stays on one file system), is flushed and fsynced, then replaces the target with
``os.replace``; the folder is fsynced too, so the rename itself survives a power cut. A process
killed mid-write leaves its temp file behind: ``remove_stale_temps`` deletes those whose process
is gone (the next `sweeper run` of the folder calls it).
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

# .NAME.tmp-PID-TOKEN: the PID says whether its writer may still be at work
_TEMP = re.compile(r"^\..+\.tmp-(\d+)-[0-9a-f]+$")


def temp_path(path: Path) -> Path:
    """Where ``path``'s next version is written before it replaces ``path``."""
    return path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """Yields a temp path to write (by name: ``torch.save(state, tmp)``); when the block ends
    without error the temp file is fsynced and replaces ``path``. On error it is removed and
    ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_folder(path.parent)


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` atomically; returns ``path``."""
    with replacing(Path(path)) as tmp:
        with open(tmp, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def remove_stale_temps(folder: Path) -> list[Path]:
    """Delete the temp files under ``folder`` (recursively) whose writing process is no longer
    alive on this machine; a live one's (a `sweeper worker` sharing the folder) are kept.
    Returns what was removed."""
    removed = []
    for tmp in Path(folder).rglob(".*.tmp-*"):
        match = _TEMP.match(tmp.name)
        if match and tmp.is_file() and not _alive(int(match.group(1))):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
                removed.append(tmp)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except (ProcessLookupError, OverflowError):  # gone, or a PID no process can have
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX; where folders cannot be opened, skipped)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
