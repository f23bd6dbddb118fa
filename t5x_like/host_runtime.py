"""Process-wide settings that make jax's CPU backend fast, applied when `t5x_like` is imported
in a process that will run on the CPU (`apply_cpu_process_settings`: not where JAX_PLATFORMS or
an installed TPU/GPU plugin says an accelerator will run, and not with T5X_LIKE_CPU_TUNING=off).

Two things cost the standard CPU benchmark step about a third of its time, neither of them
arithmetic (`benchmarks/HISTORY.md`, "Closing the gap" and its part 2):

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

And a clean log (`quiet_library_logs`): a CPU run printed TensorFlow's start-up notices
(oneDNN, "Could not find cuda drivers", the CPU-instructions banner), TensorFlow's failed
`cuInit` on hosts without a GPU, and two absl warnings about the libraries' own workings, none
of which the user can or need act on. Each is dropped by its exact text; errors and warnings
that could concern the user still print.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import importlib.abc
import importlib.util
import logging
import os
import platform
import re
import sys
import tempfile
import warnings
from types import ModuleType
from typing import Callable, ContextManager, Iterator

CPU_XLA_FLAGS = {"--xla_cpu_experimental_ynn_fusion_type": "dot"}

MALLOC_ENV = "T5X_LIKE_HOST_MALLOC"
# T5X_LIKE_CPU_TUNING=off leaves out every CPU-specific choice: the process settings here and
# the CPU layouts of sums and products (`reductions.sums_as_dots`, `products`), so jax's own
# defaults run; e.g. to measure what the tuning buys on a new CPU.
CPU_TUNING_ENV = "T5X_LIKE_CPU_TUNING"
# Python modules whose presence means jax will start an accelerator backend by default.
ACCELERATOR_PLUGINS = ("libtpu", "jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm7_plugin")

# What `apply_cpu_process_settings` did in this process, for logs and tests.
applied_settings: list[str] = []


def cpu_tuning_enabled() -> bool:
    """Whether the CPU tuning is on (T5X_LIKE_CPU_TUNING is not off / 0 / false)."""
    return os.environ.get(CPU_TUNING_ENV, "on").strip().lower() not in ("off", "0", "false")


def accelerator_expected() -> bool:
    """Will jax run on an accelerator in this process? Answered before jax starts a backend
    (which would be too late for the process settings): JAX_PLATFORMS decides when set (its
    first entry), otherwise an installed TPU or GPU plugin means jax will pick that device."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms:
        return platforms.split(",")[0].strip() != "cpu"
    return any(importlib.util.find_spec(name) is not None for name in ACCELERATOR_PLUGINS)


def apply_cpu_process_settings() -> list[str]:
    """The CPU backend's process-wide settings (module docstring), where they help: the CPU
    tuning is on and no accelerator is expected. Returns what was applied."""
    if not cpu_tuning_enabled() or accelerator_expected():
        return applied_settings
    flags_before = os.environ.get("XLA_FLAGS", "")
    set_default_xla_flags()
    if os.environ.get("XLA_FLAGS", "") != flags_before:
        applied_settings.append("xla_cpu_flags")
    if keep_freed_memory():
        applied_settings.append("keep_freed_memory")
        release_memory_after_compiles()
        applied_settings.append("release_memory_after_compiles")
    return applied_settings


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
    return all(
        libc.mallopt(param, value) == 1
        for param, value in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _NEVER))
    )


# Whether TensorFlow has been told to leave the GPUs alone in this process.
tensorflow_gpus_hidden = False


def _hide_gpus(tf: ModuleType) -> None:
    """tf.config.set_visible_devices([], 'GPU'); TF refuses once its runtime has started (an
    op ran before), which is then said, not raised: the run still works, with less memory."""
    global tensorflow_gpus_hidden
    try:
        with native_stderr_without(_no_gpu_host_noise):
            tf.config.set_visible_devices([], "GPU")
    except RuntimeError as e:
        warnings.warn(
            f"TensorFlow started before t5x_like could hide the GPUs from it ({e}); "
            "it may hold GPU memory JAX needs. Import t5x_like (or call "
            "t5x_like.host_runtime.hide_gpus_from_tensorflow()) before any "
            "TensorFlow op runs.",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    tensorflow_gpus_hidden = True


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `callback(module)` once, right after the module `name` has been imported (no
    post-import hook exists in Python): finds the module's spec through the other finders
    and wraps that spec's loader's `exec_module`, leaving the loader otherwise as it is."""

    def __init__(
        self,
        name: str,
        callback: Callable[[ModuleType], None],
        around: Callable[[], ContextManager] = contextlib.nullcontext,
    ) -> None:
        self.name, self.callback, self.around = name, callback, around
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
        exec_module, callback, around = spec.loader.exec_module, self.callback, self.around

        def exec_then_call(module: ModuleType) -> None:
            with around():
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
    elif not any(getattr(f, "callback", None) is _hide_gpus for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport("tensorflow", _hide_gpus))


# ------------------------------------------------------------------------ a clean log
# TensorFlow's C++ log lines (absl's format: severity, date, time, thread, file:line]).
_NATIVE_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ [^\]]+\] ")
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
# absl says this once per library that logs before its log is set up (TF's two libraries
# each log their start-up notices then); it announces the lines dropped below.
_PRE_INIT_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called"
# TensorFlow's error on a host without an NVIDIA driver, when it first lists its devices
# (hide_gpus_from_tensorflow does): such a host has no GPU to use.
_NO_GPU_CUINIT = "failed call to cuInit"
# absl (Python) warnings about the libraries' own workings, by their opening words:
ABSL_NOISE = (
    # orbax-checkpoint registers its own handler for jax.Array over its default one, on
    # import (orbax/checkpoint/_src/serialization/type_handler_registry.py).
    "Type handler registry type",
    # seqio warns when training on a FunctionDataset (the offline corpus, text_corpus),
    # because a restart would reshuffle it; t5x_like's input is in a fixed order and a
    # resumed run continues from the saved input position (train_data), so it does not.
    "Using an uncached FunctionDataset for training",
)


def has_nvidia_device() -> bool:
    """Whether the NVIDIA driver made a device node (/dev/nvidia0, ...): a host without one
    has no GPU for TensorFlow or JAX, however CUDA's libraries are installed."""
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def _tf_min_log_level() -> int:
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


def _tf_startup_noise(line: str) -> bool:
    """A line TensorFlow logs while it loads, below TF_CPP_MIN_LOG_LEVEL: it logs them before
    reading that setting, so they print whatever it is."""
    if line.startswith(_PRE_INIT_NOTICE):
        return _tf_min_log_level() >= 1
    match = _NATIVE_LINE.match(line)
    return bool(match) and _SEVERITY[match.group(1)] < _tf_min_log_level()


def _no_gpu_host_noise(line: str) -> bool:
    return _NO_GPU_CUINIT in line and not has_nvidia_device()


@contextlib.contextmanager
def native_stderr_without(drop: Callable[[str], bool]) -> Iterator[None]:
    """Hold what is written to file descriptor 2 (C++ code writes there directly, past
    sys.stderr) while the block runs, then write it out less the lines `drop` matches. A file
    rather than a pipe, so a chatty library cannot fill a pipe no one reads while it holds
    the GIL."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no usable stderr: nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode("utf-8", errors="replace")
            kept = "".join(line for line in text.splitlines(keepends=True) if not drop(line))
            if kept:
                os.write(2, kept.encode("utf-8"))


class _AbslNoise:
    """A logging filter dropping the records whose message begins with one of ABSL_NOISE."""

    def filter(self, record) -> bool:  # noqa: A003 - logging's Filter API
        return not str(record.msg).startswith(ABSL_NOISE)


class _OrbaxThreadTracebacks:
    """A logging filter for the failures orbax's background writer threads log as they happen
    (absl's "_SignalingThread.run() raised an exception", "Save Finalize thread ... failed",
    each with its traceback) and that asyncio logs again as "exception was never retrieved".
    A failure that stops a save is re-raised in the main thread at orbax's next wait, where the
    trainer names the cause in one line (`train_state.Checkpointer`); a full disk printed ~500
    lines of these above it. An absl record keeps its first line (the low-level cause, with
    the file), without the traceback. asyncio's copies are dropped: they repeat the writers'
    failures, and they are logged when the futures are collected, which can be after the
    trainer's one line, so a kept copy would bury the line that says what to do."""

    def filter(self, record) -> bool:  # noqa: A003 - logging's Filter API
        try:
            if record.exc_info and _passes_through_orbax(record.exc_info[2]):
                if record.name == "asyncio":
                    return False
                record.msg, record.args = record.getMessage().split("\n")[0], ()
                record.exc_info = record.exc_text = None
        except Exception:  # noqa: BLE001 - a filter must not fail inside orbax's own thread
            pass
        return True


def _passes_through_orbax(traceback) -> bool:
    orbax = f"{os.sep}orbax{os.sep}"
    while traceback is not None:
        if orbax in traceback.tb_frame.f_code.co_filename:
            return True
        traceback = traceback.tb_next
    return False


def _is_callback_into_closed_loop(unraisable) -> bool:
    """tensorstore's futures, completing after orbax closed the event loop of a save that had
    already failed, call `loop.call_soon_threadsafe` on it from C++, which reports
    "RuntimeError: Event loop is closed" as unraisable (one traceback each, dozens a failed
    save). Nothing is lost: the save's own failure is raised in the main thread."""
    traceback = unraisable.exc_traceback
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    return (
        unraisable.object is None
        and isinstance(unraisable.exc_value, RuntimeError)
        and str(unraisable.exc_value) == "Event loop is closed"
        and traceback is not None
        and traceback.tb_frame.f_code.co_name == "_check_closed"
        and traceback.tb_frame.f_code.co_filename.endswith(
            os.path.join("asyncio", "base_events.py")
        )
    )


def _drop_callbacks_into_closed_loops() -> None:
    """Chain a sys.unraisablehook that drops `_is_callback_into_closed_loop` reports and passes
    every other one to the hook before it (once per process)."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_callbacks_into_closed_loops", False):
        return

    def hook(unraisable) -> None:
        if not _is_callback_into_closed_loop(unraisable):
            previous(unraisable)

    hook.drops_callbacks_into_closed_loops = True
    sys.unraisablehook = hook


def quiet_library_logs() -> None:
    """Keep the log to what concerns the user, before TensorFlow or jax load:

    - TF_CPP_MIN_LOG_LEVEL=2 unless set: TensorFlow's C++ INFO and WARNING lines (its CPU
      instructions banner, ...) are about its build; its errors still print. Set it to 0 to
      see everything.
    - the same level applied to the lines TensorFlow logs while loading, before it reads the
      setting (oneDNN's notice, "Could not find cuda drivers"), and its failed cuInit on a
      host without an NVIDIA device (see `has_nvidia_device`);
    - the absl warnings in ABSL_NOISE;
    - the tracebacks orbax's writer threads print for a failed save, which the main thread
      reports in one line (`_OrbaxThreadTracebacks`, `_is_callback_into_closed_loop`).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "tensorflow" not in sys.modules and not any(
        getattr(f, "callback", None) is _ignore for f in sys.meta_path
    ):
        sys.meta_path.insert(
            0,
            _AfterImport(
                "tensorflow",
                _ignore,
                around=lambda: native_stderr_without(
                    lambda line: _tf_startup_noise(line) or _no_gpu_host_noise(line)
                ),
            ),
        )
    from absl import logging as absl_logging

    absl_logger = absl_logging.get_absl_logger()
    if not any(isinstance(f, _AbslNoise) for f in absl_logger.filters):
        absl_logger.addFilter(_AbslNoise())
    for logger in (absl_logger, logging.getLogger("asyncio")):
        if not any(isinstance(f, _OrbaxThreadTracebacks) for f in logger.filters):
            logger.addFilter(_OrbaxThreadTracebacks())
    _drop_callbacks_into_closed_loops()


def _ignore(_: ModuleType) -> None:
    """No follow-up: `quiet_library_logs` only wraps TensorFlow's import."""
