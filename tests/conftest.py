"""Test-wide settings: no network, quiet TensorFlow, offline HuggingFace."""

from __future__ import annotations

import os
import socket

import pytest

from tests import network

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Eight simulated CPU devices, set before jax is imported: sharding tests need a mesh, and every
# other test runs on the same layouts a real multi-device host uses.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config):
    """LLVM at -O0 for the CPU code XLA emits, in the default suite (`-m 'not slow'`): ~63 %
    of its time was XLA compiling small programs once each (1,018 of ~1,620 core-seconds), and
    -O0 compiles them ~35 % faster while XLA's own HLO passes (fusion, layout, sharding) still
    run. Tests check values, never speed. The slow set, benchmarks and users run XLA's default
    level; set the flag in XLA_FLAGS yourself to choose. (Set before any backend starts: XLA
    reads its flags then, not at import.)"""
    if (
        config.getoption("markexpr") == "not slow"
        and "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]
    ):
        os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"


@pytest.fixture(autouse=True, scope="session")
def _register_tasks():
    """The tests name this repository's tasks, as a run does once `gin_setup` has imported
    `t5x_like.tasks`; the library itself registers none (tests/test_import_structure.py)."""
    from t5x_like import tasks  # noqa: F401


@pytest.fixture(autouse=True, scope="session")
def _block_network():
    socket.socket.connect = network.guarded_connect
    yield
    socket.socket.connect = network.REAL_CONNECT


@pytest.fixture(autouse=True)
def _clean_gin():
    """Gin bindings are process-global: never let one test's config leak into another."""
    import gin

    gin.clear_config()
    yield
    gin.clear_config()


@pytest.fixture(autouse=True)
def _no_offered_tokenizer():
    """The tokenizer a run offers its tasks (`tokenizer_files.offer_to_tasks`) is
    process-global too: one test's checkpoint must not give the next test's tasks its vocab."""
    from t5x_like.checkpoints import tokenizer_files

    yield
    tokenizer_files.offer_to_tasks(None)


@pytest.fixture(scope="session", autouse=True)
def offline_cache(tmp_path_factory):
    """A per-session cache for the offline corpus and its vocabularies (built on first use),
    so tests neither depend on nor write to the user's ~/.cache. pytest-xdist workers share
    one (the builds take a lock), so each is built once per run, not once per worker."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's directory, above each worker's own
    path = base / "t5x_like_cache"
    path.mkdir(exist_ok=True)
    os.environ["T5X_LIKE_CACHE"] = str(path)
    return path


def _tfds_loaders() -> set:
    """Every registered seqio task's TFDS loader (tasks may share one). Only TFDS sources
    are asked: some tasks' sources resolve their gin bindings on first attribute access."""
    import sys

    import seqio

    sources = [seqio.TaskRegistry.get(name).source for name in seqio.TaskRegistry.names()]
    c4 = sys.modules.get("t5x_like.tasks.c4")  # C4's TFDS source stands behind a lazy source
    if c4 is not None:
        sources.append(c4.C4_TFDS_SOURCE)
    return {source.tfds_dataset for source in sources if isinstance(source, seqio.TfdsDataSource)}


@pytest.fixture(autouse=True, scope="module")
def _restore_tfds_data_dirs():
    """Tests point seqio's TFDS loaders at tiny datasets they build (`override_data_dir`, or
    seqio's global override, which a loader copies into itself the first time it reads it).
    Both are process-global and outlive the module, so a later module's task would read
    another module's data, or its own test would pass or fail by the order modules ran in:
    put every loader back as the module found it. (Only when seqio is loaded: importing it
    costs seconds.)"""
    import sys

    seqio = sys.modules.get("seqio")
    before = {loader: loader._data_dir_override for loader in _tfds_loaders()} if seqio else {}
    global_before = seqio.utils._TFDS_DATA_DIR_OVERRIDE if seqio else None
    yield
    seqio = sys.modules.get("seqio")
    if seqio is None:
        return
    seqio.utils.set_tfds_data_dir_override(global_before)
    for loader in _tfds_loaders():
        loader._data_dir_override = before.get(loader)
