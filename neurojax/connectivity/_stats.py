"""Summary statistics of a connectivity matrix."""

from typing import Any

import numpy as np
from jax.experimental import sparse

__all__ = ["stats"]


def stats(conn: sparse.BCOO) -> dict[str, Any]:
    """Size, density, degree and memory statistics of a BCOO connectivity `(n_pre, n_post)`.

    Returns a dict of Python numbers and strings:

    - `n_pre`, `n_post`: population sizes; `n_synapses`: stored synapses (multapses count
      once each; padding entries whose indices lie outside the matrix are not synapses);
    - `sparsity`: `n_synapses / (n_pre * n_post)`, the fraction of possible pairs connected;
    - `mean_fan_in`, `min_fan_in`, `max_fan_in`: synapses received per post neuron;
    - `mean_fan_out`, `min_fan_out`, `max_fan_out`: synapses made per pre neuron;
    - `bytes`: memory of the stored arrays (indices + data); `bytes_per_synapse`;
    - `index_dtype`, `weight_dtype`: dtype names of `indices` and `data`.

    Example:
    ```python
    nj.connect.stats(nj.connect.from_dense([[0.0, 1.0], [1.0, 1.0]]))["max_fan_in"]   # 2
    ```
    """
    owner = "stats"
    if not isinstance(conn, sparse.BCOO):
        raise TypeError(
            f"{owner}: conn must be a jax.experimental.sparse.BCOO, got {type(conn).__name__}"
        )
    if conn.ndim != 2 or conn.n_batch != 0 or conn.n_dense != 0:
        raise ValueError(
            f"{owner}: conn must be a 2-D BCOO without batch or dense dimensions, got shape"
            f" {conn.shape} with n_batch={conn.n_batch} and n_dense={conn.n_dense}"
        )
    n_pre, n_post = (int(s) for s in conn.shape)
    idx = np.asarray(conn.indices)
    inside = (idx[:, 0] >= 0) & (idx[:, 0] < n_pre) & (idx[:, 1] >= 0) & (idx[:, 1] < n_post)
    idx = idx[inside]
    nnz = int(idx.shape[0])
    fan_out = np.bincount(idx[:, 0], minlength=n_pre)
    fan_in = np.bincount(idx[:, 1], minlength=n_post)
    stored = int(conn.indices.nbytes + conn.data.nbytes)
    return {
        "n_pre": n_pre,
        "n_post": n_post,
        "n_synapses": nnz,
        "sparsity": nnz / (n_pre * n_post),
        "mean_fan_in": nnz / n_post,
        "min_fan_in": int(fan_in.min()),
        "max_fan_in": int(fan_in.max()),
        "mean_fan_out": nnz / n_pre,
        "min_fan_out": int(fan_out.min()),
        "max_fan_out": int(fan_out.max()),
        "bytes": stored,
        "bytes_per_synapse": stored / nnz if nnz else float("nan"),
        "index_dtype": str(conn.indices.dtype),
        "weight_dtype": str(conn.data.dtype),
    }
