r"""A 2-D lattice of Izhikevich neurons with local chemical synapses and gap junctions.

The cell classes and their heterogeneity follow Izhikevich (2003, IEEE Trans Neural Netw
14:1569): excitatory neurons are regular spiking with `c = -65 + 15 r^2`, `d = 8 - 6 r^2`,
inhibitory neurons fast spiking with `a = 0.02 + 0.08 r`, `b = 0.25 - 0.05 r` (`r` uniform in
[0, 1) per neuron). Instead of all-to-all coupling the neurons sit on a `side x side` lattice
(each site excitatory with probability `frac_exc`):

- chemical synapses connect pairs within `radius` lattice units with probability `p`
  (periodic boundaries), delta synapses acting during one step: weights `w_exc * U(0, 1)`
  from excitatory and `w_inh * U(0, 1)` (negative) from inhibitory neurons, in the model's
  current unit times ms, as in Izhikevich's network where a spike adds `S_ij` to the input;
- gap junctions couple inhibitory neurons closer than `gap_radius` with conductance `gap_g`
  (current `gap_g (v_j - v_i)`), the electrical coupling known between cortical fast-spiking
  interneurons (Galarreta and Hestrin 1999);
- each neuron receives its own Poisson "thalamic" spike train (`input_rate` Hz) through a
  delta synapse of weight `input_w_exc` or `input_w_inh`.
"""

import jax
import jax.numpy as jnp
import jax.random as jr

from .. import connectivity as connect
from .._validation import check_choice, normalize_shape
from ..network import Network, NetworkState, PoissonSource, Projection
from ..neurons import Izhikevich
from ..synapses import CurrentOutput, Delta, GapJunction

__all__ = ["izhikevich_lattice"]


def _check_positive(name: str, value, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"izhikevich_lattice: {name} must be a real number, got {value!r}")
    if not (value >= 0 if allow_zero else value > 0):
        rule = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"izhikevich_lattice: {name} must be {rule}, got {value!r}")
    return float(value)


def izhikevich_lattice(
    key: jax.Array | None = None,
    *,
    side: int = 40,
    frac_exc: float = 0.8,
    radius: float = 3.0,
    p: float = 0.5,
    w_exc: float = 3.0,
    w_inh: float = -6.0,
    gap_radius: float = 3.0,
    gap_g: float = 0.1,
    input_rate: float = 20.0,
    input_w_exc: float = 20.0,
    input_w_inh: float = 16.0,
    batch: int | tuple[int, ...] = (),
    method: str = "auto",
) -> tuple[Network, NetworkState]:
    """Build the lattice network and its initial state.

    The initial state draws each neuron's `v` uniformly in `[c, v_peak)`, independently per
    trial, with `u = b v` (see `nj.Izhikevich.init_state`): neurons start at random phases,
    and those drawn above the unstable fixed point fire in the first few milliseconds, a
    volley that the recurrent inhibition then breaks up. For the uniform start of
    Izhikevich (2003), `v = -65`, `u = b v`, build the state yourself, for instance
    `eqx.tree_at` on `state.populations[name].v` and `.u`.

    Args:
        key: PRNG key for cell types, parameters, synapses and input (default key 0).
        side: lattice side; `side**2` neurons.
        frac_exc: probability that a site is excitatory, in (0, 1).
        radius: chemical synapses connect sites within `radius` (lattice units).
        p: probability of each chemical synapse within `radius`.
        w_exc: maximal excitatory weight (> 0).
        w_inh: maximal inhibitory weight (< 0).
        gap_radius: gap junctions couple inhibitory neurons within `gap_radius`.
        gap_g: conductance of the gap junctions (>= 0; 0 disables them).
        input_rate: rate of each neuron's Poisson input [Hz].
        input_w_exc: weight of the Poisson input onto E neurons.
        input_w_inh: weight of the Poisson input onto I neurons.
        batch: leading batch dimensions of the state (trials with independent inputs).
        method: propagation path of the chemical projections (see `nj.Projection`).

    Returns:
        `(network, state)`; populations `"E"`, `"I"` and the sources `"input_E"`,
        `"input_I"`. Simulate with `dt = 0.5` ms (the half-step of Izhikevich's code) or less.
    """
    if isinstance(side, bool) or not isinstance(side, int) or side < 2:
        raise ValueError(f"izhikevich_lattice: side must be an int >= 2, got {side!r}")
    if not isinstance(frac_exc, (int, float)) or not 0.0 < frac_exc < 1.0:
        raise ValueError(f"izhikevich_lattice: frac_exc must be in (0, 1), got {frac_exc!r}")
    if not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"izhikevich_lattice: p must be a probability in [0, 1], got {p!r}")
    radius = _check_positive("radius", radius)
    gap_radius = _check_positive("gap_radius", gap_radius)
    gap_g = _check_positive("gap_g", gap_g, allow_zero=True)
    w_exc = _check_positive("w_exc", w_exc)
    if isinstance(w_inh, bool) or not isinstance(w_inh, (int, float)) or w_inh >= 0:
        raise ValueError(f"izhikevich_lattice: w_inh must be a negative number, got {w_inh!r}")
    input_rate = _check_positive("input_rate", input_rate, allow_zero=True)
    input_w_exc = _check_positive("input_w_exc", input_w_exc, allow_zero=True)
    input_w_inh = _check_positive("input_w_inh", input_w_inh, allow_zero=True)
    check_choice("izhikevich_lattice", "method", method, ("auto", "event", "dense", "bcoo"))
    batch = normalize_shape("izhikevich_lattice", batch)
    key = jr.key(0) if key is None else key
    k_type, k_re, k_ri, k_syn, k_w, k_state = jr.split(key, 6)

    n = side * side
    pos = connect.grid_positions((side, side))
    is_exc = jax.device_get(jr.uniform(k_type, (n,)) < frac_exc)
    if is_exc.all() or not is_exc.any():
        raise ValueError("izhikevich_lattice: the draw gave only one cell type; change key or side")
    pos_of = {"E": pos[jnp.asarray(is_exc)], "I": pos[jnp.asarray(~is_exc)]}
    n_of = {"E": int(is_exc.sum()), "I": int((~is_exc).sum())}

    re = jr.uniform(k_re, (n_of["E"],))
    ri = jr.uniform(k_ri, (n_of["I"],))
    exc = Izhikevich(a=0.02, b=0.2, c=-65.0 + 15.0 * re**2, d=8.0 - 6.0 * re**2)
    inh = Izhikevich(a=0.02 + 0.08 * ri, b=0.25 - 0.05 * ri, c=-65.0, d=2.0)

    box = (float(side), float(side))
    projections = []
    keys = iter(jr.split(k_syn, 4))
    wkeys = iter(jr.split(k_w, 4))
    for pre in ("E", "I"):
        for post in ("E", "I"):
            scale = w_exc if pre == "E" else w_inh
            conn = connect.distance_connect(
                next(keys),
                pos_of[pre],
                pos_of[post],
                radius,
                p=p,
                periodic=box,
                allow_self=pre != post,
            )
            w = scale * jr.uniform(next(wkeys), (int(conn.nse),))
            conn = connect.from_arrays(
                conn.indices[:, 0], conn.indices[:, 1], w, n_of[pre], n_of[post]
            )
            projections.append(
                Projection(pre, post, conn, synapse=Delta(), output=CurrentOutput(), layout=method)
            )
    for pop, w_in in (("E", input_w_exc), ("I", input_w_inh)):
        projections.append(
            Projection(
                f"input_{pop}",
                pop,
                connect.one_to_one(n_of[pop], weight=w_in),
                synapse=Delta(),
                layout="event",
            )
        )
    gaps = {}
    if gap_g > 0:
        # Every pair within the radius (p = 1): the key draws nothing, but it must not be
        # the state's key all the same.
        pairs = connect.distance_connect(
            jr.fold_in(k_syn, 1),
            pos_of["I"],
            pos_of["I"],
            gap_radius,
            periodic=box,
            allow_self=False,
        )
        idx = jax.device_get(pairs.indices)
        keep = idx[:, 0] < idx[:, 1]
        if keep.any():
            gap_conn = connect.from_arrays(idx[keep, 0], idx[keep, 1], 1.0, n_of["I"], n_of["I"])
            gaps["I"] = GapJunction(gap_conn, g=gap_g)
    net = Network(
        populations={
            "E": (exc, n_of["E"]),
            "I": (inh, n_of["I"]),
            "input_E": (PoissonSource(input_rate), n_of["E"]),
            "input_I": (PoissonSource(input_rate), n_of["I"]),
        },
        projections=projections,
        gap_junctions=gaps,
    )
    return net, net.init_state(k_state, batch=batch)
