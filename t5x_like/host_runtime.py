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

On GPU hosts one more process-wide setting: TensorFlow (seqio's input pipeline) must not see
the GPUs, or its first op reserves most of their memory for itself and JAX runs out
(`hide_gpus_from_tensorflow`, as t5x and MaxText do before training).
"""

from __future__ import annotations

import ctypes
import importlib.abc
import importlib.util
import os
import platform
import sys
import warnings
from types import ModuleType
from typing import Callable

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


# Whether TensorFlow has been told to leave the GPUs alone in this process.
tensorflow_gpus_hidden = False


def _hide_gpus(tf: ModuleType) -> None:
    """tf.config.set_visible_devices([], 'GPU'); TF refuses once its runtime has started (an
    op ran before), which is then said, not raised: the run still works, with less memory."""
    global tensorflow_gpus_hidden
    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError as e:
        warnings.warn(f"TensorFlow started before t5x_like could hide the GPUs from it ({e}); "
                      "it may hold GPU memory JAX needs. Import t5x_like (or call "
                      "t5x_like.host_runtime.hide_gpus_from_tensorflow()) before any "
                      "TensorFlow op runs.", RuntimeWarning, stacklevel=3)
        return
    tensorflow_gpus_hidden = True


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `callback(module)` once, right after the module `name` has been imported (no
    post-import hook exists in Python): finds the module's spec through the other finders
    and wraps that spec's loader's `exec_module`, leaving the loader otherwise as it is."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name, self.callback = name, callback
        self._finding = False

    def find_spec(self, fullname, path=None, target=None):  # noqa: ARG002 - finder API
        if fullname != self.name or self._finding:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        if spec is None or spec.loader is None:
            return spec
        exec_module, callback = spec.loader.exec_module, self.callback

        def exec_then_call(module: ModuleType) -> None:
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_then_call  # type: ignore[method-assign]
        return spec


def hide_gpus_from_tensorflow() -> None:
    """Keep TensorFlow off the GPUs before its first op: now if it is imported, else as soon
    as it is (no import of TensorFlow here, which costs seconds where it is not needed)."""
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        _hide_gpus(tf)
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport("tensorflow", _hide_gpus))
