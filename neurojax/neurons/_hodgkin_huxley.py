"""Hodgkin-Huxley neuron (classic squid giant axon, modern sign convention)."""

import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._validation import as_float, check_choice, check_finite, check_nonnegative, check_positive
from ..surrogate import FastSigmoid, Surrogate, as_surrogate
from . import _hh_fused
from ._base import NeuronModel, full, input_current

__all__ = ["HodgkinHuxley", "HHState", "hh_rates"]

METHODS = ("rk4", "exp_euler")

# The surrogate sees the distance to `v_spike` in units of 10 mV: over one cycle v spans
# roughly -75..+40 mV, i.e. -7.5..4 in these units, so a neuron a few mV from threshold
# still receives a useful pseudo-derivative while one at rest receives almost none.
SPIKE_SCALE = 10.0  # [mV]

# exp(-(v + 35)/10), exp(-(v + 40)/10) and exp(-(v + 55)/10) are all exp(-(v + 65)/10) times
# one of these constants.
_E3 = math.exp(3.0)
_E2_5 = math.exp(2.5)
_E1 = math.e

# Newton iterations of `resting_state`; from -65 mV the default model converges in 3.
_NEWTON_STEPS = 30
_NEWTON_MAX_STEP = 20.0  # [mV], caps a Newton step where the I-V curve is nearly flat
_NEWTON_TOL = 1e-3  # [mV], size of the last Newton step accepted as converged
_INIT_SPREAD = 10.0  # [mV], width of the random initial voltages above rest (init_state, key)


class HHState(eqx.Module):
    """State of a `HodgkinHuxley` population."""

    v: Float[Array, "*batch n"]  # membrane potential [mV]
    m: Float[Array, "*batch n"]  # sodium activation, dimensionless in [0, 1]
    h: Float[Array, "*batch n"]  # sodium inactivation, dimensionless in [0, 1]
    n: Float[Array, "*batch n"]  # potassium activation, dimensionless in [0, 1]


def _bernoulli(x: Array, exp_minus_x: Array) -> tuple[Array, Array]:
    """`(num, den)` with `num / den = x / (1 - exp(-x))`, given `x` and `exp(-x)`.

    Both parts and their gradients are finite at the removable singularity `x = 0`. As
    `exp(-x)` is shared with other rates rather than computed by `expm1`, `1 - exp(-x)`
    cancels near `x = 0`; for `|x| < delta` the quotient is replaced by its Taylor series
    `1 + x/2 + x^2/12 - x^4/720 + x^6/30240` (over a denominator of 1). `delta` balances
    cancellation (relative error about eps / delta) against truncation (about
    delta^8 / 1209600): 0.5 in single precision (both below 1e-6), 0.01 in double precision
    (both below 1e-13).
    """
    delta = 0.5 if jnp.finfo(x.dtype).bits <= 32 else 0.01
    small = jnp.abs(x) < delta
    x2 = x * x
    series = 1.0 + 0.5 * x + x2 * (1.0 / 12.0 + x2 * (-1.0 / 720.0 + x2 * (1.0 / 30240.0)))
    # Double `where`: the quotient is never formed where the denominator vanishes, so
    # neither its value nor its gradient (0/0 at x = 0) can leak NaN into the result.
    return jnp.where(small, series, x), jnp.where(small, 1.0, 1.0 - exp_minus_x)


def _rate_terms(v: Array) -> tuple[Array, ...]:
    """The six rates as `(a_m, d_m, beta_m, alpha_h, d_h, a_n, d_n, beta_n)`.

    `alpha_m = a_m / d_m`, `beta_h = 1 / d_h` and `alpha_n = a_n / d_n`: returning
    numerators and denominators lets the integrators fold these divisions into others.
    The three exponentials with a 10 mV scale, `exp(-(v + 35)/10)`, `exp(-(v + 40)/10)` and
    `exp(-(v + 55)/10)`, are `exp(-(v + 65)/10)` times `e^3`, `e^2.5` and `e`, so four
    exponentials serve all six rates. (Deriving the 20 and 80 mV scales from it as well
    measured slower on CPU: XLA turns products of exponentials back into exponentials, and
    three square roots cost more than the two exponentials they would replace.)
    """
    u = v + 65.0
    e10 = jnp.exp(u * -0.1)
    a_m, d_m = _bernoulli((v + 40.0) * 0.1, _E2_5 * e10)
    a_n, d_n = _bernoulli((v + 55.0) * 0.1, _E1 * e10)
    beta_m = 4.0 * jnp.exp(u * (-1.0 / 18.0))
    alpha_h = 0.07 * jnp.exp(u * (-1.0 / 20.0))
    d_h = 1.0 + _E3 * e10
    beta_n = 0.125 * jnp.exp(u * (-1.0 / 80.0))
    return a_m, d_m, beta_m, alpha_h, d_h, 0.1 * a_n, d_n, beta_n


def hh_rates(v: Float[ArrayLike, "..."]) -> tuple[Float[Array, "..."], ...]:
    r"""Opening and closing rates of the Hodgkin-Huxley gates at membrane potential `v` [mV].

    Returns `(alpha_m, beta_m, alpha_h, beta_h, alpha_n, beta_n)` in 1/ms:

    $$\alpha_m = \frac{0.1 (v + 40)}{1 - e^{-(v + 40)/10}},\quad
      \beta_m = 4 e^{-(v + 65)/18},$$
    $$\alpha_h = 0.07 e^{-(v + 65)/20},\quad \beta_h = \frac{1}{1 + e^{-(v + 35)/10}},$$
    $$\alpha_n = \frac{0.01 (v + 55)}{1 - e^{-(v + 55)/10}},\quad
      \beta_n = 0.125 e^{-(v + 65)/80}.$$

    $\alpha_m$ and $\alpha_n$ have removable singularities at -40 and -55 mV (limits 1 and
    0.1 per ms); near them a Taylor branch takes over, so that value and gradient are finite
    there, in single and double precision. Four exponentials serve all six rates; in float32
    every rate is within about 1e-6 (relative) of its exact value.
    """
    v = jnp.asarray(v, dtype=jnp.result_type(v, float))
    a_m, d_m, beta_m, alpha_h, d_h, a_n, d_n, beta_n = _rate_terms(v)
    return a_m / d_m, beta_m, alpha_h, 1.0 / d_h, a_n / d_n, beta_n


def _phi(z: Array) -> Array:
    """`(1 - exp(-z)) / z` for `z >= 0`, equal to 1 (with slope -1/2) at `z = 0`."""
    small = z < 1e-4
    zs = jnp.where(small, 1.0, z)
    return jnp.where(small, 1.0 + z * (-0.5 + z * (1.0 / 6.0)), -jnp.expm1(-zs) / zs)


class HodgkinHuxley(NeuronModel):
    r"""Hodgkin-Huxley neuron: the squid giant axon model of Hodgkin and Huxley (1952).

    $$c_m \frac{dv}{dt} = I - g_{Na} m^3 h (v - e_{Na}) - g_K n^4 (v - e_K) - g_L (v - e_L)$$
    $$\frac{dx}{dt} = \alpha_x(v) (1 - x) - \beta_x(v) x, \qquad x \in \{m, h, n\}$$

    with the rate functions of `hh_rates`, written in the modern convention (membrane
    potential measured inside minus outside, rest near -65 mV) as in Gerstner et al. (2014),
    *Neuronal Dynamics*, ch. 2. The rates are fixed at the original 6.3 degC kinetics; the
    default parameters give a resting potential of -64.996 mV.

    **Integration** (`method`, the input `I` is held constant over each step):

    - `"rk4"`: classic fourth-order Runge-Kutta on `(v, m, h, n)` jointly. Global error
      O(dt^4) (spike times within 1e-4 ms of the exact solution after 100 ms at dt = 0.01
      ms). Being explicit, the step must resolve the fastest time constant at the spike
      peak (`c_m / (g_Na m^3 h)`, a few hundredths of a ms): dt = 0.05 ms is stable, dt = 0.1
      ms diverges at the first spike.
    - `"exp_euler"`: exponential Euler. Each gate is first advanced exactly with its rates
      frozen at the step's starting `v`, `x <- x_inf + (x - x_inf) exp(-dt (alpha_x +
      beta_x))`; then `v` is advanced exactly for the conductances of the *updated* gates
      held fixed, `v <- v_inf + (v - v_inf) exp(-dt g_tot / c_m)` with
      `g_tot = g_Na m^3 h + g_K n^4 + g_L` and `v_inf = (g_Na m^3 h e_Na + g_K n^4 e_K +
      g_L e_L + I) / g_tot`. Using the updated gates staggers gates and voltage by half a
      step, as NEURON does (Hines 1984): the measured spike-time error after 100 ms at
      10 uA/cm^2 falls as dt^2 (0.005, 0.03 and 0.12 ms at dt = 0.01, 0.025 and 0.05 ms),
      whereas the starting gates give a first-order 0.47 ms at dt = 0.01 ms. Every update
      is a contraction towards its steady state, so the scheme is stable (gates stay in
      [0, 1]) at any dt. The voltage update is evaluated as
      `v + dt/c_m phi(dt g_tot / c_m) (dv/dt)` with `phi(z) = (1 - e^{-z}) / z`, the same
      number without the cancellation in `v - v_inf`, and finite when every conductance is
      zero (where it reduces to Euler).

    **Cost.** Four exponentials give all six rates (`hh_rates`), and each derivative is
    written as a single quotient, so one RK4 step costs 16 exponentials and 16 divisions per
    neuron and one exponential-Euler step 7 exponentials, 1 `expm1` and 7 divisions, all
    elementwise. On CPU, `nj.simulate` runs a population with no input or a constant input
    and only spikes recorded in one compiled kernel that takes blocks of neurons through all
    steps on all of XLA's CPU threads (`fused_run`); it uses its own
    vectorised `exp`, so its numbers equal those of a scan over `step` to rounding (float32
    spike times within one step), not bit for bit.

    **Spikes.** A spike is an upward crossing of `v_spike` within the step:
    `s = H((v_new - v_spike) / 10 mV) (1 - H((v_old - v_spike) / 10 mV))`, dated at the end
    of the step. There is no reset: the model produces its own action potential. Each
    Heaviside `H` uses the model's `surrogate` for its gradient, so `s` is differentiable
    with respect to both voltages.

    **Units.** time ms, voltage mV, current density uA/cm^2, conductance density mS/cm^2,
    capacitance uF/cm^2 (so conductance / capacitance is 1/ms).

    Args:
        c_m: membrane capacitance [uF/cm^2], > 0.
        g_na: maximal sodium conductance [mS/cm^2], >= 0.
        g_k: maximal potassium conductance [mS/cm^2], >= 0.
        g_l: leak conductance [mS/cm^2], >= 0.
        e_na: sodium reversal potential [mV].
        e_k: potassium reversal potential [mV].
        e_l: leak reversal potential [mV].
        v_spike: voltage whose upward crossing counts as a spike [mV].
        method: `"rk4"` or `"exp_euler"` (static).
        surrogate: a `neurojax.surrogate.Surrogate` or its name (default fast sigmoid).

    Every numeric parameter may be a scalar or an array broadcastable to the population.

    Example:
    ```python
    import neurojax as nj
    hh = nj.HodgkinHuxley()
    state = hh.init_state(2)                # resting state, v = -64.996 mV
    final, rec = nj.simulate(hh, state, 10.0, dt=0.01, n_steps=10_000)
    rec.spikes.sum(axis=0)                  # spikes in 100 ms at 10 uA/cm^2: [7, 7]
    ```

    References:
        Hodgkin, A. L. and Huxley, A. F. (1952). A quantitative description of membrane
        current and its application to conduction and excitation in nerve. J. Physiol.
        117(4), 500-544.
        Hines, M. (1984). Efficient computation of branched nerve equations. Int. J.
        Bio-Medical Computing 15(1), 69-76.
        Gerstner, W., Kistler, W. M., Naud, R. and Paninski, L. (2014). Neuronal Dynamics.
        Cambridge University Press.
    """

    c_m: Float[Array, "..."] = eqx.field(default=1.0, converter=as_float)
    g_na: Float[Array, "..."] = eqx.field(default=120.0, converter=as_float)
    g_k: Float[Array, "..."] = eqx.field(default=36.0, converter=as_float)
    g_l: Float[Array, "..."] = eqx.field(default=0.3, converter=as_float)
    e_na: Float[Array, "..."] = eqx.field(default=50.0, converter=as_float)
    e_k: Float[Array, "..."] = eqx.field(default=-77.0, converter=as_float)
    e_l: Float[Array, "..."] = eqx.field(default=-54.387, converter=as_float)
    v_spike: Float[Array, "..."] = eqx.field(default=0.0, converter=as_float)
    method: str = eqx.field(default="rk4", static=True)
    surrogate: Surrogate = eqx.field(default_factory=FastSigmoid, converter=as_surrogate)

    def __check_init__(self):
        check_positive("HodgkinHuxley", "c_m", self.c_m, "uF/cm^2")
        check_nonnegative("HodgkinHuxley", "g_na", self.g_na, "mS/cm^2")
        check_nonnegative("HodgkinHuxley", "g_k", self.g_k, "mS/cm^2")
        check_nonnegative("HodgkinHuxley", "g_l", self.g_l, "mS/cm^2")
        check_finite("HodgkinHuxley", "e_na", self.e_na)
        check_finite("HodgkinHuxley", "e_k", self.e_k)
        check_finite("HodgkinHuxley", "e_l", self.e_l)
        check_finite("HodgkinHuxley", "v_spike", self.v_spike)
        check_choice("HodgkinHuxley", "method", self.method, METHODS)

    @staticmethod
    def gate_steady_state(v: Float[ArrayLike, "..."]) -> tuple[Float[Array, "..."], ...]:
        """Steady-state gates `(m_inf, h_inf, n_inf)` at a clamped voltage `v` [mV]."""
        am, bm, ah, bh, an, bn = hh_rates(v)
        return am / (am + bm), ah / (ah + bh), an / (an + bn)

    def steady_current(self, v: Float[ArrayLike, "..."]) -> Float[Array, "..."]:
        """Ionic current [uA/cm^2] at `v` [mV] with every gate at its steady state.

        The constant input that holds the membrane at `v` is exactly this current.
        """
        v = jnp.asarray(v, dtype=jnp.result_type(v, float))
        m, h, n = self.gate_steady_state(v)
        n2 = n * n
        return (
            self.g_na * (m * m * m * h) * (v - self.e_na)
            + self.g_k * (n2 * n2) * (v - self.e_k)
            + self.g_l * (v - self.e_l)
        )

    def resting_state(self, shape, current: Float[ArrayLike, "..."] = 0.0) -> HHState:
        """The equilibrium of a population of `shape` under a constant `current` [uA/cm^2].

        The equilibrium voltage solves `steady_current(v) = current`; it is found by Newton's
        method from -65 mV (steps capped at 20 mV, converged when the last step is below
        1e-3 mV, which takes 3 iterations for the default parameters), and the gates are set
        to their steady state there. Above the Hopf bifurcation (about 9.78 uA/cm^2 for the
        default parameters) the equilibrium still exists but is unstable.
        Raises (through `equinox.error_if`, also under `jit`) if Newton's method does not
        converge, for example when every conductance is zero.
        """
        shape = self._shape(shape)
        i = full(shape, current)

        def residual(v):
            return self.steady_current(v) - i

        def newton(v, _):
            # Elementwise function, so a JVP with ones gives every neuron its own slope.
            r, slope = jax.jvp(residual, (v,), (jnp.ones_like(v),))
            dv = jnp.clip(-r / slope, -_NEWTON_MAX_STEP, _NEWTON_MAX_STEP)
            return v + dv, dv

        v, dvs = jax.lax.scan(newton, full(shape, -65.0), None, length=_NEWTON_STEPS)
        bad = ~(jnp.abs(dvs[-1]) < _NEWTON_TOL)
        v = eqx.error_if(
            v,
            bad,
            "HodgkinHuxley: no resting potential found (Newton's method did not converge;"
            " check that the conductances are not all zero)",
        )
        m, h, n = self.gate_steady_state(v)
        return HHState(v=v, m=m, h=h, n=n)

    def init_state(self, shape, *, key: PRNGKeyArray | None = None) -> HHState:
        """Resting state (equilibrium at zero input) for a population of `shape`.

        With a `key`, each neuron instead starts at a voltage drawn uniformly in
        `[v_rest, v_rest + 10 mV)` with its gates at their steady state for that voltage, as if
        a depolarizing current had held it there until t = 0. For the default parameters such
        a population relaxes back to rest without spiking. (Depolarized starts only: a
        membrane released from 3.5 mV or more below rest fires a rebound, "anode break",
        spike.)
        """
        rest = self.resting_state(shape)
        if key is None:
            return rest
        v = rest.v + _INIT_SPREAD * jr.uniform(key, rest.v.shape, dtype=rest.v.dtype)
        m, h, n = self.gate_steady_state(v)
        return HHState(v=v, m=m, h=h, n=n)

    def _derivatives(self, v, m, h, n, i):
        a_m, d_m, beta_m, alpha_h, d_h, a_n, d_n, beta_n = _rate_terms(v)
        n2 = n * n
        i_ion = (
            self.g_na * (m * m * m * h) * (v - self.e_na)
            + self.g_k * (n2 * n2) * (v - self.e_k)
            + self.g_l * (v - self.e_l)
        )
        # Each derivative is one quotient, alpha (1 - x) - beta x brought over the
        # denominator of its alpha or beta: one division per variable.
        return (
            (i - i_ion) / self.c_m,
            (a_m * (1.0 - m) - beta_m * m * d_m) / d_m,
            (alpha_h * (1.0 - h) * d_h - h) / d_h,
            (a_n * (1.0 - n) - beta_n * n * d_n) / d_n,
        )

    def _rk4(self, y, i, dt):
        half = 0.5 * dt
        k1 = self._derivatives(*y, i)
        k2 = self._derivatives(*(a + half * k for a, k in zip(y, k1, strict=True)), i)
        k3 = self._derivatives(*(a + half * k for a, k in zip(y, k2, strict=True)), i)
        k4 = self._derivatives(*(a + dt * k for a, k in zip(y, k3, strict=True)), i)
        sixth = dt / 6.0
        return tuple(
            a + sixth * ((q1 + q4) + 2.0 * (q2 + q3))
            for a, q1, q2, q3, q4 in zip(y, k1, k2, k3, k4, strict=True)
        )

    def _exp_euler(self, y, i, dt):
        v, m, h, n = y
        a_m, d_m, beta_m, alpha_h, d_h, a_n, d_n, beta_n = _rate_terms(v)

        def gate(x, alpha, beta):
            k = alpha + beta  # > 0 for every finite v
            x_inf = alpha / k
            return x_inf + (x - x_inf) * jnp.exp(-dt * k)

        m = gate(m, a_m / d_m, beta_m)
        h = gate(h, alpha_h, 1.0 / d_h)
        n = gate(n, a_n / d_n, beta_n)
        n2 = n * n
        g_na = self.g_na * (m * m * m * h)
        g_k = self.g_k * (n2 * n2)
        g_tot = g_na + g_k + self.g_l
        dv_dt = i - g_na * (v - self.e_na) - g_k * (v - self.e_k) - self.g_l * (v - self.e_l)
        dt_c = dt / self.c_m
        v = v + dt_c * _phi(dt_c * g_tot) * dv_dt
        return v, m, h, n

    def step(self, state: HHState, current, dt: float) -> tuple[HHState, Float[Array, "..."]]:
        """Advance by `dt` ms under `current` [uA/cm^2] held over the step (`method`).

        Returns `(state, spikes)`: a spike (0.0/1.0, with the surrogate gradient) marks an
        upward crossing of `v_spike` during the step; there is no reset.
        """
        i = input_current(current, state.v)
        y = (state.v, state.m, state.h, state.n)
        if self.method == "rk4":
            v, m, h, n = self._rk4(y, i, dt)
        else:
            v, m, h, n = self._exp_euler(y, i, dt)
        scale = 1.0 / SPIKE_SCALE
        above_new = self.surrogate((v - self.v_spike) * scale)
        above_old = self.surrogate((state.v - self.v_spike) * scale)
        return HHState(v=v, m=m, h=h, n=n), above_new * (1.0 - above_old)

    def fused_run(
        self, state: HHState, inputs: Any, dt: float, n_rec: int, record_every: int, **options
    ) -> tuple[HHState, Any] | None:
        """The whole run in one call, for an uncoupled population with no input or one
        constant float input, spikes recorded as the bool raster or as counts (with state
        fields on a GPU) and none of `check`, `checkpoint`, `truncate_backprop`
        (`NeuronModel.fused_run` gives the arguments). On CPU one compiled kernel runs all
        steps on XLA's CPU threads, equal to the scan over `step` to rounding (float32 spike
        times within one step); elsewhere the scan itself. `None` for any other run."""
        if not _hh_fused.applies(self, state, inputs, record_every=record_every, **options):
            return None
        return _hh_fused.run(self, state, inputs, dt, n_rec, record_every, options["record"])
