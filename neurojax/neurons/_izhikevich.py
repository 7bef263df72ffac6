"""Izhikevich's simple model of spiking neurons (quadratic integrate-and-fire with recovery)."""

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import equinox as eqx
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, Float, PRNGKeyArray

from .._validation import as_float, check_choice, check_finite, check_less
from ..surrogate import FastSigmoid, Surrogate, as_surrogate
from ._base import NeuronModel, full, input_current

__all__ = ["Izhikevich", "IzhikevichState"]

_METHODS = ("euler", "published", "spnet")


class IzhikevichState(eqx.Module):
    """State of an `Izhikevich` population."""

    v: Float[Array, "*batch n"]  # membrane potential ["mV", the model's own scale]
    u: Float[Array, "*batch n"]  # recovery variable [same scale as the input]


class Izhikevich(NeuronModel):
    r"""Izhikevich's simple spiking neuron (Izhikevich 2003).

    $$\frac{dv}{dt} = 0.04 v^2 + 5 v + 140 - u + I, \qquad \frac{du}{dt} = a (b v - u)$$

    and when $v \ge v_{peak}$: $v \leftarrow c$, $u \leftarrow u + d$.

    **Units.** The model uses its own convention: `v` reads as millivolts and time is in
    milliseconds (the coefficients 0.04, 5 and 140 were fitted so that `v` looks like a cortical
    membrane potential in mV with `t` in ms), while the input `I` and the recovery variable `u`
    are dimensionless numbers on the scale of `dv/dt` (mV/ms). `a` is a rate [1/ms], `b` is
    dimensionless, `c` and `v_peak` are in "mV", `d` is on the scale of `u`.

    **Integration** (`method`, static):

    - `"euler"` (default): forward Euler of both equations from the old `(v, u)`, then
      threshold and reset. First order; at `dt = 0.005 ms` it reproduces the spike counts of an
      accurate solve (see Accuracy).
    - `"published"`: the scheme of the MATLAB code that produced the figures of Izhikevich
      (2004): `v` is advanced first, then `u` is advanced with the *new* `v`
      (`u += dt a (b v_new - u)`), then threshold and reset. It is a semi-implicit Euler that is
      the reference for the published figures (step 0.25 ms) and reproduces their spike times
      exactly in float64 (in float32, rounding of `u` moves a spike of the FS figure by one
      step after six spikes).
    - `"spnet"`: the scheme of the author's network programs (spnet.m, Izhikevich 2003;
      daspnet.m, Izhikevich 2007), which run at `dt = 1 ms`: `v` is advanced in two Euler half
      steps of `dt / 2` with `u` and the input held, "for numerical stability", then `u` with
      the new `v` as in `"published"`. At `dt = 1` a single step overshoots the upswing of the
      quadratic term: in the distal-reward network of Izhikevich (2007) it raises the firing
      rates by about 12 % against the program (benchmarks/RESULTS.md, "Distal reward").

    **Order within a step.** (1) integrate with the input held constant over the step;
    (2) a neuron with `v >= v_peak` emits a spike; (3) it is reset: `v = c`, `u = u + d`.
    The spike is emitted by the step from `t` to `t + dt`, so `neurojax.simulate` dates it
    `t + dt`; the figure code dates the same spike by the loop time at the start of the
    iteration, `t`. To reproduce a figure, use `method="published"`, an input function
    evaluated at the start of the step (as `simulate` does) and subtract `dt` from the recorded
    spike times.

    **Surrogate.** The spike is `H((v - v_peak) / (v_peak - c))`. Reset and the jump of `u`
    are detached from the gradient (as in `LIF`): the surrogate gradient reaches a loss through
    the spike output, and between spikes gradients are those of the exact dynamics.

    **Stability.** The Euler step of the quadratic term is stable around a resting point `v*`
    only for `dt < 2 / |0.08 v* + 5|` (the local decay rate of the linearised `v` equation):
    about 3 ms at the resting potential of RS cells (-70) but smaller under strong
    hyperpolarising input (0.18 ms at `v = -200`). Beyond it the resting state gives way to
    a spurious oscillation of the Euler map between two values around `v*`, whose amplitude
    grows with `dt`; further on `v` is thrown out of the basin of rest and the spikes are
    numerical artefacts, and under extreme inputs `v^2` can overflow to `inf`/`nan`. Nothing
    is clipped (`neurojax.simulate(..., check=True)` reports non-finite values). The
    accuracy of spike times needs much smaller steps than stability does (see Accuracy).

    **Accuracy.** Results depend on the scheme. At a constant `I = 10` for 1 s from
    `v = -65`, `u = b v`, an accurate solve gives 23 spikes for RS (steady ISI 44.8 ms) and
    137 for FS (7.34 ms); `"euler"` matches those counts at `dt = 0.005 ms` (the FS count drops
    to 136 at 0.01 ms). The published step of 0.25 ms is coarse: its FS cell fires visibly
    more slowly than the accurate solve.

    Args:
        a: time scale of the recovery variable [1/ms].
        b: sensitivity of the recovery to sub-threshold `v` [dimensionless].
        c: after-spike reset value of `v` ["mV"], < `v_peak`.
        d: after-spike increment of `u`.
        v_peak: spike cutoff ["mV"] (30 in the papers).
        method: `"euler"`, `"published"` or `"spnet"` (see Integration).
        surrogate: a `neurojax.surrogate.Surrogate` or its name (default fast sigmoid).

    Every parameter may be a scalar or an array broadcastable to the population. The
    published cell classes are available through `Izhikevich.preset(name)`.

    Example:
    ```python
    import neurojax as nj
    import jax.numpy as jnp
    rs = nj.Izhikevich.preset("RS")
    state = rs.init_state(3)
    final, rec = nj.simulate(rs, state, jnp.array([5.0, 10.0, 15.0]), dt=0.1, n_steps=10_000)
    rec.spikes.sum(axis=0)   # [11, 23, 34] spikes in 1 s

    # The FS panel of Izhikevich (2004): float64 reproduces the figure code's spike times.
    import jax
    with jax.enable_x64(True):
        fs = nj.Izhikevich.preset("FS", method="published")
        v0 = jnp.array([-70.0])
        state = nj.IzhikevichState(v=v0, u=fs.b * v0)
        drive = lambda t, i: jnp.where(t > 15.0, 10.0, 0.0)
        _, rec = nj.simulate(fs, state, drive, dt=0.25, n_steps=601)
        rec.t[rec.spikes[:, 0]] - 0.25   # 19.0, 24.0, 31.5, ... (15 spikes)
    ```

    References:
        E. M. Izhikevich, "Simple model of spiking neurons", IEEE Trans. Neural Netw. 14:1569
        (2003). E. M. Izhikevich, "Which model to use for cortical spiking neurons?", IEEE
        Trans. Neural Netw. 15:1063 (2004).
    """

    a: Float[Array, "..."] = eqx.field(default=0.02, converter=as_float)
    b: Float[Array, "..."] = eqx.field(default=0.2, converter=as_float)
    c: Float[Array, "..."] = eqx.field(default=-65.0, converter=as_float)
    d: Float[Array, "..."] = eqx.field(default=8.0, converter=as_float)
    v_peak: Float[Array, "..."] = eqx.field(default=30.0, converter=as_float)
    method: str = eqx.field(default="euler", static=True)
    surrogate: Surrogate = eqx.field(default_factory=FastSigmoid, converter=as_surrogate)

    # (a, b, c, d) of the cell classes of Izhikevich (2003), Fig. 2.
    PRESETS: ClassVar[Mapping[str, tuple[float, float, float, float]]] = MappingProxyType(
        {
            "RS": (0.02, 0.2, -65.0, 8.0),  # regular spiking (cortical excitatory)
            "IB": (0.02, 0.2, -55.0, 4.0),  # intrinsically bursting
            "CH": (0.02, 0.2, -50.0, 2.0),  # chattering (fast rhythmic bursting)
            "FS": (0.1, 0.2, -65.0, 2.0),  # fast spiking (cortical inhibitory)
            "LTS": (0.02, 0.25, -65.0, 2.0),  # low-threshold spiking
            "TC": (0.02, 0.25, -65.0, 0.05),  # thalamo-cortical
            "RZ": (0.1, 0.26, -65.0, 2.0),  # resonator
        }
    )

    def __check_init__(self):
        check_choice("Izhikevich", "method", self.method, _METHODS)
        check_finite("Izhikevich", "a", self.a)
        check_finite("Izhikevich", "b", self.b)
        check_finite("Izhikevich", "c", self.c)
        check_finite("Izhikevich", "d", self.d)
        check_finite("Izhikevich", "v_peak", self.v_peak)
        check_less("Izhikevich", "c", self.c, "v_peak", self.v_peak)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "Izhikevich":
        """A published cell class: `"RS"`, `"IB"`, `"CH"`, `"FS"`, `"LTS"`, `"TC"` or `"RZ"`.

        The name is case-insensitive. Keyword `overrides` replace any constructor argument,
        for example `Izhikevich.preset("FS", method="published")` or
        `Izhikevich.preset("RS", d=jnp.array([8.0, 6.0]))`.
        """
        key = name.upper() if isinstance(name, str) else name
        if key not in cls.PRESETS:
            raise ValueError(
                f"Izhikevich.preset: name must be one of {tuple(cls.PRESETS)}, got {name!r}"
            )
        allowed = ("a", "b", "c", "d", "v_peak", "method", "surrogate")
        unknown = sorted(set(overrides) - set(allowed))
        if unknown:
            raise TypeError(f"Izhikevich.preset: unknown override(s) {unknown}; allowed: {allowed}")
        a, b, c, d = cls.PRESETS[key]
        return cls(**{"a": a, "b": b, "c": c, "d": d, **overrides})

    def init_state(self, shape, *, key: PRNGKeyArray | None = None) -> IzhikevichState:
        """State for a population of `shape`: `v = c`, `u = b v`.

        With a `key`, `v` is drawn uniformly in `[c, v_peak)` (so that neurons start at
        random phases of their firing cycle; those drawn above the unstable fixed point fire
        within the first few ms) and `u = b v` for each drawn `v`.
        """
        shape = self._shape(shape)
        if key is None:
            v = full(shape, self.c)
        else:
            r = jr.uniform(key, shape, dtype=self.c.dtype)
            v = self.c + r * (self.v_peak - self.c)
        return IzhikevichState(v=v, u=self.b * v)

    def step(self, state: IzhikevichState, current, dt: float):
        """Advance by `dt` ms under the input `current` (the model's units) held over the step.

        Integrate `(v, u)` with `method`, then spike where `v >= v_peak` and reset
        (`v = c`, `u += d`); returns `(state, spikes)`, spikes 0.0/1.0 with the surrogate
        gradient.
        """
        i = input_current(current, state.v)
        v, u = state.v, state.u

        def dv(x):
            return 0.04 * x * x + 5.0 * x + 140.0 - u + i

        if self.method == "spnet":
            v_half = v + 0.5 * dt * dv(v)
            v_new = v_half + 0.5 * dt * dv(v_half)
        else:
            v_new = v + dt * dv(v)
        # Which v drives the recovery update: the new one except in forward Euler.
        v_u = v if self.method == "euler" else v_new
        u_new = u + dt * self.a * (self.b * v_u - u)
        s = self.surrogate((v_new - self.v_peak) / (self.v_peak - self.c))
        # Detached reset (see LIF): a blend would leak the surrogate's pseudo-derivative into
        # v at every step, even far below threshold, biasing sub-threshold gradients.
        fired = s > 0
        v_out = jnp.where(fired, self.c, v_new)
        u_out = jnp.where(fired, u_new + self.d, u_new)
        return IzhikevichState(v=v_out, u=u_out), s
