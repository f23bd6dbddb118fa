"""One look for every command's log: each line starts with the local time
(`2026-12-03 17:40:01  step 100  loss ...`), and long loops show a tqdm bar with rate and ETA
on stderr, as training does, with log lines written above it.

On a terminal the bar redraws every second; into a file or a pipe (a batch job's log) every
30 s, so the log holds a progress line per half minute instead of one per item.
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any, Iterable

from tqdm import tqdm

TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
# What `stamped` puts at the start of a line (tests and log readers match against it).
STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  ")


def timestamp(when: float | None = None) -> str:
    """The local time `when` (seconds since the epoch; default now) as TIME_FORMAT."""
    return time.strftime(TIME_FORMAT, time.localtime(time.time() if when is None else when))


def stamped(message: str, when: float | None = None) -> str:
    """`message` with the time before each of its lines (two spaces after the time), so a
    multi-line message (a table) reads as lines of one moment."""
    prefix = timestamp(when) + "  "
    return "\n".join(prefix + line for line in message.split("\n"))


def log(message: str, file: Any = None) -> None:
    """Write `message` stamped, above any progress bar (tqdm.write), to stdout unless `file`,
    and flush at once (stdout may be a file or a pipe)."""
    out = sys.stdout if file is None else file
    tqdm.write(stamped(message), file=out)
    out.flush()


def progress(
    iterable: Iterable | None = None,
    *,
    desc: str,
    total: float | None = None,
    unit: str = "it",
    **kwargs: Any,
) -> tqdm:
    """A tqdm bar on stderr in train's style: `desc: 40%|####  | 4/10 [00:08<00:12, 2.0it/s]`
    (count, elapsed<ETA, rate; ETA needs `total`). `kwargs` go to tqdm (e.g. unit_scale)."""
    return tqdm(
        iterable,
        desc=desc,
        total=total,
        unit=unit,
        dynamic_ncols=True,
        mininterval=1.0 if sys.stderr.isatty() else 30.0,
        **kwargs,
    )


def unstamped(text: str) -> list[str]:
    """The lines of a log with their timestamps taken off (for reading a log by its words)."""
    return [STAMP.sub("", line) for line in text.splitlines()]
