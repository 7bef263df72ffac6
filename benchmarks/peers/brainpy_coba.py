"""brainpy-state peer for the Brette et al. (2007) COBA and CUBA networks: one process per run.

The networks of `benchmarks.peers._coba` written with `brainpy.state` building blocks, the way
its documented E/I examples are: a single population of 4000 neurons, `state.Expon` synapses
with `state.COBA` / `state.CUBA` outputs attached through `state.AlignPostProj` (one shared
synapse per target and kind), and the connections as `brainevent.CSR` matrices multiplied by
`brainevent.BinaryArray` spike vectors, i.e. brainevent's event-driven kernel (numba backend
on CPU, serial: only the rows of spiking sources are visited). The whole run is one
`brainstate.transform.for_loop` under `brainstate.transform.jit`.

The physics follow `_coba` (REFERENCE.md) rather than brainpy's documented COBA example,
whose weights are ~1000x too weak (mS on a 1 ohm membrane):

- conductances in units of g_L (COBA, jumps 0.6 and 6.7) or in mV (CUBA, jumps 1.62 and -9 mV),
  so the membrane "resistance" is dimensionless 1; COBA gets the 20 mV drive, CUBA none;
- the neuron (`_BretteLIF`, a `state.LIFRef` with its own update) integrates `v` with forward
  Euler (COBA, as Brian2's `method="euler"`) or exactly over the step with the synaptic input
  decaying inside it (CUBA, as Brian2's `method="exact"` for these linear equations), spikes
  when `v > v_th`, is reset to `v_reset` (a hard reset, not LIFRef's default soft one) and
  held there for `t_ref`;
- connections are Bernoulli(p) from each source population onto all 4000 neurons,
  self-connections included, as Brian2's `connect(p=0.02)` (brainstate's `EventFixedProb`
  would give every source exactly 80 targets instead);
- initial `v` ~ N(-55, 5) mV (COBA) or uniform in [v_reset, v_th) (CUBA), synapses at 0.

brainpy.state's step order (the synapse decays and takes the jumps of the previous step's
spikes, then the neuron integrates with it) gives the same recursion as Brian2's; a neuron
that crossed threshold is reset at the start of the next step, which is equivalent. What
still differs from Brian2: `state.Expon` decays exactly (Brian2's COBA Euler-steps `ge`, `gi`
too: the integral of a jump is ~1% larger here), neurons that start above threshold fire
before the first step rather than after it, uncounted and not held refractory, and floats are
float32 (brainstate's default) where Brian2 uses float64.

Timing: the jitted run is called once (compile and a first run), then `repeats` timed calls
from the same initial state, each ending with `jax.block_until_ready`; `compile_s` is the
first call minus the median loop. The spike raster (steps x 4000 booleans) is the recording,
reduced to the statistics of `_coba.spike_stats` afterwards.

Threads: the process pins itself with `configure_threads` (XLA flags and CPU affinity, as the
neurojax benchmarks do) before JAX is imported; brainevent's numba kernels run serially.

Scaled networks and GPUs (`benchmarks.gpu`): `scale` s multiplies both populations by s and
divides the connection probability by s, so every neuron keeps ~80 inputs (BrainPy's own COBA
scaling benchmark does the same); `platform` "gpu" leaves brainevent on its default GPU
kernels (CUDA, built at first use) instead of the CPU's numba backend. For s > 1 the run
returns spike counts per neuron (the raster is summed inside the jitted call) and only mean
rates are reported.

Usage: `python -m benchmarks.peers.brainpy_coba SPEC_JSON` with keys `model` ('coba' or
'cuba'), `seed`, `duration_ms`, `repeats`, `budget_s`, `threads`, optionally `t_skip_ms`
(start of the statistics window, default 0), `scale` (default 1) and `platform` ('cpu',
default, or 'gpu').
"""

import time
from typing import Any

from .._harness import configure_threads, log, peer_main, time_call


def _bernoulli_csr(rng: Any, n_pre: int, n_post: int, p: float) -> tuple[Any, Any]:
    """Row-wise Bernoulli(p) connectivity as CSR (indices, indptr), sorted targets per row."""
    import numpy as np

    counts = rng.binomial(n_post, p, size=n_pre)
    indices = np.concatenate(
        [np.sort(rng.choice(n_post, size=c, replace=False)) for c in counts]
    ).astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return indices, indptr


def _build(model: str, seed: int, scale: int = 1) -> tuple[Any, Any, dict[Any, Any]]:
    """The network module (initialised), its states and their initial values."""
    import brainevent
    import brainstate
    import braintools
    import brainunit as u
    import jax.numpy as jnp
    import numpy as np
    from brainpy import state

    from . import _coba

    p = dict(_coba.MODELS[model])
    n_exc, n_inh = p["n_exc"] * scale, p["n_inh"] * scale
    p["p_conn"] = p["p_conn"] / scale
    n = n_exc + n_inh
    ms, mV = u.ms, u.mV
    coba = model == "coba"
    synapses: list[Any] = []  # the two shared synapses, read by the CUBA neuron's exact step

    class _BretteLIF(state.LIFRef):
        """LIFRef with the benchmark's integrator, threshold and hard reset."""

        def update(self, x=0.0 * mV):
            t = brainstate.environ.get("t")
            dt = brainstate.environ.get_dt()
            v = self.V.value
            v = u.math.where(v > self.V_th, self.V_reset, v)  # spiked at the previous step
            if coba:
                dv = (-(v - self.V_rest) + self.R * self.sum_current_inputs(x, v)) / self.tau
                v_new = v + dt * dv
            else:
                # Exact step for tau_m dv/dt = -(v - e_l) + x + ge + gi with ge, gi decaying at
                # tau_exc, tau_inh: each synaptic term contributes A (e^-dt/tau_s - e^-dt/tau_m)
                # with A = g tau_s / (tau_s - tau_m); the synapses hold the post-jump values.
                decay_m = u.math.exp(-dt / self.tau)
                v_new = self.V_rest + (v - self.V_rest) * decay_m + x * (1.0 - decay_m)
                for syn in synapses:
                    tau_s = syn.tau
                    a = syn.g.value * tau_s / (tau_s - self.tau)
                    v_new = v_new + a * (u.math.exp(-dt / tau_s) - decay_m)
            refractory = t - self.last_spike_time.value < self.tau_ref - 0.5 * dt
            v = u.math.where(refractory, v, v_new)
            self.V.value = v
            self.last_spike_time.value = u.math.where(v > self.V_th, t, self.last_spike_time.value)
            return v > self.V_th

    class _CSRComm(brainstate.nn.Module):
        """Event-driven projection through a homogeneous-weight `brainevent.CSR`."""

        def __init__(self, indices, indptr, n_pre, weight):
            super().__init__()
            self.in_size = (n_pre,)
            self.csr = brainevent.CSR(
                (weight * jnp.ones(1), jnp.asarray(indices), jnp.asarray(indptr)),
                shape=(n_pre, n),
            )

        def update(self, spikes):
            return brainevent.BinaryArray(spikes) @ self.csr

    class _Net(brainstate.nn.Module):
        def __init__(self):
            super().__init__()
            rng = np.random.default_rng(seed)
            if coba:
                v0 = rng.normal(p["v0_mean"], p["v0_std"], size=n)
            else:
                v0 = rng.uniform(p["v_reset"], p["v_th"], size=n)
            self.neurons = _BretteLIF(
                n,
                R=1.0,
                tau=p["tau_m"] * ms,
                tau_ref=p["t_ref"] * ms,
                V_th=p["v_th"] * mV,
                V_reset=p["v_reset"] * mV,
                V_rest=p["e_l"] * mV,
                V_initializer=jnp.asarray(v0, dtype=brainstate.environ.dftype()) * mV,
            )
            if coba:
                g0 = 0.0  # conductances in units of g_L
                out_e, out_i = (
                    state.COBA.desc(E=p["e_exc"] * mV),
                    state.COBA.desc(E=p["e_inh"] * mV),
                )
                w_e, w_i = p["w_exc"], p["w_inh"]
                self.drive = p["i_ext"] * mV
            else:
                g0 = 0.0 * mV  # currents expressed as voltages
                out_e = out_i = state.CUBA.desc(scale=1.0)
                w_e, w_i = p["w_exc"] * mV, p["w_inh"] * mV
                self.drive = 0.0 * mV
            c_e = _bernoulli_csr(rng, n_exc, n, p["p_conn"])
            c_i = _bernoulli_csr(rng, n_inh, n, p["p_conn"])
            self.n_synapses = int(c_e[0].size + c_i[0].size)
            zero = braintools.init.Constant(g0)
            self.exc = state.AlignPostProj(
                comm=_CSRComm(*c_e, n_exc, w_e),
                syn=state.Expon.desc(n, tau=p["tau_exc"] * ms, g_initializer=zero),
                out=out_e,
                post=self.neurons,
            )
            self.inh = state.AlignPostProj(
                comm=_CSRComm(*c_i, n_inh, w_i),
                syn=state.Expon.desc(n, tau=p["tau_inh"] * ms, g_initializer=zero),
                out=out_i,
                post=self.neurons,
            )
            synapses.extend([self.exc.syn, self.inh.syn])

        def update(self, i):
            t = i * brainstate.environ.get_dt()
            with brainstate.environ.context(t=t, i=i):
                spikes = self.neurons.V.value > self.neurons.V_th
                self.exc(spikes[:n_exc])
                self.inh(spikes[n_exc:])
                return self.neurons(self.drive)

    net = _Net()
    brainstate.nn.init_all_states(net)
    states = net.states()
    initial = {k: s.value for k, s in states.items()}
    return net, states, initial


def run(spec: dict[str, Any]) -> dict[str, Any]:
    threads = int(spec["threads"])
    configure_threads(threads)  # before JAX and NumPy are imported
    import brainevent
    import brainstate
    import brainunit as u
    import jax
    import jax.numpy as jnp
    import numpy as np

    from . import _coba

    model = spec["model"]
    if model not in _coba.MODELS:
        raise ValueError(f"model must be one of {sorted(_coba.MODELS)}, got {model!r}")
    p = _coba.MODELS[model]
    duration = float(spec["duration_ms"])
    n_steps = int(round(duration / p["dt"]))
    scale = int(spec.get("scale", 1))
    platform = spec.get("platform", "cpu")
    n_exc, n_inh = p["n_exc"] * scale, p["n_inh"] * scale
    brainstate.environ.set(dt=p["dt"] * u.ms)
    if platform == "cpu":
        brainevent.config.set_backend("cpu", "numba")

    t0 = time.perf_counter()
    net, states, initial = _build(model, int(spec["seed"]), scale)
    build_s = time.perf_counter() - t0

    @brainstate.transform.jit
    def simulate():
        raster = brainstate.transform.for_loop(net.update, jnp.arange(n_steps))
        # Scaled runs keep only counts: a 10^4-step raster of 4 * 10^5 neurons is 4 GB.
        return raster if scale == 1 else raster.sum(axis=0, dtype=jnp.int32)

    def call():
        for key, st in states.items():
            st.value = initial[key]
        return jax.block_until_ready(simulate())

    log(f"brainpy_coba: {model}, {n_steps} steps, {net.n_synapses} synapses")
    timing, raster = time_call(call, repeats=int(spec["repeats"]), budget_s=float(spec["budget_s"]))
    raster = np.asarray(raster)
    t_skip = float(spec.get("t_skip_ms", 0.0))
    result: dict[str, Any] = {
        "impl": "brainpy_state",
        "model": model,
        "method": "euler" if model == "coba" else "exact",
        "backend": "numba" if platform == "cpu" else "brainevent default",
        "platform": str(jax.devices()[0].platform),
        "device_kind": str(jax.devices()[0].device_kind),
        "scale": scale,
        "n_neurons": n_exc + n_inh,
        "seed": int(spec["seed"]),
        "duration_ms": duration,
        "threads": threads,
        "build_s": build_s,
        "compile_s": timing.compile_s,
        "first_call_s": timing.first_call_s,
        "loop_s": timing.times,
        "loop_min_s": timing.run_min_s,
        "times_s": timing.times,
        "float_dtype": str(jnp.dtype(brainstate.environ.dftype())),
        "n_synapses": net.n_synapses,
        "t_skip_ms": t_skip,
    }
    if scale == 1:
        step, idx = np.nonzero(raster)
        result.update(_coba.spike_stats(idx, step * p["dt"], n_exc, n_inh, duration, t_skip))
    else:
        seconds = duration * 1e-3
        result.update(
            rate_exc_hz=float(raster[:n_exc].sum() / (n_exc * seconds)),
            rate_inh_hz=float(raster[n_exc:].sum() / (n_inh * seconds)),
            rate_hz=float(raster.sum() / ((n_exc + n_inh) * seconds)),
        )
    return result


if __name__ == "__main__":
    peer_main(run)
