"""Where every benchmark's JSON goes: one helper, so each writes the same way."""

from __future__ import annotations

import json
import os
import time
from importlib import metadata
from typing import Any


def write_json(path: str, data: Any) -> None:
    """Write `data` to `path` (creating its directory) and say so."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
    print(f"wrote {path}")


def write_rows(path: str, rows: list[dict[str, Any]]) -> None:
    """A benchmark's table rows with what they were measured on and when."""
    write_json(
        path,
        {
            "rows": rows,
            "host_cpus": os.cpu_count(),
            "jax": metadata.version("jax"),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
    )
