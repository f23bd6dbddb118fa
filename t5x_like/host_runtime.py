"""Process-wide settings that make jax's CPU backend fast, applied when `t5x_like` is imported.

Two things cost the standard CPU benchmark step about a third of its time, neither of them
arithmetic (`benchmarks/README.md`):

- XLA's CPU default hands reductions to its YNNPACK fusions too, and some ran slowly: the
  package asks for YNNPACK on matrix multiplies only
  (`--xla_cpu_experimental_ynn_fusion_type=dot`) unless XLA_FLAGS already chooses.
- Every step XLA allocates its temporary buffer (1.3 GB on that step) and YNNPACK a scratch
  buffer per matmul (32 MB, ~100 a step); glibc serves such sizes with fresh `mmap`s and
  returns them to the kernel on `free`, so each step page-faulted ~390,000 pages back in (0.7 s
  of system time on 2 cores). `keep_freed_memory` makes glibc serve them from one heap it does
  not give back, so steps after the first reuse warm pages. The process's peak memory is
  unchanged (the step needs those buffers anyway); it just does not shrink between steps.
  Set `T5X_LIKE_HOST_MALLOC=default` to leave glibc's allocator as it is.

Both must happen before jax starts its backend threads, which is why the package's
`__init__` applies them and every entry point imports the package first.
"""

from __future__ import annotations

import ctypes
import os
import platform

CPU_XLA_FLAGS = {"--xla_cpu_experimental_ynn_fusion_type": "dot"}

MALLOC_ENV = "T5X_LIKE_HOST_MALLOC"

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
# -1 disables trimming (mallopt(3)); glibc stores the threshold as a size_t, so this is
# SIZE_MAX. INT_MAX (2 GiB), the largest positive value, is not enough: the decoder-only
# benchmark step's temporary buffer is 3.1 GB, and a heap trimmed every step page-faulted it
# back in at 1.5-2.3 s of system time per 5.5 s step.
_NEVER = -1


def set_default_xla_flags() -> None:
    """Add `CPU_XLA_FLAGS` to XLA_FLAGS, except those the user already set."""
    flags = os.environ.get("XLA_FLAGS", "")
    extra = [f"{name}={value}" for name, value in CPU_XLA_FLAGS.items() if name not in flags]
    if extra:
        os.environ["XLA_FLAGS"] = " ".join([flags, *extra]).strip()


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse instead of unmapping it: one arena (so worker
    threads' buffers are not separate heaps deleted when empty), no `mmap` for large blocks,
    no trimming of the heap. Returns whether it was applied (not on
    other C libraries, or when T5X_LIKE_HOST_MALLOC=default)."""
    if os.environ.get(MALLOC_ENV, "") == "default" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return all(libc.mallopt(param, value) == 1 for param, value in (
        (_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _NEVER)))
