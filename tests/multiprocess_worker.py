"""One process of a multi-process training run on localhost (used by test_multiprocess.py).

    python tests/multiprocess_worker.py PROCESS_ID NUM_PROCESSES PORT DEVICES_PER_PROCESS OUT

Each process owns DEVICES_PER_PROCESS simulated CPU devices, joins the others through
`jax.distributed` (gloo collectives on CPU), feeds only its own rows of a fixed global batch
and trains a few steps; process 0 writes the losses to OUT as JSON.
"""

import json
import os
import sys

process_id, num_processes, port, local_devices, out = sys.argv[1:6]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={local_devices}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402

from t5x_like import distributed, optimizers, partitioning, trainer  # noqa: E402
from t5x_like.families.t5 import network as t5  # noqa: E402
from t5x_like.families.t5.model import EncoderDecoderModel, shift_right  # noqa: E402

if int(num_processes) > 1:
    distributed.initialize(
        coordinator_address=f"localhost:{port}",
        num_processes=int(num_processes),
        process_id=int(process_id),
    )

cfg = t5.T5Config(
    vocab_size=128,
    emb_dim=32,
    num_heads=4,
    head_dim=8,
    mlp_dim=64,
    num_encoder_layers=1,
    num_decoder_layers=1,
    dropout_rate=0.0,
)
model = EncoderDecoderModel(cfg)
lr = optimizers.inverse_sqrt_schedule(10)
optimizer = optimizers.t5_adafactor(lr)
mesh = partitioning.make_mesh(num_partitions=1)
layout = trainer.make_layout(model, optimizer, mesh, partitioning.logical_axis_rules())
state = trainer.init_state(model, optimizer, jax.random.key(0), layout)
step = trainer.make_train_step(model, optimizer, lr, layout)

rng = np.random.default_rng(0)
losses = []
for _ in range(3):
    targets = rng.integers(2, 128, (8, 6)).astype(np.int32)
    global_batch = {
        "encoder_input_tokens": rng.integers(2, 128, (8, 10)).astype(np.int32),
        "decoder_target_tokens": targets,
        "decoder_input_tokens": np.asarray(shift_right(targets)),
    }
    # This process's rows: those its devices hold under the batch sharding.
    rows = sorted(
        {
            idx[0].start or 0
            for idx in layout.batch_sharding.addressable_devices_indices_map((8, 10)).values()
        }
    )
    per_device = 8 // mesh.shape["data"]
    local = {
        k: np.concatenate([v[r : r + per_device] for r in rows]) for k, v in global_batch.items()
    }
    with layout.context():
        state, metrics = step(state, partitioning.global_batch(local, mesh), jax.random.key(1))
    losses.append(float(metrics["loss"]))

if jax.process_index() == 0:
    with open(out, "w") as f:
        json.dump(
            {"losses": losses, "devices": jax.device_count(), "processes": jax.process_count()}, f
        )
