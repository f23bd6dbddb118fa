"""T5's Adafactor: attention kernels are factored as the [d_model, heads * d_kv] matrices of
Mesh-TF T5, i.e. exactly what optax's Adafactor does on those matrices."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from t5x_like import optimizers


def _plain(lr):
    return optax.adafactor(learning_rate=lr, min_dim_size_to_factor=128, decay_rate=0.8,
                           decay_offset=0, multiply_by_parameter_scale=True,
                           clipping_threshold=1.0, momentum=None, eps=1e-30, factored=True)


def test_matrix_view_is_the_mesh_tf_matrix():
    assert optimizers.matrix_view((768, 12, 64)) == (768, 768)   # query/key/value
    assert optimizers.matrix_view((12, 64, 768)) == (768, 768)   # output projection
    assert optimizers.matrix_view((1024, 128, 128)) == (1024, 16384)
    assert optimizers.matrix_view((512, 2048)) is None


def test_attention_kernel_updates_equal_adafactor_on_the_matrix():
    rng = np.random.default_rng(0)
    params = {"q": jnp.asarray(rng.normal(size=(256, 4, 64)), jnp.float32),
              "wi": jnp.asarray(rng.normal(size=(256, 512)), jnp.float32),
              "scale": jnp.ones((256,), jnp.float32)}
    grads = jax.tree_util.tree_map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype),
                                   params)
    ours = optimizers.t5_adafactor(0.01)
    state = ours.init(params)
    # The 3-D kernel's second moment is factored (row and column vectors), not full.
    factored = state.inner[0]
    assert factored.v_row["q"].shape == (256,) and factored.v_col["q"].shape == (256,)
    updates, _ = ours.update(grads, state, params)

    reference = _plain(0.01)
    as_matrix = dict(params, q=params["q"].reshape(256, 256))
    ref_grads = dict(grads, q=grads["q"].reshape(256, 256))
    ref_updates, _ = reference.update(ref_grads, reference.init(as_matrix), as_matrix)
    np.testing.assert_allclose(updates["q"], ref_updates["q"].reshape(256, 4, 64), rtol=1e-6)
    np.testing.assert_allclose(updates["wi"], ref_updates["wi"], rtol=1e-6)
    np.testing.assert_allclose(updates["scale"], ref_updates["scale"], rtol=1e-6)
