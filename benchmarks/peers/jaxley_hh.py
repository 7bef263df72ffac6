"""Jaxley peer for the Hodgkin-Huxley batch: one process per configuration.

Each neuron is a single-compartment `jx.Cell` with Jaxley's `HH` channel, its parameters set
to the classic values of `benchmarks.peers._hh.PARAMS` (Jaxley stores conductances in S/cm^2
and its default leak reversal is -54.3 mV, so both are set explicitly). The cell is simulated
with `jx.integrate` and Jaxley's default solver (implicit Euler for the voltage, exact
exponential update of the gates), and the batch of independent neurons is a `jax.vmap` over
the stimulus amplitude, the way Jaxley's documentation runs parameter and stimulus sweeps.

`jx.integrate` must record a state; the voltage is recorded and reduced to a spike raster
inside the same jitted function, so the output matches neurojax's (a bool raster). Because
the stimulus and the recording are `(time, neuron)` arrays, large batches run in chunks of
`chunk` neurons through the same compiled function (the timed figure is the sum over chunks).

Jaxley takes currents in nA: a density `I` [uA/cm^2] on a compartment of area `A` [um^2] is
`I * A * 1e-5` nA.

Usage: `python -m benchmarks.peers.jaxley_hh SPEC_JSON` with keys `n`, `dtype`, `dt`,
`n_steps`, `i_max`, `y0`, `repeats`, `budget_s`, `chunk`, and optionally `accuracy_currents`.
"""

import contextlib
import time
from typing import Any

import numpy as np

from .._harness import peer_main
from . import _hh


def _build(y0):
    import jaxley as jx
    from jaxley.channels import HH

    cell = jx.Cell(jx.Branch(jx.Compartment(), ncomp=1), parents=[-1])
    cell.insert(HH())
    p = _hh.PARAMS
    # Jaxley: conductances in S/cm^2 (= 1e-3 mS/cm^2), reversal potentials in mV.
    cell.set("HH_gNa", p["g_na"] * 1e-3)
    cell.set("HH_gK", p["g_k"] * 1e-3)
    cell.set("HH_gLeak", p["g_l"] * 1e-3)
    cell.set("HH_eNa", p["e_na"])
    cell.set("HH_eK", p["e_k"])
    cell.set("HH_eLeak", p["e_l"])
    cell.set("capacitance", p["c_m"])
    cell.set("v", y0[0])
    cell.set("HH_m", y0[1])
    cell.set("HH_h", y0[2])
    cell.set("HH_n", y0[3])
    cell.record("v", verbose=False)
    area = float(cell.nodes["area"].iloc[0])
    return cell, area


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import jaxley as jx

    dtype = spec["dtype"]
    n, dt, n_steps = int(spec["n"]), float(spec["dt"]), int(spec["n_steps"])
    ctx = jax.enable_x64(True) if dtype == "float64" else contextlib.nullcontext()
    with ctx:
        cell, area = _build(spec["y0"])
        to_na = area * 1e-5

        def trace(amp):
            stim = cell.data_stimulate(amp * to_na * jnp.ones((n_steps,)))
            return jx.integrate(cell, data_stimuli=stim, delta_t=dt)[0]

        def spikes(amps):
            v = jax.vmap(trace)(amps)  # (neuron, time + 1)
            return ((v[:, :-1] < 0.0) & (v[:, 1:] >= 0.0)).T

        out: dict[str, Any] = {"impl": "jaxley", "dtype": dtype, "solver": "bwd_euler"}
        currents = _hh.batch_currents(n, float(spec["i_max"]))
        chunk = min(n, int(spec["chunk"]))
        n_chunks = -(-n // chunk)
        padded = np.zeros(n_chunks * chunk)
        padded[:n] = currents
        chunks = [jnp.asarray(c, dtype) for c in padded.reshape(n_chunks, chunk)]

        t0 = time.perf_counter()
        compiled = jax.jit(spikes).lower(chunks[0]).compile()
        out["compile_s"] = time.perf_counter() - t0

        def call():
            return [jax.block_until_ready(compiled(c)) for c in chunks]

        t0 = time.perf_counter()
        call()
        out["first_call_s"] = time.perf_counter() - t0
        times: list[float] = []
        result = None
        for _ in range(int(spec["repeats"])):
            result = None
            t0 = time.perf_counter()
            result = call()
            times.append(time.perf_counter() - t0)
            if sum(times) > float(spec["budget_s"]):
                break
        raster = np.concatenate([np.asarray(r) for r in result], axis=1)[:, :n]
        out.update(
            times_s=times,
            chunk=chunk,
            n_chunks=n_chunks,
            n_spikes=int(raster.sum()),
        )

        if spec.get("accuracy_currents"):
            amps = jnp.asarray(spec["accuracy_currents"], dtype)
            v = np.asarray(jax.jit(jax.vmap(trace))(amps)).T  # (time + 1, neuron)
            t = np.arange(n_steps + 1) * dt
            out["accuracy_spike_times"] = [s.tolist() for s in _hh.crossing_times(t, v)]
    return out


if __name__ == "__main__":
    peer_main(run)
