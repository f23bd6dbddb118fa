"""Sharded training on 8 simulated CPU devices equals the 1-device run (tests/conftest.py sets
XLA_FLAGS=--xla_force_host_platform_device_count=8)."""

import dataclasses

import jax
import numpy as np
import pytest

from t5x_like import optimizers, partitioning, trainer
from t5x_like.checkpoints import train_state
from t5x_like.errors import ConfigError
from t5x_like.families.t5 import network as t5
from t5x_like.families.t5.model import EncoderDecoderModel, shift_right
from t5x_like.models import base

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")

# Dimensions divisible by 8 so that every layout can split heads, mlp and vocab; d_model and
# d_ff of 128 make Adafactor factor the kernels, so its row/column moments are sharded too.
CONFIG = t5.T5Config(
    vocab_size=256,
    emb_dim=128,
    num_heads=8,
    head_dim=4,
    mlp_dim=128,
    num_encoder_layers=1,
    num_decoder_layers=1,
    dropout_rate=0.0,
    logits_via_embedding=False,
    mlp_activations=("gelu", "linear"),
)
# One layout of each kind in the default suite; the other meshes in the slow set (a compile each).
LAYOUTS = [
    ((8, 1), "data_parallel"),
    ((4, 2), "model_parallel"),
    pytest.param((2, 4), "model_parallel", marks=pytest.mark.slow),
    pytest.param((1, 8), "model_parallel", marks=pytest.mark.slow),
    ((8, 1), "fsdp"),
    pytest.param((4, 2), "fsdp", marks=pytest.mark.slow),
]


# The steps compared here are compiled as a user's are, with LLVM at XLA's default level
# (tests/conftest.py lowers it for the rest of the suite): a sharded and a single-device
# Adafactor step agree to rounding, and how rounding falls depends on the emitted code (at -O0
# one parameter of 32,768 differed by 1.1e-6, just past atol 1e-6).
PRODUCTION_CODEGEN = {"xla_backend_optimization_level": 3}


def _batch(seed=0, batch=8):
    rng = np.random.default_rng(seed)
    tgt = rng.integers(2, 256, (batch, 8)).astype(np.int32)
    tgt[1, 5:] = 0  # some padding, so token-count normalisation matters
    return {
        "encoder_input_tokens": rng.integers(2, 256, (batch, 16)).astype(np.int32),
        "decoder_target_tokens": tgt,
        "decoder_input_tokens": np.asarray(shift_right(tgt)),
        "decoder_loss_weights": (tgt > 0).astype(np.float32),
    }


def _one_step(
    mesh_shape,
    layout_name,
    num_microbatches=1,
    devices=None,
    axis_names=partitioning.DEFAULT_AXIS_NAMES,
):
    model = EncoderDecoderModel(CONFIG)
    lr = optimizers.inverse_sqrt_schedule(10)
    optimizer = optimizers.t5_adafactor(lr)
    mesh = partitioning.make_mesh(mesh_shape=mesh_shape, devices=devices, axis_names=axis_names)
    layout = trainer.make_layout(
        model, optimizer, mesh, partitioning.logical_axis_rules(layout_name)
    )
    state = trainer.init_state(model, optimizer, jax.random.key(0), layout)
    step = trainer.make_train_step(model, optimizer, lr, layout, num_microbatches)
    batch, rng = layout.global_batch(_batch()), jax.random.key(1)
    with layout.context():
        compiled = step.lower(state, batch, rng).compile(compiler_options=PRODUCTION_CODEGEN)
        state, metrics = compiled(state, batch, rng)
    return state, metrics, layout


@pytest.fixture(scope="module")
def reference():
    state, metrics, _ = _one_step((1, 1), "data_parallel", devices=jax.devices()[:1])
    return jax.device_get(state), jax.device_get(metrics)


def _assert_same(state, ref_state):
    for got, want in zip(
        jax.tree_util.tree_leaves(jax.device_get(state.params)),
        jax.tree_util.tree_leaves(ref_state.params),
    ):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS)
def test_one_step_equals_single_device(reference, mesh_shape, layout):
    ref_state, ref_metrics = reference
    state, metrics, _ = _one_step(mesh_shape, layout)
    np.testing.assert_allclose(metrics["loss"], ref_metrics["loss"], rtol=1e-5)
    _assert_same(state, ref_state)
    params = state.params
    wi = params["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]  # (embed, mlp)
    query = params["decoder"]["layers_0"]["self_attention"]["query"]["kernel"]  # embed,heads,kv
    logits = params["decoder"]["logits_dense"]["kernel"]  # (embed, vocab)
    model_split = layout != "data_parallel"  # 'model' appears in the spec (even if size 1)
    fsdp_split = layout == "fsdp"
    assert tuple(wi.sharding.spec) == (
        ("data" if fsdp_split else None),
        ("model" if model_split else None),
    )
    assert tuple(query.sharding.spec)[:2] == (
        ("data" if fsdp_split else None),
        ("model" if model_split else None),
    )
    assert tuple(logits.sharding.spec)[1] == ("model" if model_split else None)
    # Each device really holds only its shard.
    ways = (mesh_shape[1] if model_split else 1) * (mesh_shape[0] if fsdp_split else 1)
    assert wi.addressable_shards[0].data.size == wi.size // ways
    # Adafactor's factored moments follow the parameter they belong to: the row statistics of
    # the (embed, mlp) kernel keep the embed axis' sharding, the column ones the mlp axis'.
    moments = state.opt_state.inner[0]
    v_row = moments.v_row["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
    v_col = moments.v_col["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
    assert {tuple(v_row.sharding.spec), tuple(v_col.sharding.spec)} == {
        (("data" if fsdp_split else None),),
        (("model" if model_split else None),),
    }


def test_three_axis_hybrid_fsdp_equals_single_device(reference):
    """('data', 'fsdp', 'model') = 2x2x2: parameters split within an fsdp group and on model,
    replicated across data; the batch split over data x fsdp."""
    ref_state, ref_metrics = reference
    state, metrics, layout = _one_step(
        (2, 2, 2), "hybrid_fsdp", axis_names=("data", "fsdp", "model")
    )
    np.testing.assert_allclose(metrics["loss"], ref_metrics["loss"], rtol=1e-5)
    _assert_same(state, ref_state)
    wi = state.params["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
    assert tuple(wi.sharding.spec) == ("fsdp", "model")
    assert wi.addressable_shards[0].data.size == wi.size // 4
    assert tuple(layout.batch_sharding.spec) == (("data", "fsdp"),)


@pytest.mark.slow  # (default suite under 15 min: the three-axis step and accumulation stay there)
def test_gradient_accumulation_on_three_axis_mesh(reference):
    ref_state, ref_metrics = reference
    state, metrics, _ = _one_step(
        (2, 2, 2), "hybrid_fsdp", num_microbatches=2, axis_names=("data", "fsdp", "model")
    )
    np.testing.assert_allclose(metrics["loss"], ref_metrics["loss"], rtol=1e-5)
    _assert_same(state, ref_state)


@pytest.mark.parametrize(
    "mesh_shape,layout,num_microbatches",
    [
        ((1, 1), "data_parallel", 4),
        pytest.param((4, 2), "model_parallel", 2, marks=pytest.mark.slow),
        pytest.param((2, 4), "fsdp", 4, marks=pytest.mark.slow),
    ],
)
def test_gradient_accumulation_equals_full_batch(reference, mesh_shape, layout, num_microbatches):
    ref_state, ref_metrics = reference
    devices = jax.devices()[:1] if mesh_shape == (1, 1) else None
    state, metrics, _ = _one_step(
        mesh_shape, layout, num_microbatches=num_microbatches, devices=devices
    )
    np.testing.assert_allclose(metrics["loss"], ref_metrics["loss"], rtol=1e-5)
    _assert_same(state, ref_state)


def test_micro_batches_that_do_not_split_over_the_data_devices_are_refused():
    """8 rows in 4 micro-batches of 2 over 4 data shards: XLA would pad the shards (and its
    partitioner then produced wrong gradients); the step refuses before compiling."""
    with pytest.raises(ConfigError, match="divisible by the data-parallel size"):
        _one_step((4, 2), "model_parallel", num_microbatches=4)


@pytest.mark.slow  # three sharded steps and two checkpoints (default suite under 15 minutes)
def test_checkpoint_restores_across_meshes(tmp_path, reference):
    """2x4 -> 4x2 (FSDP) -> 1 device -> back to 2x4, values identical at every hop."""
    state, _, _ = _one_step((2, 4), "model_parallel")
    expected = jax.device_get(state)
    model = EncoderDecoderModel(CONFIG)
    optimizer = optimizers.t5_adafactor(optimizers.inverse_sqrt_schedule(10))
    source = tmp_path / "hop0"
    saver = train_state.Checkpointer(str(source), keep=2)
    saver.save(state, CONFIG)
    saver.close()
    hops = [
        ((4, 2), "fsdp", None),
        ((1, 1), "data_parallel", jax.devices()[:1]),
        ((2, 4), "model_parallel", None),
    ]
    for i, (mesh_shape, layout_name, devices) in enumerate(hops, start=1):
        mesh = partitioning.make_mesh(mesh_shape=mesh_shape, devices=devices)
        target = trainer.make_layout(
            model, optimizer, mesh, partitioning.logical_axis_rules(layout_name)
        )
        restored = train_state.Checkpointer(str(source), keep=2).restore(
            trainer.abstract_state(model, optimizer, target)
        )
        assert int(restored.step) == 1
        for got, want, sharding in zip(
            jax.tree_util.tree_leaves(restored),
            jax.tree_util.tree_leaves(expected),
            jax.tree_util.tree_leaves(target.state_shardings),
        ):
            np.testing.assert_array_equal(jax.device_get(got), want)
            if got.ndim:
                assert got.sharding.is_equivalent_to(sharding, got.ndim)
        source = tmp_path / f"hop{i}"  # save from this mesh for the next hop
        saver = train_state.Checkpointer(str(source), keep=2)
        saver.save(restored, CONFIG)
        saver.close()


def test_mesh_that_does_not_divide_devices():
    with pytest.raises(ConfigError, match="num_partitions=3 does not divide the 8 devices"):
        partitioning.make_mesh(num_partitions=3)
    with pytest.raises(ConfigError, match=r"mesh_shape=\(3, 2\) does not match the 8 devices"):
        partitioning.make_mesh(mesh_shape=(3, 2))


def test_rule_naming_a_missing_mesh_axis():
    model = EncoderDecoderModel(CONFIG)
    with pytest.raises(
        ConfigError,
        match=r"names mesh axis 'fsdp', but the mesh has axes "
        r"\('data', 'model'\)",
    ):
        partitioning.param_shardings(
            model.abstract_params(), partitioning.make_mesh(), partitioning.LAYOUTS["hybrid_fsdp"]
        )
    with pytest.raises(ConfigError, match="needs an explicit make_mesh.mesh_shape"):
        partitioning.make_mesh(axis_names=("data", "fsdp", "model"))
    with pytest.raises(ConfigError, match="mesh_shape=\\(2, 4\\) does not match"):
        partitioning.make_mesh(mesh_shape=(2, 4), axis_names=("data", "fsdp", "model"))


class _FakeTpu:
    """Just what the submesh layout reads of a TPU device: chip coordinates and core."""

    def __init__(self, idx, coords, core):
        self.id, self.coords, self.core_on_chip = idx, coords, core

    def __repr__(self):
        return f"tpu{self.coords}{self.core_on_chip}"


def test_model_parallel_submesh_groups_neighbouring_chips():
    """A v3-32-like slice: 4x4x1 chips x 2 cores = 32 devices, listed in a scrambled order.
    Submesh (2, 2, 1, 2) = 8 devices per replica -> 4 replicas, each a 2x2 block of chips."""
    rng = np.random.default_rng(0)
    devices = [
        _FakeTpu(i, (x, y, 0), c)
        for i, (x, y, c) in enumerate(
            (x, y, c) for x in range(4) for y in range(4) for c in range(2)
        )
    ]
    devices = [devices[i] for i in rng.permutation(len(devices))]
    grid = partitioning.submesh_device_grid(devices, (2, 2, 1, 2))
    assert grid.shape == (4, 8)
    blocks = set()
    for replica in grid:
        xs = {d.coords[0] for d in replica}
        ys = {d.coords[1] for d in replica}
        # Two neighbouring x and two neighbouring y, both cores of each chip.
        assert len(xs) == 2 and max(xs) - min(xs) == 1 and min(xs) % 2 == 0
        assert len(ys) == 2 and max(ys) - min(ys) == 1 and min(ys) % 2 == 0
        assert sorted((d.coords, d.core_on_chip) for d in replica) == sorted(
            ((x, y, 0), c) for x in xs for y in ys for c in range(2)
        )
        blocks.add((min(xs), min(ys)))
    assert blocks == {(0, 0), (0, 2), (2, 0), (2, 2)}
    with pytest.raises(
        ConfigError,
        match=r"does not tile the slice's physical mesh "
        r"\(4, 4, 1, 2\)",
    ):
        partitioning.submesh_device_grid(devices, (8, 1, 1, 1))
    with pytest.raises(ConfigError, match="must be four positive sizes"):
        partitioning.submesh_device_grid(devices, (2, 2))


def test_model_parallel_submesh_on_cpu_sets_partitions():
    mesh = partitioning.make_mesh(model_parallel_submesh=(1, 1, 1, 2))
    assert dict(mesh.shape) == {"data": 4, "model": 2}
    with pytest.raises(ConfigError, match="does not divide the 8 devices"):
        partitioning.make_mesh(model_parallel_submesh=(3, 1, 1, 1))


def test_logical_axis_without_rule():
    model = EncoderDecoderModel(CONFIG)
    rules = tuple(r for r in partitioning.LAYOUTS["model_parallel"] if r[0] != "mlp")
    with pytest.raises(
        ConfigError,
        match=r"Logical axis 'mlp' of parameter .* has no "
        r"partitioning rule",
    ):
        partitioning.param_shardings(model.abstract_params(), partitioning.make_mesh(), rules)


def test_indivisible_parameter_is_named():
    model = EncoderDecoderModel(dataclasses.replace(CONFIG, num_heads=4))
    with pytest.raises(ConfigError, match=r"cannot be split 8 ways over mesh axis 'model'"):
        partitioning.param_shardings(
            model.abstract_params(),
            partitioning.make_mesh(mesh_shape=(1, 8)),
            partitioning.LAYOUTS["model_parallel"],
        )


def test_parameter_table_reports_per_device_bytes():
    model = EncoderDecoderModel(CONFIG)
    mesh = partitioning.make_mesh(mesh_shape=(2, 4))
    boxed = model.abstract_params()
    shardings = partitioning.param_shardings(boxed, mesh, partitioning.LAYOUTS["fsdp"])
    table, total = partitioning.parameter_table(boxed, shardings)
    assert "encoder/layers_0/mlp/wi_0/kernel" in table and "('embed', 'mlp')" in table
    # wi_0 (128 x 128 float32) split 2 x 4 ways: 65,536 / 8 = 8,192 bytes per device.
    line = next(l for l in table.splitlines() if "encoder/layers_0/mlp/wi_0/kernel" in l)
    assert line.split()[-1] == "8,192"
    assert total < base.count_params(boxed) * 4
