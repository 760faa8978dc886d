"""Read a growing JSONL file incrementally: remember the byte offset, parse only new lines.

A torn last line (the writer is mid-write) is left for the next read; a line
that is not a JSON object (cut short by a kill, hand-edited) is skipped. A file
that shrank (metrics.jsonl cut back on resume) or was replaced (samples.jsonl
rotated: new inode) is read again from the start, and `reset` says so.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class JsonlTail:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.inode: int | None = None
        self.reset = False  # the last read started over (the caller drops what it kept)

    def read(self) -> list[dict[str, Any]]:
        """The records appended since the last call."""
        self.reset = False
        try:
            st = os.stat(self.path)
        except OSError:
            return []
        if st.st_ino != self.inode or st.st_size < self.offset:
            self.reset = self.inode is not None
            self.inode, self.offset = st.st_ino, 0
        if st.st_size == self.offset:
            return []
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(st.st_size - self.offset)
        except OSError:  # not a file, or not readable: nothing to show
            return []
        end = data.rfind(b"\n") + 1  # only whole lines
        self.offset += end
        lines = [line for line in data[:end].splitlines() if line.strip()]
        try:  # one parse of the whole chunk: several times faster than a call per line
            records = json.loads(b"[" + b",".join(lines) + b"]")
        except ValueError:  # a line cut short by a kill (then appended to), or not UTF-8
            records = [_record(line) for line in lines]
        return [r for r in records if isinstance(r, dict)]


def _record(line: bytes) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None


def last_record(path: Path, window: int = 65536) -> dict[str, Any] | None:
    """The last complete record of a JSONL file, read from its end (for run lists: no full parse)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - window))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        record = _record(line)
        if isinstance(record, dict):
            return record
    return None
