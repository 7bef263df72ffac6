r"""Triplet spike-timing-dependent plasticity (Pfister and Gerstner 2006).

Each presynaptic neuron `i` carries two traces of its arrivals at the synapses, `r_1` (time
constant `tau_plus`) and `r_2` (`tau_x`); each postsynaptic neuron `j` carries two traces of
its spikes, `o_1` (`tau_minus`) and `o_2` (`tau_y`). Between events every trace decays
exponentially, `dr_1/dt = -r_1 / tau_plus` and so on. At the events:

- a presynaptic spike **arrives** at synapse `i -> j` at time `t`:
  $$w \leftarrow w - o_1(t)\,\big[A_2^- + A_3^-\, r_2(t - \epsilon)\big];$$
  then `r_1` and `r_2` take the spike;
- the postsynaptic neuron `j` **spikes** at time `t`:
  $$w \leftarrow w + r_1(t)\,\big[A_2^+ + A_3^+\, o_2(t - \epsilon)\big];$$
  then `o_1` and `o_2` take the spike.

`t - epsilon` means "before this spike is counted": the triplet terms pair a spike with the
earlier spikes of the same neuron, never with itself. With `pairing="all_to_all"` a trace
adds 1 per spike (every earlier spike counts); with `pairing="nearest"` it is reset to 1
(only the most recent spike counts), the two interaction schemes of the paper. With
`A_3^+ = A_3^- = 0` the rule is pair STDP (`nj.STDP` in its additive form).

This is exactly the `PlasticityRule` event order (`neurojax.plasticity._base`): `on_pre`
reads `r_2` before this step's arrivals and `o_1` before this step's postsynaptic spikes;
`on_post` reads `r_1` including this step's arrivals (a pair in the same step counts as pre
before post) and `o_2` before this step's postsynaptic spikes. Weights are clipped to
`[w_min, w_max]` after every event (hard bounds). On CPU the rule runs in the compiled
trace-rule kernel (`trace_kernel`, `neurojax/kernels/plastic_trace.cc`), elsewhere on the
generic event path; both compute the same operations.

References: J.-P. Pfister and W. Gerstner (2006), Triplets of spikes in a model of spike
timing-dependent plasticity, J. Neurosci. 26(38):9673-9682, eqs. 3-4 and Table 4 (the
parameter sets of `TripletSTDP.preset`). P. J. Sjostrom, G. G. Turrigiano and S. B. Nelson
(2001), Rate, timing, and cooperativity jointly determine cortical synaptic plasticity, Neuron
32:1149-1164 (the pairing-frequency data that the visual-cortex sets fit; the tests compare
every visual-cortex set with it, see `TripletSTDP`).
"""

import dataclasses
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._validation import as_float, check_choice, check_less, check_nonnegative, check_positive
from ._base import PlasticityRule, PlasticState, TraceKernel, redefines

__all__ = ["TripletSTDP", "TripletSTDPState", "TRIPLET_PRESETS"]

_PAIRINGS = ("all_to_all", "nearest")

TRIPLET_PRESETS: dict[str, dict[str, float | str]] = {
    "visual_cortex_all_to_all": dict(
        tau_x=101.0, tau_y=125.0, a2_plus=5e-10, a3_plus=6.2e-3, a2_minus=7e-3,
        a3_minus=2.3e-4, pairing="all_to_all",
    ),
    "visual_cortex_all_to_all_minimal": dict(
        tau_x=101.0, tau_y=125.0, a2_plus=0.0, a3_plus=6.5e-3, a2_minus=7.1e-3,
        a3_minus=0.0, pairing="all_to_all",
    ),
    "visual_cortex_nearest": dict(
        tau_x=714.0, tau_y=40.0, a2_plus=8.8e-11, a3_plus=5.3e-2, a2_minus=6.6e-3,
        a3_minus=3.1e-3, pairing="nearest",
    ),
    "visual_cortex_nearest_minimal": dict(
        tau_x=714.0, tau_y=40.0, a2_plus=0.0, a3_plus=5.2e-2, a2_minus=8e-3,
        a3_minus=0.0, pairing="nearest",
    ),
    "hippocampal_all_to_all": dict(
        tau_x=946.0, tau_y=27.0, a2_plus=6.1e-3, a3_plus=6.7e-3, a2_minus=1.6e-3,
        a3_minus=1.4e-3, pairing="all_to_all",
    ),
    "hippocampal_nearest": dict(
        tau_x=575.0, tau_y=47.0, a2_plus=4.6e-3, a3_plus=9.1e-3, a2_minus=3e-3,
        a3_minus=7.5e-9, pairing="nearest",
    ),
}  # fmt: skip
"""The parameter sets of Pfister and Gerstner (2006), Table 4, for `TripletSTDP.preset`:
`tau_plus = 16.8 ms` and `tau_minus = 33.7 ms` throughout (from Bi and Poo 1998), `tau_x`,
`tau_y` [ms] and the amplitudes per set. `"visual_cortex_*"` fit the pairing-frequency data
of Sjostrom et al. (2001), `"hippocampal_*"` the triplet and quadruplet data of Wang et al.
(2005); `"_all_to_all"` and `"_nearest"` are the two spike-interaction schemes. The
`"_minimal"` sets are the smallest models that fit (`A_3^- = 0`, and for the visual cortex
`A_2^+ = 0`); `tau_x` then has no effect and keeps the full set's value. Amplitudes are in
units of the paper's normalised weight."""


class TripletSTDPState(PlasticState):
    """The plastic state of a projection under `nj.TripletSTDP`: a `PlasticState` whose
    traces are also named after the paper.

    Attributes:
        weights: current weights, `(*batch, nnz)` in the projection's CSR order.
        pre_traces: `(r1, r2)`, `(*batch, n_pre)` each.
        post_traces: `(o1, o2)`, `(*batch, n_post)` each.
        history: presynaptic spikes of the last `d` steps for a delay of `d` steps, or None.
    """

    @property
    def r1(self) -> Float[Array, "*batch n_pre"]:
        """Fast presynaptic trace (`tau_plus`)."""
        return self.pre_traces[0]

    @property
    def r2(self) -> Float[Array, "*batch n_pre"]:
        """Slow presynaptic trace (`tau_x`)."""
        return self.pre_traces[1]

    @property
    def o1(self) -> Float[Array, "*batch n_post"]:
        """Fast postsynaptic trace (`tau_minus`)."""
        return self.post_traces[0]

    @property
    def o2(self) -> Float[Array, "*batch n_post"]:
        """Slow postsynaptic trace (`tau_y`)."""
        return self.post_traces[1]


class TripletSTDP(PlasticityRule):
    r"""Triplet STDP of Pfister and Gerstner (2006), as a projection's `plasticity`.

    Depression at a presynaptic arrival, `w -= o_1 (A_2^- + A_3^- r_2)`, potentiation at a
    postsynaptic spike, `w += r_1 (A_2^+ + A_3^+ o_2)`, with exponentially decaying traces
    `r_1` (`tau_plus`), `r_2` (`tau_x`), `o_1` (`tau_minus`), `o_2` (`tau_y`) that add 1
    per spike (`pairing="all_to_all"`) or are reset to 1 (`pairing="nearest"`); the slow
    traces in the triplet terms are read before the current spike is counted. See the module
    docstring for the equations and the event order.

    Args:
        a2_plus: pair potentiation amplitude `A_2^+` (weight units), >= 0.
        a3_plus: triplet potentiation amplitude `A_3^+` (weight units), >= 0.
        a2_minus: pair depression amplitude `A_2^-` (weight units), >= 0.
        a3_minus: triplet depression amplitude `A_3^-` (weight units), >= 0.
        tau_plus: time constant of `r_1` [ms], > 0.
        tau_minus: time constant of `o_1` [ms], > 0.
        tau_x: time constant of `r_2` [ms], > 0.
        tau_y: time constant of `o_2` [ms], > 0.
        w_min: lower weight bound, `< w_max`.
        w_max: upper weight bound.
        pairing: `"all_to_all"` or `"nearest"`.

    Defaults are the paper's visual-cortex all-to-all set; `TripletSTDP.preset(name)` gives
    every set of its Table 4 (`TRIPLET_PRESETS`). Numeric parameters are array leaves
    (`jax.vmap`, `jax.grad`).

    Example:
    ```python
    rule = nj.TripletSTDP.preset("hippocampal_all_to_all", w_max=2.0)
    proj = nj.Projection("in", "out", conn, synapse=nj.Exponential(5.0), plasticity=rule)
    ```

    Checked against data: with each visual-cortex set, 60 pairings (+10 and -10 ms) at 0.1,
    10, 20, 40 and 50 Hz change a weight of 1 by amounts within 1.3 SEM of the means of
    Sjostrom et al. (2001) at every point (`tests/test_triplet_stdp.py`, values as tabulated
    in the VH-Lab toolbox, `+vlt/+neuro/+stdp/sjostrom_freq_stdp.m`); for example
    `"visual_cortex_all_to_all"` gives +0.13 and -0.33 at 10 Hz (data +0.14 +- 0.10 and
    -0.41 +- 0.11) and +0.74 and +0.73 at 50 Hz (data +0.56 +- 0.26 and +0.75 +- 0.19). The
    hippocampal sets were fitted to other data (Wang et al. 2005) and do not fit these.

    References: Pfister, J.-P. and Gerstner, W. (2006), J. Neurosci. 26:9673-9682.
    Sjostrom, P. J., Turrigiano, G. G. and Nelson, S. B. (2001), Neuron 32:1149-1164.
    """

    a2_plus: Float[Array, ""] = eqx.field(default=5e-10, converter=as_float)
    a3_plus: Float[Array, ""] = eqx.field(default=6.2e-3, converter=as_float)
    a2_minus: Float[Array, ""] = eqx.field(default=7e-3, converter=as_float)
    a3_minus: Float[Array, ""] = eqx.field(default=2.3e-4, converter=as_float)
    tau_plus: Float[Array, ""] = eqx.field(default=16.8, converter=as_float)
    tau_minus: Float[Array, ""] = eqx.field(default=33.7, converter=as_float)
    tau_x: Float[Array, ""] = eqx.field(default=101.0, converter=as_float)
    tau_y: Float[Array, ""] = eqx.field(default=125.0, converter=as_float)
    w_min: Float[Array, ""] = eqx.field(default=0.0, converter=as_float)
    w_max: Float[Array, ""] = eqx.field(default=1.0, converter=as_float)
    pairing: str = eqx.field(default="all_to_all", static=True)

    n_pre_traces: ClassVar[int] = 2
    n_post_traces: ClassVar[int] = 2
    state_class: ClassVar[type[PlasticState]] = TripletSTDPState

    def __check_init__(self):
        check_choice("TripletSTDP", "pairing", self.pairing, _PAIRINGS)
        for name in ("a2_plus", "a3_plus", "a2_minus", "a3_minus"):
            check_nonnegative("TripletSTDP", name, getattr(self, name))
        for name in ("tau_plus", "tau_minus", "tau_x", "tau_y"):
            check_positive("TripletSTDP", name, getattr(self, name), "ms")
        check_less("TripletSTDP", "w_min", self.w_min, "w_max", self.w_max)
        for name in (
            "a2_plus", "a3_plus", "a2_minus", "a3_minus", "tau_plus", "tau_minus", "tau_x",
            "tau_y", "w_min", "w_max",
        ):  # fmt: skip
            if getattr(self, name).ndim:
                raise ValueError(
                    f"TripletSTDP: {name} must be a scalar, got shape {getattr(self, name).shape}"
                )

    @classmethod
    def preset(cls, name: str, **overrides) -> "TripletSTDP":
        """The rule with a parameter set of Pfister and Gerstner (2006), Table 4
        (`TRIPLET_PRESETS`: `"visual_cortex_all_to_all"`, `"visual_cortex_nearest"`, their
        `"_minimal"` versions, `"hippocampal_all_to_all"`, `"hippocampal_nearest"`);
        `overrides` replace any parameter: the sets fix the amplitudes and time constants
        only, so the bounds are the defaults `[w_min, w_max] = [0, 1]` unless given, e.g.
        `TripletSTDP.preset("hippocampal_all_to_all", w_max=2.0)` for weights up to 2."""
        if name not in TRIPLET_PRESETS:
            raise ValueError(
                f"TripletSTDP.preset: unknown name {name!r}; choose one of "
                f"{sorted(TRIPLET_PRESETS)}"
            )
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise TypeError(
                f"TripletSTDP.preset: unknown parameter(s) {unknown}; overrides may be any of "
                f"{fields}"
            )
        try:
            return cls(**{**TRIPLET_PRESETS[name], **overrides})
        except ValueError as err:
            bounds = {k: overrides.get(k, getattr(cls, k)) for k in ("w_min", "w_max")}
            raise ValueError(
                f"TripletSTDP.preset({name!r}): {err}; the bounds asked for are [w_min, w_max] "
                f"= [{float(bounds['w_min'])}, {float(bounds['w_max'])}] (a preset keeps the "
                "defaults [0, 1]): preset(name, w_min=..., w_max=...) takes both (and any other "
                "parameter) as overrides"
            ) from None

    def _trace(self, trace, spikes):
        if self.pairing == "nearest":
            return jnp.where(spikes > 0, jnp.ones_like(trace), trace)
        return trace + spikes

    def trace_decays(self, dt: float):
        """`((e^{-dt/tau_plus}, e^{-dt/tau_x}), (e^{-dt/tau_minus}, e^{-dt/tau_y}))`."""
        return (
            (jnp.exp(-dt / self.tau_plus), jnp.exp(-dt / self.tau_x)),
            (jnp.exp(-dt / self.tau_minus), jnp.exp(-dt / self.tau_y)),
        )

    def update_pre_traces(self, traces, spikes):
        """`r_1`, `r_2` after this step's arrivals (+1, or set to 1 with `nearest`)."""
        return tuple(self._trace(t, spikes) for t in traces)

    def update_post_traces(self, traces, spikes):
        """`o_1`, `o_2` after this step's spikes (+1, or set to 1 with `nearest`)."""
        return tuple(self._trace(t, spikes) for t in traces)

    def on_pre(self, w, pre, post, s):
        """Depression at an arrival: `w - o_1 (A_2^- + A_3^- r_2)`, clipped."""
        return self.clip(w - post[0] * (self.a2_minus + self.a3_minus * pre[1]) * s)

    def on_post(self, w, pre, post, s):
        """Potentiation at a postsynaptic spike: `w + r_1 (A_2^+ + A_3^+ o_2)`, clipped."""
        return self.clip(w + pre[0] * (self.a2_plus + self.a3_plus * post[1]) * s)

    def trace_kernel(self) -> TraceKernel | None:
        """This rule's parameters for the compiled trace-rule kernel (`kind="triplet"`); None
        for a subclass that redefines an event or trace method (the generic event path then
        runs it)."""
        if redefines(self, TripletSTDP, _KERNEL_METHODS):
            return None
        return TraceKernel(
            kind="triplet",
            a_pre=self.a2_minus,
            b_pre=self.a3_minus,
            a_post=self.a2_plus,
            b_post=self.a3_plus,
            w_min=self.w_min,
            w_max=self.w_max,
            nearest=self.pairing == "nearest",
        )


_KERNEL_METHODS = (
    "_trace",
    "clip",
    "trace_decays",
    "update_pre_traces",
    "update_post_traces",
    "on_pre",
    "on_post",
    "dense_update",
    "pair_kernel",
)
