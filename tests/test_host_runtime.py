"""Importing t5x_like applies the host settings the benchmarks measured: the CPU fusion flag
(without overriding a choice already made in XLA_FLAGS) and glibc keeping freed memory (so a
step's large buffers are not page-faulted in again every step)."""

import os
import platform
import resource
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _flags_after_import(xla_flags: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if xla_flags is not None:
        env["XLA_FLAGS"] = xla_flags
    return subprocess.run(
        [sys.executable, "-c", "import os, t5x_like; print(os.environ['XLA_FLAGS'])"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_default_cpu_flag_is_added_to_existing_flags():
    assert _flags_after_import(None) == "--xla_cpu_experimental_ynn_fusion_type=dot"
    assert _flags_after_import("--xla_force_host_platform_device_count=2").split() == [
        "--xla_force_host_platform_device_count=2",
        "--xla_cpu_experimental_ynn_fusion_type=dot",
    ]


def test_a_users_choice_wins():
    chosen = "--xla_cpu_experimental_ynn_fusion_type=default"
    assert _flags_after_import(chosen) == chosen


def test_the_flag_is_one_this_jax_accepts():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import t5x_like, jax, jax.numpy as jnp; "
            "print(float(jax.jit(lambda x: (x @ x).sum())(jnp.ones((4, 4)))))",
        ],
        cwd=ROOT,
        env={**env, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip().endswith("64.0")


# malloc, touch and free a 256 MiB block three times (as XLA does with a step's temporary
# buffer); print the minor page faults of the last two rounds. Kept memory is reused warm (a
# handful of faults); glibc's default unmaps the block on free, and every round faults all of
# its 65,536 pages in again.
_FAULTS = """
import ctypes, resource, sys
import t5x_like
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
n = int(sys.argv[1])
def round_trip():
    block = libc.malloc(n)
    ctypes.memset(block, 1, n)
    libc.free(block)
round_trip()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
round_trip()
round_trip()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults_reallocating(malloc_setting: str | None, size: int = 2**28) -> int:
    env = {k: v for k, v in os.environ.items() if k != "T5X_LIKE_HOST_MALLOC"}
    if malloc_setting is not None:
        env["T5X_LIKE_HOST_MALLOC"] = malloc_setting
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS, str(size)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_freed_memory_is_reused_without_page_faults():
    pages_per_round = 2**28 // resource.getpagesize()
    assert _page_faults_reallocating(None) < pages_per_round // 100
    # The opt-out restores glibc's default, which faults every page in each round.
    assert _page_faults_reallocating("default") > pages_per_round


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_freed_blocks_over_2_gib_are_kept_too():
    """The decoder-only benchmark step's temporary buffer is 3.1 GB: a trim threshold that
    stops at mallopt's largest positive value (2 GiB) let glibc hand it back every step."""
    size = 5 * 2**29  # 2.5 GiB
    assert _page_faults_reallocating(None, size) < size // resource.getpagesize() // 100


STEP_ONLY = """
import sys
from t5x_like import trainer, optimizers, partitioning, storage
from t5x_like.families.t5 import model as encoder_decoder
from t5x_like.families.gpt import model as decoder_only
from t5x_like.families.bert import model as bert_models
print(sorted(m for m in ('tensorflow', 'seqio', 'tensorflow_datasets') if m in sys.modules))
storage.exists('.')  # the first file access brings TensorFlow in (gfile serves gs:// too)
print('tensorflow' in sys.modules)
"""


def test_a_process_that_only_runs_steps_does_not_import_tensorflow():
    """TensorFlow (and seqio, which imports it) costs ~0.9 GB of host memory: only the data
    pipeline and file access need it, so the trainer and the models import it lazily."""
    out = subprocess.run(
        [sys.executable, "-c", STEP_ONLY], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[0] == "[]"
    assert out[1] == "True"


# Leave a touched 512 MiB hole inside the heap (a smaller block allocated after it keeps it
# off the heap's top, as the compiler's freed memory is), then report the resident MiB after
# a short compile event, after a long one, and whether a real jit compile reports under the
# event's name at all.
_RELEASE = """
import ctypes, os
import jax, jax.numpy as jnp
import t5x_like
from t5x_like import host_runtime
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def resident_mib():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
hole = libc.malloc(2**29)
ctypes.memset(hole, 1, 2**29)
guard = libc.malloc(2**20)
libc.free(hole)
with_hole = resident_mib()
jax.monitoring.record_event_duration_secs(host_runtime.COMPILE_EVENT, 0.01)
after_short = resident_mib()
jax.monitoring.record_event_duration_secs(host_runtime.COMPILE_EVENT, 2.0)
after_long = resident_mib()
seen = []
jax.monitoring.register_event_duration_secs_listener(lambda event, s, **_: seen.append(event))
jax.jit(lambda x: x * 2)(jnp.ones(3)).block_until_ready()
print(with_hole - after_short, with_hole - after_long, host_runtime.COMPILE_EVENT in seen)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim only")
def test_a_large_compile_hands_back_the_free_heap_pages():
    """The kept heap also kept what XLA's compiler freed, resident: 210 MiB of the standard
    T5 step's 2.1 GB peak. After a compile of a second or more the free pages go back to the
    kernel; after a short one (eager code compiles hundreds) nothing is done."""
    out = subprocess.run(
        [sys.executable, "-c", _RELEASE], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    released_short, released_long, jax_reports_compiles = int(out[0]), int(out[1]), out[2]
    assert released_short < 16
    assert released_long > 448
    assert jax_reports_compiles == "True"
