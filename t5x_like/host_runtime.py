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
- A heap that is never trimmed also keeps what XLA's compiler freed, resident though unused:
  the step's temporary buffer is too large to fit in those holes, so they added to the peak
  (210 MiB of 2.1 GB on the standard T5 step). `release_memory_after_compiles` hands the free
  pages back to the kernel once after each large compile.

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


# jax records each backend compile's duration under this event (jax._src.dispatch's
# BACKEND_COMPILE_EVENT), after the compiler has returned and freed its working memory.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
# Compiles shorter than this leave little behind, and a trim costs 10-50 ms (a walk over the
# heap): eager code compiles hundreds of tiny programs, a train step is a 10 s compile.
RELEASE_AFTER_COMPILES_OF_S = 1.0


def _libc() -> ctypes.CDLL | None:
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def release_free_memory() -> bool:
    """Give the heap's free pages back to the kernel (glibc's malloc_trim): they stay free
    for reuse, but no longer count as resident until something writes them again. Returns
    whether glibc was there to ask."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(ctypes.c_size_t(0))
    return True


_releasing_after_compiles = False


def _release_after_large_compile(event: str, duration_s: float, **_: object) -> None:
    if event == COMPILE_EVENT and duration_s >= RELEASE_AFTER_COMPILES_OF_S:
        release_free_memory()


def release_memory_after_compiles() -> None:
    """Release the heap's free pages after every compile of at least
    RELEASE_AFTER_COMPILES_OF_S (a jax.monitoring listener; once per process)."""
    global _releasing_after_compiles
    if not _releasing_after_compiles:
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(_release_after_large_compile)
        _releasing_after_compiles = True


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse instead of unmapping it: one arena (so worker
    threads' buffers are not separate heaps deleted when empty), no `mmap` for large blocks,
    no trimming of the heap. Returns whether it was applied (not on
    other C libraries, or when T5X_LIKE_HOST_MALLOC=default)."""
    libc = _libc()
    if os.environ.get(MALLOC_ENV, "") == "default" or libc is None:
        return False
    return all(libc.mallopt(param, value) == 1 for param, value in (
        (_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _NEVER)))
