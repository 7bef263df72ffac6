r"""The cortical microcircuit of Potjans and Diesmann (2014, Cereb Cortex 24:785).

About 77 000 leaky integrate-and-fire neurons in eight populations, the excitatory (`E`) and
inhibitory (`I`) cells of layers 2/3, 4, 5 and 6 of 1 mm^2 of early sensory cortex, with
about 3 x 10^8 synapses whose numbers per pathway come from a table of connection
probabilities. The parameters below are those of the reference implementation, the INM-6
repository `microcircuit-PD14-model` (`PyNEST/src/microcircuit/network_params.py`,
`stimulus_params.py`), which replaced the example NEST shipped until 2025.

**Neurons** (NEST's `iaf_psc_exp`). $C_m \dot V = -(V - E_L) C_m/\tau_m + I_{syn} + I_e$,
$\tau_{syn} \dot I_{syn} = -I_{syn}$ plus the weight of each arriving spike; spike at
$V \ge V_{th}$, reset to $V_{reset}$, clamped for $t_{ref}$. $C_m$ = 250 pF, $\tau_m$ = 10 ms,
$\tau_{syn}$ = 0.5 ms (excitatory and inhibitory), $E_L = V_{reset}$ = -65 mV,
$V_{th}$ = -50 mV, $t_{ref}$ = 2 ms, dt = 0.1 ms.

How it maps onto neurojax, exactly: each population is an `nj.LIF` with
`r_m = tau_m / C_m = 40 MOhm` (currents in nA), `method="exact"`, and each projection an
`nj.Exponential(tau_syn)` kinetics with `nj.CurrentOutput()`. `nj.LIF` holds its input
current constant over a step, while `iaf_psc_exp` integrates the decay of the synaptic current
inside the step (its exact propagator $P_{21}$). The two agree exactly when the synaptic
weights are multiplied by
$$c = \frac{\tau_{syn}}{\tau_m - \tau_{syn}}
      \frac{e^{-h/\tau_m} - e^{-h/\tau_{syn}}}{1 - e^{-h/\tau_m}}$$
(0.9062 at h = 0.1 ms): then $r_m c J (1 - e^{-h/\tau_m}) = P_{21} J$, and the membrane
potential of every step equals NEST's (the arrival step matches too: a spike sent in step
`k` with a delay of `d` steps first moves $V$ at the end of step `k + d + 1` in both; see
`tests/test_microcircuit.py`, which compares a single neuron with NEST's trace). The
projections' weights are therefore `c J` in nA; `MICROCIRCUIT_PARAMS` and
`microcircuit_weights` give `J` in pA as published. The DC input $I_e$ is constant over a
step, so it needs no factor.

**Connectivity.** For target population `a` and source `b` with connection probability
$p_{ab}$ the full-scale number of synapses is
$K_{ab} = \ln(1 - p_{ab}) / \ln(1 - 1/(N_a N_b))$, scaled by `scale * k_scale` and rounded;
they are placed by `nj.connect.fixed_total_number` with multapses and autapses (NEST's
defaults for this rule). Weights are normal with mean $J$ and standard deviation $0.1 |J|$,
redrawn when their sign flips; $J$ is the current whose postsynaptic potential peaks at
0.15 mV (87.81 pA), $g J$ (g = -4) from inhibitory neurons and $2 J$ from L4E onto L2/3E
(whose standard deviation is 0.1 x 2J, as in the reference). Delays are normal with mean
1.5 ms (excitatory) or 0.75 ms (inhibitory) and standard deviation half the mean; a delay
below `dt / 2` is redrawn (the reference's `nest.math.redraw(min=resolution / 2)`), then every
delay is rounded to whole steps (half-way up, as NEST), so the shortest delay is one step.
With the stored event layout each pathway is built directly as compressed rows: the pairs'
keys sorted and decoded in place, weights and delay steps drawn a block at a time on two
threads beside them, into the buffers that become the tables without a copy (no `(n, 2)`
index array or float64 draw is ever held whole: a pathway's build needs little more than
its 9 bytes per synapse), with exactly the synapses, weights and delays that the pairs of
`nj.connect.fixed_total_number`, the truncated normals and `nj.Projection(..., dt=dt)` give
for the same key (see `tests/test_microcircuit.py`). A full-scale network builds in about
15 s on two cores.

**Background.** `background="poisson"`: every neuron receives an independent Poisson train at
$K_{ext}$ x 8 Hz through synapses of weight $J$ (delay 1.5 ms); per step the number of input
spikes is drawn from the Poisson distribution by inversion of its CDF with one float32
uniform number (probabilities below 2^-23 per step, counts above about 14, are not resolved).
`background="dc"`: the mean of that input as a constant current
$I_{DC} = 8\,\mathrm{Hz}\, K_{ext} J \tau_{syn}$.

**Down-scaling** (`scale`, `k_scale`; the reference's `N_scaling`, `K_scaling`). Neuron
numbers are multiplied by `scale`, synapse numbers by `scale * k_scale` (so in-degrees by
`k_scale`), external in-degrees by `k_scale`. When `k_scale != 1` the weights are divided by
$\sqrt{k}$ and each population receives the DC current
$0.001\,\tau_{syn} (1 - \sqrt{k}) \left(\sum_b J_{ab} K_{ab}/N_a \nu_b
+ [\text{poisson}]\; J K_{ext} \nu_{bg}\right)$ that restores the mean input, with
$\nu_b$ the full-scale rates of the reference (`full_mean_rates`). Reduced networks keep
their correctness only in the mean: compare them with a reference run at the same scale.

**Thalamic input** (`thalamus=True`): 902 thalamic neurons firing Poisson trains at 120 Hz
from 700 to 710 ms, connected by fixed total numbers (from `conn_probs_th`) with weights
N(J, (0.1 J)^2) and delays 1.5 +- 0.75 ms.

**Initial state.** Membrane potentials normal with the population-specific means and
standard deviations of the reference's "optimized" `V0_type`, synaptic currents zero.

**Where implementations differ and what neurojax does.**

- Inhibitory delay: 0.75 ms (reference repository, NEST's later example) rather than the
  0.8 ms of the paper's Table 5.
- The spread of the doubled L4E->L2/3E weight: 10 % of the doubled mean (reference
  repository); the paper's original code kept the undoubled standard deviation.
- Short delays: redrawn (reference repository), not clipped at one step.
- Background default: `"poisson"` as in the paper; the reference repository now defaults to
  `"dc"`.
- Number of thalamic synapses: the reference multiplies the full-scale count by `k_scale`
  only, so a network reduced by `scale` gets `1/scale` times more thalamic synapses per neuron;
  here it is scaled by `scale * k_scale`, keeping the thalamic in-degree of the full model.
- Thalamic spikes: at most one per step and neuron (Bernoulli with p = 120 Hz x dt = 0.012;
  NEST's parrot neurons repeat a Poisson count, different with probability 7e-5 per step).
- Float32 arithmetic (NEST uses float64); the rates and CVs agree within the seed-to-seed
  spread (`tests/test_microcircuit.py`).

Population names: `"L23E", "L23I", "L4E", "L4I", "L5E", "L5I", "L6E", "L6I"`; spike sources
`"background"` (with Poisson background; its "spikes" are per-step Poisson counts) and
`"thalamus"` (with `thalamus=True`).
"""

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jax import lax
from jax.experimental import sparse
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .. import connectivity as connect
from .. import kernels
from .._validation import as_float, default_float, normalize_shape
from ..connectivity._fixed_total import aligned_empty, fixed_total_csr
from ..network import Layout, Network, NetworkState, Projection, SpikeSource
from ..network._layout import layout_class
from ..network._projection import steps_dtype
from ..neurons import LIF
from ..synapses import CurrentOutput, Exponential

__all__ = [
    "MICROCIRCUIT_PARAMS",
    "microcircuit",
    "microcircuit_synapse_numbers",
    "microcircuit_weights",
    "microcircuit_dc",
]

POPULATIONS = ("L23E", "L23I", "L4E", "L4I", "L5E", "L5I", "L6E", "L6I")

MICROCIRCUIT_PARAMS: dict[str, Any] = dict(
    populations=POPULATIONS,
    full_num_neurons=(20683, 5834, 21915, 5479, 4850, 1065, 14395, 2948),
    full_mean_rates=(0.903, 2.965, 4.414, 5.876, 7.569, 8.633, 1.105, 7.829),
    conn_probs=(
        (0.1009, 0.1689, 0.0437, 0.0818, 0.0323, 0.0, 0.0076, 0.0),
        (0.1346, 0.1371, 0.0316, 0.0515, 0.0755, 0.0, 0.0042, 0.0),
        (0.0077, 0.0059, 0.0497, 0.135, 0.0067, 0.0003, 0.0453, 0.0),
        (0.0691, 0.0029, 0.0794, 0.1597, 0.0033, 0.0, 0.1057, 0.0),
        (0.1004, 0.0622, 0.0505, 0.0057, 0.0831, 0.3726, 0.0204, 0.0),
        (0.0548, 0.0269, 0.0257, 0.0022, 0.06, 0.3158, 0.0086, 0.0),
        (0.0156, 0.0066, 0.0211, 0.0166, 0.0572, 0.0197, 0.0396, 0.2252),
        (0.0364, 0.001, 0.0034, 0.0005, 0.0277, 0.008, 0.0658, 0.1443),
    ),
    psp_exc_mean=0.15,
    weight_rel_std=0.1,
    g=-4.0,
    l4e_to_l23e_factor=2.0,
    delay_exc_mean=1.5,
    delay_inh_mean=0.75,
    delay_rel_std=0.5,
    k_ext=(1600, 1500, 2100, 1900, 2000, 1900, 2900, 2100),
    bg_rate=8.0,
    delay_poisson=1.5,
    v0_mean=(-68.28, -63.16, -63.33, -63.45, -63.11, -61.66, -66.72, -61.43),
    v0_std=(5.36, 4.57, 4.74, 4.94, 4.94, 4.55, 5.46, 4.48),
    e_l=-65.0,
    v_th=-50.0,
    v_reset=-65.0,
    c_m=250.0,
    tau_m=10.0,
    tau_syn=0.5,
    t_ref=2.0,
    th_start=700.0,
    th_duration=10.0,
    th_rate=120.0,
    num_th_neurons=902,
    conn_probs_th=(0.0, 0.0, 0.0983, 0.0619, 0.0, 0.0, 0.0512, 0.0196),
    psp_th=0.15,
    delay_th_mean=1.5,
    delay_th_rel_std=0.5,
)
"""Parameters of `microcircuit`, those of the reference implementation (INM-6
`microcircuit-PD14-model`, after Potjans and Diesmann 2014, Tables 4-5).

- `populations`, `full_num_neurons`: names and full-scale sizes.
- `full_mean_rates` [Hz]: full-scale rates of the reference (used only by the DC
  compensation of `k_scale != 1`).
- `conn_probs[a][b]`: connection probability from source `b` onto target `a`.
- `psp_exc_mean` [mV]: peak PSP of an excitatory synapse; `weight_rel_std` its relative
  spread; `g` the relative inhibitory weight; `l4e_to_l23e_factor` the factor of L4E->L2/3E.
- `delay_exc_mean`, `delay_inh_mean` [ms], `delay_rel_std`: delays (std = rel_std x mean).
- `k_ext`: external (background) in-degrees; `bg_rate` [Hz] their rate; `delay_poisson` [ms].
- `v0_mean`, `v0_std` [mV]: initial membrane potentials per population ("optimized").
- `e_l`, `v_th`, `v_reset` [mV], `c_m` [pF], `tau_m`, `tau_syn`, `t_ref` [ms]: neurons.
- `th_*`, `num_th_neurons`, `conn_probs_th`, `psp_th`, `delay_th_*`: thalamic input
  (start and duration [ms], rate [Hz]).
"""


# ---------------------------------------------------------------------- derived parameters


def _psc_over_psp(c_m: float, tau_m: float, tau_syn: float) -> float:
    """Current amplitude [pA] of an exponential PSC whose PSP peaks at 1 mV."""
    sub = 1.0 / (tau_syn - tau_m)
    pre = tau_m * tau_syn / c_m * sub
    frac = (tau_m / tau_syn) ** sub
    return 1.0 / (pre * (frac**tau_m - frac**tau_syn))


def exact_factor(tau_m: float, tau_syn: float, dt: float) -> float:
    """The factor `c` that makes a step-constant current reproduce the exact propagator of
    an exponentially decaying current (see the module docstring)."""
    em, es = math.exp(-dt / tau_m), math.exp(-dt / tau_syn)
    return tau_syn / (tau_m - tau_syn) * (em - es) / (1.0 - em)


def _full_synapses(p: np.ndarray, n_post: np.ndarray, n_pre: np.ndarray) -> np.ndarray:
    prod = np.outer(n_post, n_pre).astype(np.float64)
    return np.log(1.0 - p) / np.log((prod - 1.0) / prod)


def microcircuit_synapse_numbers(scale: float = 1.0, k_scale: float = 1.0) -> np.ndarray:
    """Synapses per pathway, `[target, source]` (int64), for `scale` and `k_scale`:
    `round(K_full * scale * k_scale)` with `K_full = ln(1 - p) / ln(1 - 1/(N_a N_b))`."""
    c = MICROCIRCUIT_PARAMS
    n_full = np.asarray(c["full_num_neurons"], np.float64)
    full = _full_synapses(np.asarray(c["conn_probs"], np.float64), n_full, n_full)
    return np.round(full * scale * k_scale).astype(np.int64)


def microcircuit_weights(k_scale: float = 1.0) -> tuple[np.ndarray, float]:
    """Mean weights `[target, source]` and the background weight, in pA as published
    (before the exact-integration factor), divided by `sqrt(k_scale)`."""
    c = MICROCIRCUIT_PARAMS
    j = c["psp_exc_mean"] * _psc_over_psp(c["c_m"], c["tau_m"], c["tau_syn"])
    w = np.empty((8, 8))
    w[:, 0::2] = j
    w[:, 1::2] = c["g"] * j
    w[0, 2] *= c["l4e_to_l23e_factor"]
    return w / math.sqrt(k_scale), j / math.sqrt(k_scale)


def microcircuit_dc(k_scale: float = 1.0, background: str = "poisson") -> np.ndarray:
    """DC current per population [pA]: the mean of the background when `background="dc"`,
    plus the compensation of `k_scale != 1` (the reference's
    `adjust_weights_and_input_to_synapse_scaling`)."""
    c = MICROCIRCUIT_PARAMS
    w_full, j_full = microcircuit_weights(1.0)
    k_ext = np.asarray(c["k_ext"], np.float64)
    tau = c["tau_syn"]
    dc = np.zeros(8) if background == "poisson" else c["bg_rate"] * k_ext * j_full * tau * 1e-3
    if k_scale != 1.0:
        n_full = np.asarray(c["full_num_neurons"], np.float64)
        full = _full_synapses(np.asarray(c["conn_probs"], np.float64), n_full, n_full)
        indegree = full / n_full[:, None]
        rates = np.asarray(c["full_mean_rates"], np.float64)
        input_rec = np.sum(w_full * indegree * rates, axis=1)
        dc = dc + 1e-3 * tau * (1.0 - math.sqrt(k_scale)) * input_rec
        if background == "poisson":
            dc = dc + 1e-3 * tau * (1.0 - math.sqrt(k_scale)) * j_full * k_ext * c["bg_rate"]
    return dc


# ---------------------------------------------------------------------- spike sources


def _lookup(u: jax.Array, level: jax.Array, cdf: jax.Array) -> jax.Array:
    """The Poisson count of each uniform number `u[..., i]`: how many entries of its source's
    CDF row `cdf[level[i]]` lie below it (as a float of `u`'s dtype)."""
    table = cdf[level]  # (n, n_terms)
    return jnp.sum(u[..., None] > table, axis=-1).astype(u.dtype)


def _threefry_partitionable(key: PRNGKeyArray) -> bool:
    return str(jr.key_impl(key)) == "threefry2x32" and bool(jax.config.jax_threefry_partitionable)


def _poisson_counts_jax(key_data: Array, level: Array, cdf: Array, *, shape) -> Array:
    key = jr.wrap_key_data(key_data, impl="threefry2x32")
    return _lookup(jr.uniform(key, shape, dtype=cdf.dtype), level, cdf)


def _poisson_counts_cpu(key_data: Array, level: Array, cdf: Array, *, shape) -> Array:
    call = jax.ffi.ffi_call("nj_poisson_counts", jax.ShapeDtypeStruct(shape, jnp.float32))
    return call(key_data, level, cdf)


def _poisson_counts_supported(key_data, level, cdf, *, shape) -> bool:
    return (
        bool(jax.config.jax_threefry_partitionable)
        and key_data.dtype == jnp.uint32
        and key_data.shape == (2,)
        and level.dtype == jnp.int32
        and cdf.dtype == jnp.float32
        and cdf.ndim == 2
        and len(shape) >= 1
        and shape[-1] == level.shape[0]
    )


def _poisson_counts_examples():
    levels = jnp.asarray([8.0, 800.0, 25_000.0], jnp.float32) * 1e-4
    k = jnp.arange(12, dtype=jnp.float32)
    logp = k[None, :] * jnp.log(levels)[:, None] - levels[:, None] - lax.lgamma(k + 1.0)[None, :]
    cdf = jnp.cumsum(jnp.exp(logp), axis=-1)
    for n, batch in ((5, ()), (1300, ()), (300, (3,))):
        level = jnp.arange(n, dtype=jnp.int32) % 3
        key = jr.key_data(jr.key(n))
        yield kernels.Example((key, level, cdf), {"shape": (*batch, n)}, label=f"n={n}{batch}")


POISSON_COUNTS = kernels.register(
    kernels.Kernel(
        "poisson_counts",
        reference=_poisson_counts_jax,
        cpu=_poisson_counts_cpu,
        ffi_targets=(("nj_poisson_counts", "NjPoissonCounts"),),
        supports=_poisson_counts_supported,
        examples=_poisson_counts_examples,
        doc="Per-step counts of Poisson sources by inversion of their CDF (PoissonCounts).",
    )
)


class PoissonCountState(eqx.Module):
    """State of `PoissonCounts`: its PRNG key and the counts of the last step."""

    key: PRNGKeyArray
    spikes: Float[Array, "*batch n"]


class PoissonCounts(SpikeSource):
    r"""Independent Poisson processes whose per-step spike counts are emitted (not 0/1).

    Each source `i` draws, every step, $n_i \sim \mathrm{Poisson}(\lambda_i)$ with
    $\lambda_i$ = rate x dt / 1000 (any rate: several spikes per step are allowed, as NEST's
    `poisson_generator`), by inversion of the Poisson CDF with one uniform number: the count
    is the number of CDF values `F(0), ..., F(K-1)` below it (K = `n_terms`). Sources share
    one of a few rates (`levels`), each with its own table.

    Only a layout that multiplies the spike values by the weights can carry counts (the
    microcircuit's `InputLayout`); the event layout treats any value > 0 as one spike.
    """

    levels: Float[Array, " m"]  # the distinct rates [Hz]
    level: Int[Array, " n"]  # which rate each source has
    n_terms: int = eqx.field(static=True)

    @property
    def max_spikes_per_step(self) -> int:  # type: ignore[override]
        """A count is at most `n_terms`; `nj.simulate` records the counts, not 0/1."""
        return self.n_terms

    def init_state(self, shape, *, key: PRNGKeyArray | None = None) -> PoissonCountState:
        """A state for `shape` sources (batch dimensions first); `key` is required."""
        shape = normalize_shape("PoissonCounts.init_state", shape)
        if key is None:
            raise ValueError("PoissonCounts.init_state: key is required (a jax.random.key)")
        if shape[-1:] != self.level.shape:
            raise ValueError(
                f"PoissonCounts.init_state: the last axis must be {self.level.shape[0]} "
                f"sources, got shape {shape}"
            )
        return PoissonCountState(key=key, spikes=jnp.zeros(shape, default_float()))

    def _cdf(self, dt: float) -> jax.Array:
        lam = self.levels * (dt * 1e-3)
        k = jnp.arange(self.n_terms, dtype=lam.dtype)
        # log P(k) = k log lam - lam - log k!, cumulated: CDF table (levels, n_terms)
        logp = k[None, :] * jnp.log(lam)[:, None] - lam[:, None] - lax.lgamma(k + 1.0)[None, :]
        return jnp.cumsum(jnp.exp(logp), axis=-1)

    def _counts(self, u: jax.Array, level: jax.Array, dt: float) -> jax.Array:
        return _lookup(u, level, self._cdf(dt))

    def step(self, state: PoissonCountState, current=None, dt: float = 0.1):
        """Draw this step's counts; `current` is ignored."""
        key, sub = jr.split(state.key)
        shape, dtype = state.spikes.shape, state.spikes.dtype
        cdf = self._cdf(dt)
        if _threefry_partitionable(sub) and dtype == jnp.float32 and cdf.dtype == jnp.float32:
            # The same numbers through the registered kernel (`poisson_counts`: on CPU one
            # call that draws by source ranges on the kernels' threads).
            counts = kernels.call(POISSON_COUNTS, jr.key_data(sub), self.level, cdf, shape=shape)
        else:
            counts = _lookup(jr.uniform(sub, shape, dtype=dtype), self.level, cdf)
        return PoissonCountState(key=key, spikes=counts), counts

    def cpu_run_counts(self, state: PoissonCountState, dt: float):
        """What the network's whole CPU run (`nj_network_run`) needs to draw exactly this
        source's counts, `(key data (2,) uint32, level, CDF table)`, or None where it cannot:
        a subclass with its own `step`, a key other than partitionable Threefry's, or state
        and table not float32 (then `step` would not take the compiled draws either)."""
        if type(self).step is not PoissonCounts.step:
            return None
        key = state.key
        if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key) or key.shape != ():
            return None
        cdf = self._cdf(dt)
        if not (_threefry_partitionable(key) and state.spikes.dtype == jnp.float32):
            return None
        if cdf.dtype != jnp.float32 or state.spikes.shape != self.level.shape:
            return None
        return jr.key_data(key).astype(jnp.uint32), self.level, cdf

    def step_block(self, state, dt, *, size, padded_size, block, axis_name):
        """One device's block of `step` (the uniform numbers of the whole population drawn
        from the replicated key, the device's block kept; padding sources emit 0)."""
        key, sub = jr.split(state.key)
        u = jr.uniform(sub, (size,), dtype=state.spikes.dtype)
        level = self.level
        if padded_size > size:
            u = jnp.concatenate([u, jnp.zeros((padded_size - size,), u.dtype)])
            level = jnp.concatenate([level, jnp.zeros((padded_size - size,), level.dtype)])
        start = lax.axis_index(axis_name).astype(jnp.int32) * block
        u = lax.dynamic_slice_in_dim(u, start, block)
        level = lax.dynamic_slice_in_dim(level, start, block)
        counts = self._counts(u, level, dt)
        return PoissonCountState(key=key, spikes=counts), counts


class PoissonWindowState(eqx.Module):
    """State of `PoissonWindow`: PRNG key, step counter and the last spikes."""

    key: PRNGKeyArray
    step: Int[Array, ""]
    spikes: Float[Array, "*batch n"]


class PoissonWindow(SpikeSource):
    """Bernoulli-per-step Poisson trains at `rate` Hz between `start` and `start + duration`
    ms (steps whose start lies in the window), silent elsewhere."""

    rate: float = eqx.field(static=True)
    start: float = eqx.field(static=True)
    duration: float = eqx.field(static=True)

    def init_state(self, shape, *, key: PRNGKeyArray | None = None) -> PoissonWindowState:
        """A state for `shape` sources (batch dimensions first); `key` is required."""
        shape = normalize_shape("PoissonWindow.init_state", shape)
        if key is None:
            raise ValueError("PoissonWindow.init_state: key is required (a jax.random.key)")
        zero = jnp.zeros((), jnp.int32)
        return PoissonWindowState(key=key, step=zero, spikes=jnp.zeros(shape, default_float()))

    def check_dt(self, dt: float) -> None:
        """Raise when `rate * dt` would make a spike probability above 1."""
        if self.rate * dt > 1000.0:
            raise ValueError(f"PoissonWindow: rate * dt must be <= 1000, got {self.rate * dt}")

    def _draw(self, state, u, dt):
        t = state.step.astype(u.dtype) * dt
        on = (t >= self.start - 1e-6 * dt) & (t < self.start + self.duration - 1e-6 * dt)
        spikes = ((u < self.rate * dt * 1e-3) & on).astype(u.dtype)
        return spikes

    def step(self, state: PoissonWindowState, current=None, dt: float = 0.1):
        """This step's spikes; `current` is ignored."""
        self.check_dt(dt)
        key, sub = jr.split(state.key)
        u = jr.uniform(sub, state.spikes.shape, dtype=state.spikes.dtype)
        s = self._draw(state, u, dt)
        return PoissonWindowState(key=key, step=state.step + 1, spikes=s), s

    def step_block(self, state, dt, *, size, padded_size, block, axis_name):
        """One device's block of `step` (see `nj.PoissonSource.step_block`)."""
        key, sub = jr.split(state.key)
        u = jr.uniform(sub, (size,), dtype=state.spikes.dtype)
        if padded_size > size:
            u = jnp.concatenate([u, jnp.ones((padded_size - size,), u.dtype)])
        start = lax.axis_index(axis_name).astype(jnp.int32) * block
        u = lax.dynamic_slice_in_dim(u, start, block)
        s = self._draw(state, u, dt)
        return PoissonWindowState(key=key, step=state.step + 1, spikes=s), s


# ---------------------------------------------------------------------- input layout


class InputLayout(Layout):
    """At most one synapse per postsynaptic neuron: `pre[j]` and `weight[j]` for each target
    `j` (weight 0 where none). `product(s) = s[..., pre] * weight` carries spike counts
    (`PoissonCounts`) as well as 0/1 spikes. 8 bytes per postsynaptic neuron."""

    name: ClassVar[str] = "input"

    n_pre: int = eqx.field(static=True)
    n_post: int = eqx.field(static=True)
    pre: Int[Array, " n_post"]
    weight: Float[Array, " n_post"]

    @classmethod
    def from_bcoo(cls, conn: sparse.BCOO, *, delay=None, plastic=False):
        """The layout of `conn`; refuses a target with two synapses or per-synapse delays."""
        if delay is not None or plastic:
            raise ValueError("InputLayout: one delay for all synapses and static weights only")
        n_pre, n_post = (int(d) for d in conn.shape)
        idx = np.asarray(conn.indices)
        if np.bincount(idx[:, 1], minlength=n_post).max(initial=0) > 1:
            raise ValueError("InputLayout: a postsynaptic neuron has more than one synapse")
        pre = np.zeros(n_post, np.int32)
        w = np.zeros(n_post, np.float32)
        pre[idx[:, 1]] = idx[:, 0]
        w[idx[:, 1]] = np.asarray(conn.data)
        # device_put (in as_float too), not jnp.asarray: no program compiled per shape
        return cls(n_pre, n_post, jax.device_put(pre), as_float(w)), None

    def to_bcoo(self) -> sparse.BCOO:
        """The synapses (targets with a nonzero weight) as a BCOO, row-major."""
        pre, w = np.asarray(self.pre), np.asarray(self.weight)
        post = np.flatnonzero(w != 0)
        order = np.lexsort((post, pre[post]))
        post = post[order]
        idx = np.stack([pre[post], post], axis=1).astype(np.int32)
        return sparse.BCOO((self.weight[post], jnp.asarray(idx)), shape=(self.n_pre, self.n_post))

    def nbytes(self) -> int:
        """Bytes of the two arrays."""
        return int(self.pre.nbytes + self.weight.nbytes)

    def product(self, s):
        """`s @ W`: each target's presynaptic value times its weight."""
        return s[..., self.pre] * self.weight.astype(s.dtype)


# ---------------------------------------------------------------------- the builder


def _procedural(pw: "_Pathway", to_na, dt, syn):
    """A pathway of `pw.n` synapses in the procedural layout: the same laws as the stored
    pathway (fixed total number with multapses and autapses, normal weights, normal delays
    conditioned on >= dt/2 and rounded to steps), regenerated at every spike.

    Excitatory weights are truncated at 0 as in the stored layout; inhibitory ones are drawn
    untruncated (the procedural normal truncates only below 0): at the published spread of
    10 % of the mean, a draw of the other sign has probability about 1e-23."""
    mean, std = pw.weight[:2]
    d_mean, rel = pw.delay
    weight = connect.normal(mean * to_na, std * to_na, nonnegative=bool(mean > 0))
    desc = connect.procedural.fixed_total(
        pw.keys[0],
        pw.n_pre,
        pw.n_post,
        pw.n,
        weight=weight,
        delay=connect.normal(d_mean, d_mean * rel),
        dt=dt,
        delay_range=(0.5 * dt, d_mean * (1.0 + 40.0 * rel)),
    )
    return Projection(pw.pre, pw.post, desc, synapse=syn, output=CurrentOutput())


_BLOCK = 1 << 18  # values per block of the host-side draws (2 MB of float64)


def _truncated_normal(key, n: int, mean: float, std: float, low: float, high: float):
    """`n` float64 values from N(mean, std^2), redrawn until they lie in [low, high].

    Drawn by NumPy's generator seeded with the key's data (one JAX kernel per pathway size
    would compile hundreds of programs), so a key still fixes the values."""
    rng = np.random.default_rng(np.asarray(jr.key_data(key)).ravel())
    # Drawn, scaled and checked a block at a time (the generator's stream does not depend on
    # the block sizes), so that each block is still in cache for the next pass; an infinite
    # bound is not compared. The same values as one draw of n.
    x = np.empty(n)
    bad = []
    for s in range(0, n, _BLOCK):
        block = x[s : s + _BLOCK]
        block[...] = rng.standard_normal(block.shape[0])
        block *= std
        block += mean
        out = np.zeros(block.shape[0], bool)
        if low > -np.inf:
            out |= block < low
        if high < np.inf:
            out |= block > high
        bad.append(np.flatnonzero(out) + s)
    bad = np.concatenate(bad) if bad else np.empty(0, np.int64)
    while bad.size:
        new = mean + std * rng.standard_normal(bad.size)
        x[bad] = new
        bad = bad[(new < low) | (new > high)]
    return x


def _bcoo(idx: np.ndarray, w: np.ndarray, n_pre: int, n_post: int) -> sparse.BCOO:
    """Row-major `(n, 2)` indices and float64 weights as a float32 BCOO (built on the host:
    no JAX program per pathway size)."""
    data = jax.device_put(w.astype(np.float32))
    return sparse.BCOO(
        (data, jax.device_put(idx)),
        shape=(n_pre, n_post),
        indices_sorted=True,
        unique_indices=False,
    )


_DRAW_BLOCK = 1 << 15  # values per block of the fused draws (256 kB of float64: in L2)


def _truncated_normal_into(key, n: int, mean: float, std: float, low: float, high: float, put):
    """The values of `_truncated_normal(key, n, mean, std, low, high)`, handed to
    `put(values, where)` a block at a time (`where` the block's first position, an int, or
    an index array) instead of being kept: the same generator stream (all `n` first, then
    the redraws of the values outside `[low, high]`), the float64 values only ever a block
    in cache, in buffers reused from block to block. A position whose value is redrawn is
    put again with its final value after all blocks."""
    rng = np.random.default_rng(np.asarray(jr.key_data(key)).ravel())
    buf = np.empty(min(n, _DRAW_BLOCK))
    out, more = np.empty(buf.shape, bool), np.empty(buf.shape, bool)
    bad = []
    for s in range(0, n, _DRAW_BLOCK):
        m = min(_DRAW_BLOCK, n - s)
        block, o = buf[:m], out[:m]
        rng.standard_normal(out=block)
        block *= std
        block += mean
        o[...] = False
        if low > -np.inf:
            np.less(block, low, out=o)
        if high < np.inf:
            o |= np.greater(block, high, out=more[:m])
        if o.any():
            bad.append(np.flatnonzero(o) + s)
        put(block, s)
    bad = np.concatenate(bad) if bad else np.empty(0, np.int64)
    final = np.empty(bad.size)
    pending = np.arange(bad.size)
    while pending.size:
        new = mean + std * rng.standard_normal(pending.size)
        final[pending] = new
        pending = pending[(new < low) | (new > high)]
    if bad.size:
        put(final, bad)


def _weights_f32(key, n: int, mean: float, std: float, low: float, high: float, to_na: float):
    """`(_truncated_normal(...) * to_na).astype(float32)`: the stored weights, the float64
    draws never held whole (4 bytes per synapse in all, in a buffer the device takes over)."""
    w = aligned_empty(n, np.float32)  # taken over by the device without a copy

    def put(x, where):
        if isinstance(where, int):  # a block from `where` on: product in float64, rounded
            np.multiply(x, to_na, out=w[where : where + x.shape[0]], casting="same_kind")
        else:
            w[where] = x * to_na

    _truncated_normal_into(key, n, mean, std, low, high, put)
    return w


def _delay_steps(key, n: int, mean: float, std: float, low: float, dt: float):
    """The delay steps `nj.Projection(..., delay=_truncated_normal(key, n, mean, std, low,
    inf), dt=dt)` keeps (the float32 ms values rounded as `_projection._as_steps` does, in
    the smallest integer dtype) and the largest delay in ms, the float64 delays never held
    whole (1 byte per synapse in all at the microcircuit's delays, in a buffer the device
    takes over)."""
    state = {"out": aligned_empty(n, np.int8), "top": -np.inf, "step_top": 0}
    m = min(n, _DRAW_BLOCK)
    f32, r_buf, t_buf = np.empty(m, np.float32), np.empty(m), np.empty(m)

    def put(x, where):
        k = x.shape[0]
        if k > m:  # the redrawn values (more than a block): fresh buffers
            return put_into(x, where, np.empty(k, np.float32), np.empty(k), np.empty(k))
        return put_into(x, where, f32[:k], r_buf[:k], t_buf[:k])

    def put_into(x, where, f, r, t):
        # the operations of `_as_steps` on the float32 delays, in its order
        np.copyto(f, x, casting="same_kind")
        np.copyto(r, f)
        r /= dt
        np.maximum(r, 1.0, out=t)
        t *= 1e-6
        r += 0.5
        r += t
        np.floor(r, out=r)
        if x.size:
            state["top"] = max(state["top"], float(x.max()))
            top = int(r.max())
            if top > state["step_top"]:
                state["step_top"] = top
                wide = steps_dtype(top)
                if np.dtype(wide).itemsize > state["out"].dtype.itemsize:
                    wider = aligned_empty(n, wide)
                    wider[...] = state["out"]
                    state["out"] = wider
        if isinstance(where, int):
            state["out"][where : where + x.shape[0]] = r
        else:
            state["out"][where] = r

    # the values outside [low, inf) are below every final value, so `top` is the final max
    _truncated_normal_into(key, n, mean, std, low, np.inf, put)
    return state["out"], state["top"]


class _Pathway(NamedTuple):
    """One pathway of the model as data: who connects to whom, how many synapses, the
    weight and delay laws (before the pA -> nA conversion) and the three keys of its pairs,
    weights and delays."""

    pre: str
    post: str
    n_pre: int
    n_post: int
    n: int
    weight: tuple[float, float, float, float]  # mean, std, low, high [pA]
    delay: tuple[float, float]  # mean [ms], standard deviation relative to the mean
    keys: tuple[jax.Array, jax.Array, jax.Array]


def _stored_pathway(
    pool, pw: _Pathway, layout_cls: type[Layout], to_na, d_min, dt, syn
) -> Projection:
    """One fixed-total pathway stored in `layout_cls`, built from compressed rows
    (`Layout.from_csr`): the pairs drawn and sorted on this thread while the weights and the
    delay steps are drawn on the two of `pool` (NumPy's generators and sort release the GIL;
    each has its own key's stream, so the synapses are those of `_bcoo` + `nj.Projection`,
    bit for bit)."""
    k_pairs, k_w, k_d = pw.keys
    fw = pool.submit(_weights_f32, k_w, pw.n, *pw.weight, to_na)
    d_mean, rel = pw.delay
    fd = pool.submit(_delay_steps, k_d, pw.n, d_mean, d_mean * rel, d_min, dt)
    indptr, indices = fixed_total_csr(k_pairs, pw.n_pre, pw.n_post, pw.n, True)
    w = fw.result()
    steps, d_max = fd.result()
    layout, steps = layout_cls.from_csr(pw.n_pre, pw.n_post, indptr, indices, w, delay=steps)
    del w, indices
    return Projection._trusted(
        pw.pre,
        pw.post,
        layout,
        synapse=syn,
        output=CurrentOutput(),
        delay_steps=steps,
        max_delay=d_max,
        dt=dt,
    )


def _pathways(c, sizes, n_syn, w_mean, keys, thalamus, scale, k_scale) -> list[_Pathway]:
    """Every pathway of the model, recurrent then thalamic, in the order of the
    projections."""
    k_conn, k_w, k_d, k_th = keys
    out = []
    for a, post in enumerate(POPULATIONS):
        for b, pre in enumerate(POPULATIONS):
            n = int(n_syn[a, b])
            if n == 0:
                continue
            mean = float(w_mean[a, b])
            low, high = (0.0, np.inf) if mean > 0 else (-np.inf, 0.0)
            d_mean = c["delay_exc_mean"] if b % 2 == 0 else c["delay_inh_mean"]
            i = 8 * a + b
            out.append(
                _Pathway(
                    pre,
                    post,
                    sizes[pre],
                    sizes[post],
                    n,
                    (mean, abs(mean) * c["weight_rel_std"], low, high),
                    (d_mean, c["delay_rel_std"]),
                    (jr.fold_in(k_conn, i), jr.fold_in(k_w, i), jr.fold_in(k_d, i)),
                )
            )
    if not thalamus:
        return out
    n_th = int(c["num_th_neurons"])
    p_th = np.asarray(c["conn_probs_th"], np.float64)
    full = _full_synapses(p_th[None, :], np.asarray([n_th]), np.asarray(c["full_num_neurons"]))
    n_th_syn = np.round(full[0] * scale * k_scale).astype(np.int64)
    j_th = c["psp_th"] * _psc_over_psp(c["c_m"], c["tau_m"], c["tau_syn"])
    j_th /= math.sqrt(k_scale)
    d_mean = c["delay_th_mean"]
    for a, post in enumerate(POPULATIONS):
        n = int(n_th_syn[a])
        if n == 0:
            continue
        out.append(
            _Pathway(
                "thalamus",
                post,
                n_th,
                sizes[post],
                n,
                (j_th, j_th * c["weight_rel_std"], 0.0, np.inf),
                (d_mean, c["delay_th_rel_std"]),
                tuple(jr.fold_in(k_th, 3 * a + i) for i in range(3)),
            )
        )
    return out


def _check_real(name: str, value: Any, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"microcircuit: {name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or (positive and value <= 0):
        raise ValueError(f"microcircuit: {name} must be a finite number > 0, got {value!r}")
    return value


def microcircuit(
    key: jax.Array | None = None,
    *,
    scale: float = 1.0,
    k_scale: float = 1.0,
    background: str = "poisson",
    thalamus: bool = False,
    layout: Any = "event",
    dt: float = 0.1,
    batch: int | tuple[int, ...] = (),
    merge_synapses: bool = True,
) -> tuple[Network, NetworkState]:
    r"""The Potjans and Diesmann (2014) cortical microcircuit and its initial state.

    See the module docstring for the model, its exact mapping onto `nj.LIF`, the
    down-scaling rule and every choice where implementations differ.

    Args:
        key: PRNG key for connectivity, weights, delays, initial voltages and the Poisson
            sources (default `jax.random.key(0)`).
        scale: factor on the neuron numbers (the reference's `N_scaling`), in (0, 1]; synapse
            numbers follow so that in-degrees stay.
        k_scale: factor on the in-degrees (`K_scaling`), in (0, 1]; weights are divided by
            `sqrt(k_scale)` and DC compensation added.
        background: `"poisson"` (independent Poisson input per neuron) or `"dc"` (its mean
            as a constant current).
        thalamus: add the 902 thalamic neurons firing at 120 Hz from 700 to 710 ms.
        layout: the storage of the recurrent and thalamic projections (default `"event"`,
            the stored layout; a `nj.network.Layout` subclass that supports per-synapse
            delays plugs in another, built from each pathway's compressed rows by its
            `from_csr`), or `"procedural"`: no synapse
            is stored, each pathway is a `nj.connect.procedural.fixed_total` description
            with the same laws (inhibitory weights drawn untruncated, see `_procedural`),
            its synapses regenerated at every spike.
        dt: time step [ms] the delays and the exact-integration factor are built for
            (0.1 ms in the model); simulate with the same `dt`.
        batch: leading batch dimensions of the state (independent initial voltages and
            Poisson inputs on the same connectivity).
        merge_synapses: passed to `nj.Network`. With True (default), every pathway from
            the eight populations (and from the thalamus) onto a population shares one
            ring block and one synaptic current, as a NEST `iaf_psc_exp` neuron sums its
            inputs in one current per receptor type (all pathways here have the same
            `tau_syn`): the ring is about 7x smaller (at full scale 57 slots x 77 169
            columns instead of x 525 530) and the current decays once per neuron and step.
            `state.synapses[i]` of a pathway then holds that population's whole recurrent
            current in the first pathway onto it and zeros in the others. False gives
            every pathway its own columns and current (the same spikes up to the order of
            float additions).

    Returns:
        `(network, state)`; `network.step` returns spikes for the eight populations and the
        sources.

    Example:
    ```python
    net, state = nj.models.microcircuit(jax.random.key(0), scale=0.1)
    state, rec = nj.simulate(net, state, dt=0.1, n_steps=10000)
    rec.spikes["L4E"].mean() * 1e4     # mean L4E rate in Hz
    ```

    References:
        T. C. Potjans and M. Diesmann (2014), The cell-type specific cortical microcircuit,
        Cereb Cortex 24:785-806. INM-6 `microcircuit-PD14-model` (reference implementation).
    """
    from .._validation import check_key  # (a separate hunk from the builder's imports)

    owner = "microcircuit"
    key = None if key is None else check_key(owner, key)
    scale = _check_real("scale", scale)
    k_scale = _check_real("k_scale", k_scale)
    dt = _check_real("dt", dt)
    if scale > 1.0:
        raise ValueError(f"microcircuit: scale must be in (0, 1], got {scale!r}")
    if k_scale > 1.0:
        raise ValueError(f"microcircuit: k_scale must be in (0, 1], got {k_scale!r}")
    if background not in ("poisson", "dc"):
        raise ValueError(f"microcircuit: background must be 'poisson' or 'dc', got {background!r}")
    if not isinstance(thalamus, (bool, np.bool_)):
        raise TypeError(f"microcircuit: thalamus must be True or False, got {thalamus!r}")
    if not isinstance(merge_synapses, (bool, np.bool_)):
        raise TypeError(
            f"microcircuit: merge_synapses must be True or False, got {merge_synapses!r}"
        )
    if not (isinstance(layout, str) or (isinstance(layout, type) and issubclass(layout, Layout))):
        raise TypeError(
            "microcircuit: layout must be a projection method name ('event', 'auto') or "
            f"a nj.network.Layout subclass, got {layout!r}"
        )
    if isinstance(layout, str) and layout not in ("event", "auto", "procedural"):
        raise ValueError(
            "microcircuit: layout must be 'event', 'auto' (the built-in stored layouts with "
            "per-synapse delays), 'procedural' (no stored synapses) or a nj.network.Layout "
            f"subclass, got {layout!r}"
        )
    procedural = layout == "procedural"
    if isinstance(layout, type) and not layout.per_synapse_delays:
        raise ValueError(
            f"microcircuit: layout {layout.__name__} must support per-synapse delays "
            "(per_synapse_delays = True)"
        )
    batch = normalize_shape(owner, batch)
    key = jr.key(0) if key is None else key
    c = MICROCIRCUIT_PARAMS
    n_of = np.round(np.asarray(c["full_num_neurons"]) * scale).astype(np.int64)
    if n_of.min() < 1:
        raise ValueError(
            f"microcircuit: scale={scale} leaves a population without neurons (smallest "
            f"{int(n_of.min())}); use scale >= {1 / min(c['full_num_neurons']):.2g}"
        )
    sizes = {p: int(n) for p, n in zip(POPULATIONS, n_of, strict=True)}
    n_syn = microcircuit_synapse_numbers(scale, k_scale)
    w_mean, j_ext = microcircuit_weights(k_scale)
    dc = microcircuit_dc(k_scale, background)
    factor = exact_factor(c["tau_m"], c["tau_syn"], dt)
    to_na = 1e-3 * factor  # pA -> nA, times the exact-integration factor

    k_conn, k_w, k_d, k_v, k_state, k_th = jr.split(key, 6)
    lif = LIF(
        tau_m=c["tau_m"],
        v_rest=c["e_l"],
        v_reset=c["v_reset"],
        v_th=c["v_th"],
        r_m=c["tau_m"] / c["c_m"] * 1e3,  # ms / pF = GOhm -> MOhm
        t_ref=c["t_ref"],
        method="exact",
    )
    syn = Exponential(c["tau_syn"])
    pathways = _pathways(
        c, sizes, n_syn, w_mean, (k_conn, k_w, k_d, k_th), thalamus, scale, k_scale
    )
    d_min = 0.5 * dt  # delays are drawn conditioned on at least half a step
    projections = []
    # weights and delays on two threads while the pairs are drawn (see `_stored_pathway`)
    with ThreadPoolExecutor(2) as pool:
        for pw in pathways:
            if procedural:
                projections.append(_procedural(pw, to_na, dt, syn))
                continue
            cls = layout_class(
                layout, n_pre=pw.n_pre, n_post=pw.n_post, per_synapse_delays=True, plastic=False
            )
            projections.append(_stored_pathway(pool, pw, cls, to_na, d_min, dt, syn))
        populations = {p: (lif, sizes[p]) for p in POPULATIONS}
        n_total = int(n_of.sum())
        offsets = np.concatenate([[0], np.cumsum(n_of)])
        if background == "poisson":
            k_ext = np.round(np.asarray(c["k_ext"], np.float64) * k_scale)
            rates = k_ext * c["bg_rate"]
            lam_max = float(rates.max()) * dt * 1e-3
            # terms up to where the Poisson tail is below float32's resolution of a uniform
            n_terms = int(lam_max + 6.0 * math.sqrt(lam_max) + 6)
            source = PoissonCounts(
                levels=as_float(rates),
                level=jax.device_put(np.repeat(np.arange(8, dtype=np.int32), n_of)),
                n_terms=n_terms,
            )
            populations["background"] = (source, n_total)
            for a, post in enumerate(POPULATIONS):
                pre_ids = np.arange(offsets[a], offsets[a + 1], dtype=np.int32)
                conn = connect.from_arrays(
                    pre_ids,
                    np.arange(sizes[post], dtype=np.int32),
                    j_ext * to_na,
                    n_total,
                    sizes[post],
                )
                projections.append(
                    Projection(
                        "background",
                        post,
                        conn,
                        synapse=syn,
                        output=CurrentOutput(),
                        delay=c["delay_poisson"],
                        layout=InputLayout,
                    )
                )
        if thalamus:
            populations["thalamus"] = (
                PoissonWindow(c["th_rate"], c["th_start"], c["th_duration"]),
                int(c["num_th_neurons"]),
            )
    inputs = {p: float(dc[a] * 1e-3) for a, p in enumerate(POPULATIONS) if dc[a] != 0.0}
    # in the order of the reference: recurrent, background, thalamic
    n_recurrent = sum(pw.pre != "thalamus" for pw in pathways)
    thalamic = projections[n_recurrent : len(pathways)]
    projections = projections[:n_recurrent] + projections[len(pathways) :] + thalamic
    net = Network(populations, projections, inputs=inputs, dt=dt, merge_synapses=merge_synapses)

    # one program for the whole initial state (per-population draws would compile one each)
    state = jax.jit(lambda m, k: m.init_state(k, batch=batch))(net, k_state)
    # one draw for all populations (one program, whatever the sizes), split per population
    z = jr.normal(k_v, batch + (n_total,), default_float())
    mean = jax.device_put(np.repeat(np.asarray(c["v0_mean"], np.float32), n_of))
    std = jax.device_put(np.repeat(np.asarray(c["v0_std"], np.float32), n_of))
    # split on the host: a slice per population on the device compiles a program per size
    v_all = np.asarray(mean + std * z)
    v0 = {
        p: jax.device_put(v_all[..., offsets[a] : offsets[a + 1]])
        for a, p in enumerate(POPULATIONS)
    }
    state = eqx.tree_at(
        lambda s: tuple(s.populations[p].v for p in POPULATIONS),
        state,
        tuple(v0[p] for p in POPULATIONS),
    )
    return net, state


# ---------------------------------------------------------------------- running it


class _SpikeIds(eqx.Module):
    """The network stepped with, as its one output, the spikes of the eight populations
    concatenated in their order (the background source left out), so that a run recorded
    with `nj.Record(spikes="ids")` finds the step's spiking neurons in one pass and gives global
    ids."""

    net: Network

    def init_state(self, *args, **kwargs):
        return self.net.init_state(*args, **kwargs)

    def step(self, state, inputs, dt):
        state, out = self.net.step(state, inputs, dt)
        return state, jnp.concatenate([out[p] for p in POPULATIONS], axis=-1) > 0


@eqx.filter_jit
def _rasters(net: Network, state: NetworkState, n_steps: int, dt: float):
    """`n_steps` steps of `net` (its whole run where one serves it) and the eight
    populations' spike rasters; compiled once per network shape, chunk length and `dt`."""
    from .._simulate import simulate

    state, rec = simulate(net, state, dt=dt, n_steps=n_steps)
    return state, tuple(rec.spikes[p] for p in POPULATIONS)


def run_spike_ids(
    net: Network,
    state: NetworkState,
    n_steps: int,
    dt: float,
    progress: bool = False,
    cpu: dict | None = None,
):
    """Run `n_steps` of the (unbatched) microcircuit through `nj.simulate` in chunks of
    2 000 steps, recording the spikes of the eight populations as global neuron ids
    (populations concatenated in `POPULATIONS` order; the background source left out).

    Where the network's whole run serves it (`Network.explain_run` on this backend: the
    CPU's `nj_network_run`, or one GPU program), each chunk is that run with the spike
    raster recorded, and the eight rasters are turned into ids on the host inside the timed
    chunk. Elsewhere the network is stepped with the eight populations' spikes as its one
    output and recorded with `nj.Record(spikes="ids")`. Both give the same spikes.

    The public way to the same record is `nj.simulate(net, state, dt=dt, n_steps=n,
    record=nj.Record(spikes="ids"))`, which gives one `nj.SpikeTimes` per population (and one
    for the background source).

    Returns `(final_state, ids, counts, compile_s, run_s)`: `ids` the global ids of all
    spikes in step order, `counts` the number of spikes of each step; `compile_s` and
    `run_s` are wall-clock seconds (`recording.info`). A dict `cpu` receives the process CPU
    seconds of the whole call (`"s"`).
    """
    from .._options import Execution, Record
    from .._run_loop import run_chunks
    from .._simulate import simulate

    chunk = min(n_steps, 2000)
    backend = jax.default_backend()
    paths = net.explain_run(state, dt=dt, n_steps=chunk)
    if paths.get({"gpu": "cuda"}.get(backend, backend), "").startswith("network_run"):
        offsets = np.cumsum([0] + [net.sizes[p] for p in POPULATIONS])

        def run_chunk(net, st, start, length):
            st, spikes = _rasters(net, st, length, dt)
            steps, ids = [], []
            for a, r in enumerate(spikes):
                # in (step, neuron) order; flatnonzero then divmod is 5x np.nonzero's speed
                s, i = np.divmod(np.flatnonzero(np.asarray(r)), r.shape[1])
                steps.append(s)
                ids.append((i + offsets[a]).astype(np.int32))
            s, i = np.concatenate(steps), np.concatenate(ids)
            order = np.argsort(s, kind="stable")  # populations stay in their order
            return st, (i[order], np.bincount(s, minlength=length).astype(np.int32))

        _, final, outs, info = run_chunks(
            run_chunk, net, state, n_steps=n_steps, chunk_size=chunk, progress=progress,
            dt=dt, desc="microcircuit",
        )  # fmt: skip
        ids = np.concatenate([o[0] for o in outs])
        counts = np.concatenate([o[1] for o in outs])
        if cpu is not None:
            cpu.update(s=info.cpu_s)
        return final, ids, counts, info.compile_s, info.run_s
    final, rec = simulate(
        _SpikeIds(net),
        state,
        dt=dt,
        n_steps=n_steps,
        record=Record(spikes="ids"),
        run=Execution(chunk_size=chunk, progress=progress),
    )
    times = rec.spikes
    first = int(state.step) if np.ndim(state.step) == 0 else 0
    counts = np.bincount(times.step - first, minlength=n_steps).astype(np.int32)
    if cpu is not None:
        cpu.update(s=rec.info.cpu_s)
    return final, times.i, counts, rec.info.compile_s, rec.info.run_s
