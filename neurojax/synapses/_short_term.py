r"""Short-term synaptic plasticity: the Tsodyks-Markram model of depression and facilitation."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._validation import (
    NamesBadParameters,
    _fmt,
    as_float,
    check_nonnegative,
    check_positive,
    is_concrete,
)
from ..kernels import Example, Fold, Kernel, call, register
from ._base import ShortTermRule

__all__ = ["TsodyksMarkram", "TsodyksMarkramState"]


class TsodyksMarkramState(eqx.Module):
    """State of `TsodyksMarkram` short-term plasticity, one entry per presynaptic neuron.

    The variables are stored as they stood just after the neuron's last spike (or at the
    start of the run), together with the time of that event; between events they relax in
    closed form (see `TsodyksMarkram`), so nothing is integrated on steps without a spike.
    """

    u: Float[Array, "*batch n_pre"]  # utilisation u just after the last event (dimensionless)
    r: Float[Array, "*batch n_pre"]  # available resources R just after the last event
    last: Int[Array, "*batch n_pre"]  # time of the last event in steps (time = last * dt)


class TsodyksMarkram(ShortTermRule, metaclass=NamesBadParameters):
    r"""Tsodyks-Markram short-term depression and facilitation of a projection.

    Given to a projection as `nj.Projection(..., short_term=nj.TsodyksMarkram(...))`. Every
    presynaptic neuron has a fraction of available resources $R$ and a utilisation $u$
    (Tsodyks, Pawelzik and Markram 1998, eqs. 2.1-2.2):

    $$\frac{dR}{dt} = \frac{1 - R}{\tau_{rec}} - u^+ R^-\,\delta(t - t_{sp}), \qquad
      \frac{du}{dt} = -\frac{u}{\tau_{facil}} + U (1 - u^-)\,\delta(t - t_{sp}).$$

    **Order at a spike** (as in Tsodyks et al. 1998 and Markram, Wang and Tsodyks 1998):
    first $u$ jumps, $u^+ = u^- + U (1 - u^-)$; then the fraction $u^+ R^-$ of the resources
    is released, and the spike delivers $w_{ij}\, u^+ R^-$ through every synapse $(i, j)$ of
    the projection; finally $R^+ = R^- (1 - u^+)$. With $\tau_{facil} = 0$ (no
    facilitation) $u^- = 0$ and every spike uses $u^+ = U$: pure depression (Tsodyks and
    Markram 1997). A first spike from rest delivers $U w$.

    **Between spikes** the variables relax exactly over the elapsed time $\Delta$ since the
    neuron's previous spike: $u^- = u^+_{prev} e^{-\Delta/\tau_{facil}}$ and
    $R^- = 1 - (1 - R^+_{prev}) e^{-\Delta/\tau_{rec}}$. The state keeps the values just after
    the last spike and its time (`TsodyksMarkramState`), so the result is exact for any
    `dt` (spike times are the grid times), and a step costs work only for the neurons that
    spike in it (a scan of the spike vector finds them; see `release`), as in an
    event-driven simulator; the delivery itself stays event-driven (the 0/1 spike of a
    neuron is replaced by its release $u^+ R^-$).

    **Delays.** The release is computed when the presynaptic neuron spikes and travels with
    the spike through the projection's delay, as in NEST's `tsodyks_synapse` (the weight of a
    spike event is set when it is sent).

    **Steady state of a regular train** of period $T$ (used in the tests): with
    $E_F = e^{-T/\tau_{facil}}$ and $E_R = e^{-T/\tau_{rec}}$,
    $u^+_\infty = U / (1 - (1 - U) E_F)$ and
    $R^-_\infty = (1 - E_R) / (1 - (1 - u^+_\infty) E_R)$.

    Presets (`TsodyksMarkram.preset(name)`), the parameter sets of Tsodyks, Pawelzik and
    Markram (1998), Fig. 1 (used by NEST's `tsodyks_depressing.py` and
    `tsodyks_facilitating.py` examples), fitted to the depressing pyramidal-pyramidal and
    facilitating pyramidal-interneuron synapses of Markram, Wang and Tsodyks (1998):
    - `"depressing"`: $U = 0.5$, $\tau_{rec} = 800$ ms, $\tau_{facil} = 0$;
    - `"facilitating"`: $U = 0.03$, $\tau_{rec} = 130$ ms, $\tau_{facil} = 530$ ms.

    Args:
        u: utilisation increment $U$ (release probability of a rested synapse), in (0, 1];
            a scalar or one value per presynaptic neuron.
        tau_rec: recovery time constant of the resources [ms], > 0.
        tau_facil: decay time constant of the facilitation [ms], >= 0 (0: no facilitation).
            Its gradient is that of $e^{-\Delta/\tau_{facil}}$; at exactly 0 it is 0.

    Differentiable with respect to `u`, `tau_rec` and `tau_facil` (take `jax.grad` of a
    function of the network or projection), to the weights and, through the spikes'
    surrogate gradients, to the inputs.

    Example:
    ```python
    stp = nj.TsodyksMarkram.preset("depressing")
    proj = nj.Projection("A", "B", conn, synapse=nj.Exponential(3.0), short_term=stp)
    ```

    References:
        Tsodyks M, Pawelzik K, Markram H (1998). Neural networks with dynamic synapses.
        Neural Computation 10:821-835.
        Markram H, Wang Y, Tsodyks M (1998). Differential signaling via the same axon of
        neocortical pyramidal neurons. PNAS 95:5323-5328.
        Tsodyks M, Markram H (1997). The neural code between neocortical pyramidal neurons
        depends on neurotransmitter release probability. PNAS 94:719-723.
    """

    PRESETS: ClassVar[dict[str, tuple[float, float, float]]] = {
        "depressing": (0.5, 800.0, 0.0),
        "facilitating": (0.03, 130.0, 530.0),
    }

    u: Float[Array, "..."] = eqx.field(default=0.5, converter=as_float)
    tau_rec: Float[Array, "..."] = eqx.field(default=800.0, converter=as_float)
    tau_facil: Float[Array, "..."] = eqx.field(default=0.0, converter=as_float)

    def __check_init__(self):
        if is_concrete(self.u):
            a = np.asarray(self.u)
            if not np.all(np.isfinite(a) & (a > 0) & (a <= 1)):
                bad = a if a.ndim == 0 else a[~(np.isfinite(a) & (a > 0) & (a <= 1))]
                raise ValueError(f"TsodyksMarkram: u must be in (0, 1], got {_fmt(bad)}")
        check_positive("TsodyksMarkram", "tau_rec", self.tau_rec, "ms")
        check_nonnegative("TsodyksMarkram", "tau_facil", self.tau_facil, "ms")
        for name in ("u", "tau_rec", "tau_facil"):
            if getattr(self, name).ndim > 1:
                raise ValueError(
                    f"TsodyksMarkram: {name} must be a scalar or one value per presynaptic "
                    f"neuron (1-D), got shape {getattr(self, name).shape}"
                )

    def check_invariants(self, owner: str = "TsodyksMarkram.check_invariants", *, thorough=True):
        """The constructor's ranges on traced parameters (an edit inside the caller's `jit`
        or `grad`): one `(bad, message)` flag per parameter, read when the run executes
        (concrete values are checked by `__check_init__`, which `nj.simulate` and `nj.load`
        run again)."""
        rules = (
            ("u", lambda x: ~((x > 0) & (x <= 1)), "in (0, 1]"),
            ("tau_rec", lambda x: ~(x > 0), "> 0 ms"),
            ("tau_facil", lambda x: ~(x >= 0), ">= 0 ms"),
        )
        return [
            (jnp.any(bad(getattr(self, name))), f"{owner}: TsodyksMarkram: {name} must be {rule}")
            for name, bad, rule in rules
            if not is_concrete(getattr(self, name))
        ]

    @classmethod
    def preset(cls, name: str) -> "TsodyksMarkram":
        """The `"depressing"` or `"facilitating"` parameters (see the class docstring)."""
        if name not in cls.PRESETS:
            raise ValueError(
                f"TsodyksMarkram.preset: name must be one of {tuple(cls.PRESETS)}, got {name!r}"
            )
        u, tau_rec, tau_facil = cls.PRESETS[name]
        return cls(u=u, tau_rec=tau_rec, tau_facil=tau_facil)

    def check_size(self, owner: str, n_pre: int) -> None:
        """Raise `ValueError` unless every per-neuron parameter has `n_pre` entries."""
        for name in ("u", "tau_rec", "tau_facil"):
            value = getattr(self, name)
            if value.ndim == 1 and value.shape[0] != n_pre:
                raise ValueError(
                    f"{owner}: short_term.{name} has {value.shape[0]} values but the "
                    f"presynaptic population has {n_pre} neurons (give a scalar or {n_pre})"
                )

    def init_state(self, shape: int | tuple[int, ...]) -> TsodyksMarkramState:
        """Rested synapses (`u = 0`, `R = 1`) for `shape` presynaptic neurons (batch first)."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dtype = self.u.dtype
        return TsodyksMarkramState(
            u=jnp.zeros(shape, dtype), r=jnp.ones(shape, dtype), last=jnp.zeros(shape, jnp.int32)
        )

    def release(
        self,
        state: TsodyksMarkramState,
        spikes: Float[Array, "*batch n_pre"],
        step: Int[Array, ""],
        dt: float,
    ) -> tuple[TsodyksMarkramState, Float[Array, "*batch n_pre"]]:
        """The spikes emitted during `step` (dated at its end, time `(step + 1) dt`): the
        new state and, per presynaptic neuron, `spike * u+ R-`, the value its synapses
        deliver (0 without a spike).

        Only the neurons that spike are touched: on the CPU the compiled kernel
        `stp_release` (`nj.kernels.registry()`) scans the spikes and relaxes, releases and
        updates those neurons alone, so a silent neuron costs the scan only; the pure-JAX
        reference (other platforms, `nj.kernels.use("reference")`, and the derivative)
        computes the same formulas elementwise. A 0/1 spike enters the new state as a blend
        `s x_new + (1 - s) x_old`, so its surrogate gradient reaches the state too.
        """
        dtype = state.u.dtype
        tau_f = self.tau_facil.astype(dtype)
        facil = tau_f > 0
        # Rates instead of time constants: one division per parameter, not per spike.
        # tau_facil = 0 is an infinite rate (the elapsed time is >= one step, so the decay is
        # exactly 0), and the division only where tau_facil > 0 keeps the gradient finite.
        rate_f = jnp.where(facil, 1 / jnp.where(facil, tau_f, 1), jnp.inf)
        rate_r = 1 / self.tau_rec.astype(dtype)
        # The kernel takes one shape for the spikes and the state (trials x neurons).
        try:
            shape = jnp.broadcast_shapes(spikes.shape, state.u.shape)
        except ValueError:
            raise ValueError(
                f"TsodyksMarkram.release: spikes of shape {spikes.shape} do not match the "
                f"state's {state.u.shape} (batch axes first, then one entry per presynaptic "
                "neuron)"
            ) from None
        full = lambda x: jnp.broadcast_to(x, shape)  # noqa: E731
        u, r, last, release = call(
            STP_RELEASE,
            full(spikes.astype(dtype)),
            jnp.asarray(step, jnp.int32),
            full(state.u),
            full(state.r),
            full(state.last),
            self.u.astype(dtype).reshape(-1),
            rate_r.reshape(-1),
            rate_f.reshape(-1),
            jnp.asarray(dt, dtype).reshape(1),
        )
        return TsodyksMarkramState(u=u, r=r, last=last), release

    def steady_state(self, period: float) -> tuple[jax.Array, jax.Array]:
        """`(u+, R-)` at the spikes of a regular train of period `period` [ms] once it has
        settled (see the class docstring): the release of each spike is their product."""
        e_f = jnp.where(
            self.tau_facil > 0,
            jnp.exp(-period / jnp.where(self.tau_facil > 0, self.tau_facil, 1)),
            0,
        )
        e_r = jnp.exp(-period / self.tau_rec)
        u_inf = self.u / (1 - (1 - self.u) * e_f)
        r_inf = (1 - e_r) / (1 - (1 - u_inf) * e_r)
        return u_inf, r_inf


def _release_reference(s, step, u, r, last, u_par, rate_rec, rate_facil, dt):
    """The releases of the spikes `s` emitted during `step` and the new `(u, r, last)`,
    elementwise over every neuron (the registry entry's reference and the function whose
    derivative `TsodyksMarkram.release` has). `u_par`, `rate_rec` (1 / tau_rec) and
    `rate_facil` (1 / tau_facil, inf without facilitation) hold 1 or n values, `dt` one."""
    now = step + 1
    elapsed = (now - last).astype(u.dtype) * dt
    decay_f = jnp.exp(-elapsed * rate_facil)
    decay_r = jnp.exp(-elapsed * rate_rec)
    u_minus = u * decay_f
    r_minus = 1 - (1 - r) * decay_r
    u_plus = u_minus + u_par * (1 - u_minus)
    release = u_plus * r_minus
    return (
        u + s * (u_plus - u),
        r + s * (r_minus - release - r),
        jnp.where(s > 0, now, last),
        s * release,
    )


def _release_cpu(s, step, u, r, last, u_par, rate_rec, rate_facil, dt):
    """The compiled CPU kernel (`csr_deliver.cc`, FFI target `nj_stp_release`): the same
    formulas for the spiking neurons only, the state updated in place."""
    shape = jax.ShapeDtypeStruct(u.shape, u.dtype)
    kernel = jax.ffi.ffi_call(
        STP_RELEASE_TARGET,
        (shape, shape, jax.ShapeDtypeStruct(last.shape, jnp.int32), shape),
        input_output_aliases={2: 0, 3: 1, 4: 2},
        vmap_method="sequential",
    )
    return kernel(s, step, u, r, last, u_par, rate_rec, rate_facil, dt, n=np.int64(u.shape[-1]))


def _supports(s, step, u, r, last, u_par, rate_rec, rate_facil, dt):
    return u.dtype in (jnp.float32, jnp.float64) and s.dtype == u.dtype


def _release_examples():
    """Two trials of five neurons from a random state: scalar parameters without
    facilitation, then per-neuron parameters with it."""
    rng = np.random.default_rng(0)
    f32 = jnp.float32
    n = 5
    s = jnp.asarray(rng.random((2, n)) < 0.5, f32).at[0, 0].set(1.0)
    u = jnp.asarray(rng.uniform(0.0, 0.6, (2, n)), f32)
    r = jnp.asarray(rng.uniform(0.2, 1.0, (2, n)), f32)
    last = jnp.asarray(rng.integers(0, 40, (2, n)), jnp.int32)
    step = jnp.asarray(57, jnp.int32)
    dt = jnp.full((1,), 0.1, f32)
    one = lambda x: jnp.full((1,), x, f32)  # noqa: E731
    yield Example(
        (s, step, u, r, last, one(0.5), one(1 / 80.0), one(np.inf), dt),
        grad_argnums=(0, 2, 3, 5, 6),
        label="depressing-scalar",
    )
    yield Example(
        (
            s,
            step,
            u,
            r,
            last,
            jnp.asarray(rng.uniform(0.05, 0.9, n), f32),
            jnp.asarray(1 / rng.uniform(20.0, 300.0, n), f32),
            jnp.asarray(1 / rng.uniform(5.0, 100.0, n), f32),
            dt,
        ),
        grad_argnums=(0, 2, 3, 5, 6, 7),
        label="facilitating-per-neuron",
    )


STP_RELEASE_TARGET = "nj_stp_release"
STP_RELEASE = register(
    Kernel(
        name="stp_release",
        reference=_release_reference,
        cpu=_release_cpu,
        ffi_targets=((STP_RELEASE_TARGET, "NjStpRelease"),),
        supports={"cpu": _supports},
        # spikes and state are trials; the step, parameters and dt are shared.
        batching=Fold(trial=(0, 2, 3, 4), shared=(1, 5, 6, 7, 8)),
        # std::exp and XLA's exp may differ in the last bits
        rtol=1e-6,
        atol=1e-7,
        examples=_release_examples,
        doc="Tsodyks-Markram releases of a step's spikes, the spiking neurons' state updated.",
    )
)
