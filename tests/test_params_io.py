"""Parameter checkpoints through orbax: what a save costs on one host, and that it reads back."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from t5x_like.checkpoints import params_io
from t5x_like.families.t5.network import T5Config


def test_saving_replicated_arrays_on_one_host_compiles_nothing(tmp_path, caplog):
    """orbax's replica-parallel saving cuts every replicated array into one slice per replica,
    each an XLA program compiled on first use (240 programs, 18 s, for 30 arrays on 8
    devices). On one host the same process writes all the slices anyway: the save must run
    without compiling anything, and read back exactly."""
    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    rng = np.random.default_rng(0)
    params = {
        f"w{i}": jax.device_put(
            jnp.asarray(rng.normal(size=(8 * (i + 1), 16)), jnp.float32), replicated
        )
        for i in range(4)
    }
    with jax.log_compiles(True), caplog.at_level(logging.WARNING):
        path = params_io.save_params(str(tmp_path / "ckpt"), params, T5Config())
    compiled = [r.getMessage() for r in caplog.records if "XLA compilation" in r.getMessage()]
    assert not compiled, compiled
    abstract = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), params
    )
    restored = params_io.restore_params(str(tmp_path / "ckpt"), abstract)
    assert path.endswith("/0")
    for name, value in params.items():
        np.testing.assert_array_equal(np.asarray(restored[name]), np.asarray(value))
