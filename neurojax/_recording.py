"""How `simulate` stores recorded spikes, shared by the driver and the models' fused runs."""

import jax.numpy as jnp

__all__ = ["count_dtype"]


def count_dtype(record_every: int):
    """The integer dtype of spike counts over windows of `record_every` steps: `uint8` while a
    window cannot hold more than 255 spikes of one neuron, else `int32`."""
    return jnp.uint8 if record_every <= 255 else jnp.int32
