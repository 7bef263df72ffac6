r"""The Brette et al. (2007) benchmark networks COBA and CUBA (Vogels and Abbott 2005).

Both are 4000 leaky integrate-and-fire neurons, 3200 excitatory (`"E"`) and 800 inhibitory
(`"I"`), every ordered pair connected with probability 0.02, dt = 0.1 ms (Brette et al. 2007,
J Comput Neurosci 23:349, benchmarks 1 and 2). The formulations are those of the published
simulator comparisons (Brian's COBA and CUBA examples), so that benchmarks compare like with
like:

- **COBA**: `tau_m dv/dt = ge (E_exc - v) + gi (E_inh - v) - (v - E_L) + I` with `ge`, `gi` in
  units of the leak conductance, exponential synapses (5 ms, 10 ms) that jump by 0.6 and 6.7
  per spike, `I = 20 mV`, forward Euler, `E_L = V_reset = -60 mV`, `V_th = -50 mV`, 5 ms
  refractory period with `v` clamped, initial `v ~ N(-55, 5) mV`.
- **CUBA**: `tau_m dv/dt = ge + gi - (v - E_L)` with current synapses in mV (jumps of 1.62 mV
  and -9 mV, decays 5 ms and 10 ms), `E_L = -49 mV`, `V_th = -50 mV`, `V_reset = -60 mV`,
  5 ms refractory period, exact integration, initial `v` uniform in `[V_reset, V_th)`.

Each projection's connectivity has its own key derived from `key`, so a seed fixes the
network; the initial voltages come from a separate sub-key.
"""

import functools
from typing import Any

import equinox as eqx
import jax
import jax.random as jr

from .. import connectivity as connect
from .._validation import check_choice, check_key, default_float, normalize_shape
from ..connectivity._threefry import HostKey
from ..network import Network, NetworkState, Projection
from ..neurons import LIF
from ..synapses import ConductanceOutput, CurrentOutput, Exponential

__all__ = ["coba", "cuba", "COBA_PARAMS", "CUBA_PARAMS"]

COBA_PARAMS = dict(
    tau_m=20.0,
    e_l=-60.0,
    v_th=-50.0,
    v_reset=-60.0,
    t_ref=5.0,
    tau_exc=5.0,
    tau_inh=10.0,
    e_exc=0.0,
    e_inh=-80.0,
    w_exc=0.6,
    w_inh=6.7,
    drive=20.0,
    v0_mean=-55.0,
    v0_std=5.0,
)
"""Parameters of `coba` (Brette et al. 2007, benchmark 1). Times in ms, voltages in mV;
`w_exc`, `w_inh` are the jumps of the excitatory and inhibitory conductances per spike in
units of the leak conductance; `drive` is the constant input `I` [mV]; the initial voltages
are drawn from N(`v0_mean`, `v0_std`^2) [mV]."""
CUBA_PARAMS = dict(
    tau_m=20.0,
    e_l=-49.0,
    v_th=-50.0,
    v_reset=-60.0,
    t_ref=5.0,
    tau_exc=5.0,
    tau_inh=10.0,
    w_exc=1.62,
    w_inh=-9.0,
)
"""Parameters of `cuba` (Brette et al. 2007, benchmark 2). Times in ms, voltages in mV;
`w_exc`, `w_inh` are the jumps of the excitatory and inhibitory synaptic currents per spike,
in mV (current synapses with `r_m = 1`)."""
_METHODS = ("auto", "event", "dense", "bcoo")


def _check_common(owner: str, n_exc: Any, n_inh: Any, p: Any, method: str) -> tuple[int, int]:
    sizes = []
    for name, value in (("n_exc", n_exc), ("n_inh", n_inh)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")
        sizes.append(value)
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{owner}: p must be a probability in [0, 1], got {p!r}")
    check_choice(owner, "method", method, _METHODS)
    return sizes[0], sizes[1]


@jax.jit
def _keys_jax(key: jax.Array) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    k_conn, k_v = jr.split(key)
    return k_v, tuple(jr.split(k_conn, 4))


def _keys(key: jax.Array) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """The initial voltages' key and the four projections' keys: split on the host for a
    threefry key (the same keys as `jax.random.split`, with nothing to compile), else in one
    compiled program."""
    hk = HostKey.of(key)
    if hk is None:
        return _keys_jax(key)
    k_conn, k_v = hk.split(2)
    return k_v.jax(), tuple(k.jax() for k in k_conn.split(4))


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _initial_v(key, draw_v, shape, n_exc):
    """Initial voltages of both populations, drawn as one vector and split, in one program."""
    v = draw_v(key, shape)
    return v[..., :n_exc], v[..., n_exc:]


def _coba_v(k, shape):
    c = COBA_PARAMS
    return c["v0_mean"] + c["v0_std"] * jr.normal(k, shape, default_float())


def _cuba_v(k, shape):
    c = CUBA_PARAMS
    return c["v_reset"] + jr.uniform(k, shape, default_float()) * (c["v_th"] - c["v_reset"])


def _build(owner, key, n_exc, n_inh, p, batch, method, c, lif_method, outputs, inputs, draw_v):
    """The 4000-neuron E/I network of both benchmarks and its initial state.

    `c` holds the parameters, `outputs` the (excitatory, inhibitory) synapse outputs,
    `inputs` the constant drive per population and `draw_v(key, shape)` the initial voltages.
    Each of E->E, E->I, I->E and I->I gets independent Bernoulli(p) pairs from its own key.
    """
    key = jr.key(0) if key is None else check_key(owner, key)
    n_exc, n_inh = _check_common(owner, n_exc, n_inh, p, method)
    batch = normalize_shape(owner, batch)
    k_v, k_proj = _keys(key)
    lif = LIF(
        tau_m=c["tau_m"],
        v_rest=c["e_l"],
        v_reset=c["v_reset"],
        v_th=c["v_th"],
        r_m=1.0,
        t_ref=c["t_ref"],
        method=lif_method,
    )
    sizes = {"E": n_exc, "I": n_inh}
    kinetics = {
        "E": (c["w_exc"], Exponential(c["tau_exc"]), outputs[0]),
        "I": (c["w_inh"], Exponential(c["tau_inh"]), outputs[1]),
    }
    projs = []
    pairs = (("E", "E"), ("E", "I"), ("I", "E"), ("I", "I"))
    for kk, (pre, post) in zip(k_proj, pairs, strict=True):
        w, syn, out = kinetics[pre]
        conn = connect.fixed_prob(kk, sizes[pre], sizes[post], p, weight=w)
        projs.append(Projection(pre, post, conn, synapse=syn, output=out, method=method))
    net = Network(
        populations={"E": (lif, n_exc), "I": (lif, n_inh)}, projections=projs, inputs=inputs
    )
    state = eqx.tree_at(
        lambda s: (s.populations["E"].v, s.populations["I"].v),
        net.init_state(batch=batch),
        _initial_v(k_v, draw_v, batch + (n_exc + n_inh,), n_exc),
    )
    return net, state


def coba(
    key: jax.Array | None = None,
    *,
    n_exc: int = 3200,
    n_inh: int = 800,
    p: float = 0.02,
    batch: int | tuple[int, ...] = (),
    method: str = "auto",
) -> tuple[Network, NetworkState]:
    """The COBA network (conductance-based synapses) and a random initial state.

    Args:
        key: PRNG key for connectivity and initial voltages (default `jax.random.key(0)`).
        n_exc: size of the excitatory population `"E"` (default 3200, the benchmark).
        n_inh: size of the inhibitory population `"I"` (default 800, the benchmark).
        p: connection probability of every ordered pair (default 0.02).
        batch: leading batch dimensions of the state: independent initial voltages per trial
            on the same connectivity.
        method: propagation path of the projections (see `nj.Projection`).

    Returns:
        `(network, state)`; `network.step` returns spikes `{"E": ..., "I": ...}`.

    Example:
    ```python
    net, state = nj.models.coba(jax.random.key(0))
    state, rec = nj.simulate(net, state, dt=0.1, n_steps=10000)
    rec.spikes["E"].mean() * 1e4   # mean excitatory rate in Hz (~20)
    ```
    """
    c = COBA_PARAMS

    return _build(
        "coba",
        key,
        n_exc,
        n_inh,
        p,
        batch,
        method,
        c,
        "euler",
        (ConductanceOutput(c["e_exc"]), ConductanceOutput(c["e_inh"])),
        {"E": c["drive"], "I": c["drive"]},
        _coba_v,
    )


def cuba(
    key: jax.Array | None = None,
    *,
    n_exc: int = 3200,
    n_inh: int = 800,
    p: float = 0.02,
    batch: int | tuple[int, ...] = (),
    method: str = "auto",
) -> tuple[Network, NetworkState]:
    """The CUBA network (current-based synapses, voltage jumps) and a random initial state.

    Arguments as for `coba`. Initial voltages are uniform in `[V_reset, V_th)`.
    """
    c = CUBA_PARAMS

    return _build(
        "cuba",
        key,
        n_exc,
        n_inh,
        p,
        batch,
        method,
        c,
        "exact",
        (CurrentOutput(), CurrentOutput()),
        None,
        _cuba_v,
    )
