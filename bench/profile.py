"""Reading py-spy's raw output (`--profile raw`: collapsed stacks, one `frame;frame;... count` line
per distinct stack) into the functions where the broker spent its samples, for results.md.
Frames are merged per function (py-spy names each line apart); the "total" list keeps neve's own
functions only, since the interpreter's and the event loop's frames are on every stack."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

TOP = 15
NEVE_PACKAGES = ("broker/", "wal/", "metadata/", "cache/", "neve/", "compactor/", "table/", "registry/")
_LINE = re.compile(r":\d+\)$")


def _function(frame: str) -> str:
    """`encode (wal/format.py:108)` -> `encode (wal/format.py)`."""
    return _LINE.sub(")", frame)


def hot_frames(path: Path, top: int = TOP) -> dict:
    """Samples in total, and the `top` frames by self samples (the frame was running) and by total
    samples (the frame was on the stack), each with its share of all samples."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_function(f) for f in stack.split(";")]
        samples += n
        own[frames[-1]] += n
        for frame in set(frames):
            if any(f"({p}" in frame for p in NEVE_PACKAGES):
                total[frame] += n

    def share(counter: Counter[str]) -> list[list]:
        return [[frame, n, round(100 * n / samples, 1)] for frame, n in counter.most_common(top)] if samples else []

    return {"samples": samples, "self": share(own), "total": share(total)}
