"""Convert parameters between the per-layer layout and the scanned one.

An unscanned stack keeps each layer under its own name (`layers_0`, `layers_1`, ...); a stack
run as one `nn.scan` (`scan_layers=True`) keeps them all under `layers`, every leaf carrying a
leading layer axis. The conversion is pure renaming and stacking, so a checkpoint written in one
layout serves a model in the other (a pretrained checkpoint restored into a scanned fine-tuning
run; a scanned run exported to HuggingFace, whose converters speak the per-layer layout).

The functions take concrete arrays or abstract `jax.ShapeDtypeStruct`s (restore targets, whose
shardings gain or lose the replicated layer axis).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import jax
import numpy as np

from t5x_like.models.layers import SCANNED_STACK

Params = Any
_LAYER_NAME = re.compile(r"^layers_(\d+)$")


def is_scanned(params: Mapping) -> bool:
    """Whether any stack in `params` is in the scanned layout."""
    return any(
        k == SCANNED_STACK or (isinstance(v, Mapping) and is_scanned(v)) for k, v in params.items()
    )


def to_layout(params: Params, scanned: bool) -> Params:
    """`params` in the scanned layout if `scanned`, else per layer (unchanged if already)."""
    return stack_layers(params) if scanned else unstack_layers(params)


def stack_layers(params: Params) -> Params:
    """Every `layers_0..layers_{N-1}` group becomes one `layers` entry whose leaves are the
    per-layer leaves stacked on a new leading axis."""
    if not isinstance(params, Mapping):
        return params
    numbered = sorted((int(m.group(1)), k) for k in params if (m := _LAYER_NAME.match(k)))
    out = {k: stack_layers(v) for k, v in params.items() if not _LAYER_NAME.match(k)}
    if numbered:
        if [i for i, _ in numbered] != list(range(len(numbered))):
            raise ValueError(f"Layers {[k for _, k in numbered]} are not numbered 0..N-1.")
        out[SCANNED_STACK] = jax.tree_util.tree_map(
            lambda *leaves: _stack(leaves), *[params[k] for _, k in numbered]
        )
    return out


def unstack_layers(params: Params) -> Params:
    """Every `layers` entry (leaves with a leading layer axis) becomes `layers_0..N-1`."""
    if not isinstance(params, Mapping):
        return params
    out = {k: unstack_layers(v) for k, v in params.items() if k != SCANNED_STACK}
    if SCANNED_STACK in params:
        stacked = params[SCANNED_STACK]
        depth = {leaf.shape[0] for leaf in jax.tree_util.tree_leaves(stacked)}
        if len(depth) != 1:
            raise ValueError(f"A scanned stack's leaves disagree on the layer count: {depth}.")
        for i in range(depth.pop()):
            out[f"layers_{i}"] = jax.tree_util.tree_map(lambda leaf: _index(leaf, i), stacked)
    return out


def _stack(leaves: tuple) -> Any:
    first = leaves[0]
    if isinstance(first, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(
            (len(leaves), *first.shape),
            first.dtype,
            sharding=_layer_axis_sharding(first.sharding, add=True),
        )
    if isinstance(first, jax.Array):
        return jax.numpy.stack(leaves)
    return np.stack(leaves)


def _index(leaf: Any, i: int) -> Any:
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(
            leaf.shape[1:], leaf.dtype, sharding=_layer_axis_sharding(leaf.sharding, add=False)
        )
    return leaf[i]


def _layer_axis_sharding(sharding: Any, add: bool) -> Any:
    """The sharding with a replicated leading layer axis added or removed."""
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return sharding  # None or a single-device sharding: rank does not matter
    spec = tuple(sharding.spec)
    if add:
        spec = (None, *spec)
    else:
        if spec and spec[0] is not None:
            raise ValueError(
                f"The layer axis of a scanned stack is sharded ({sharding.spec}); "
                "it must be replicated."
            )
        spec = spec[1:]
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*spec))
