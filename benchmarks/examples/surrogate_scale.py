"""Measurement: the scale of a surrogate gradient in a recurrent spiking network against the
slope of the simulated rate (the figures of the gradients page, "Surrogate gradients in
recurrent networks").

A network of 200 LIF neurons (tau_m 20 ms, threshold 1, reset 0, refractory 2 ms) driven by
heterogeneous constant currents `scale * I_j` (I_j uniform in [0.9, 1.5], suprathreshold)
and coupled by random recurrent weights (p = 0.1, every weight `w_rec`; 0 for an uncoupled
population) is simulated for 500 ms at dt = 0.1 ms. The loss is the mean firing rate [Hz].
For each surrogate slope (`nj.surrogate.FastSigmoid`), recurrent weight and
`truncate_backprop`, the script prints the surrogate gradient d rate / d scale at
scale = 1 and the slope of the simulated rate itself, a least-squares line through the
rates at 21 scales in [0.95, 1.05] (the simulated rate is piecewise constant in the scale,
so only such a secant over many spike-count changes has a meaning), and their ratio.

Run: `python -m benchmarks.examples.surrogate_scale` (about a minute on one core).
"""

import json

import jax
import jax.numpy as jnp
import numpy as np

import neurojax as nj

N, P, DT, STEPS = 200, 0.1, 0.1, 5000


def build(slope, w_rec):
    lif = nj.LIF(
        tau_m=20.0, v_rest=0.0, v_reset=0.0, v_th=1.0, t_ref=2.0, r_m=1.0,
        surrogate=nj.surrogate.FastSigmoid(slope),
    )  # fmt: skip
    conn = nj.connect.fixed_prob(jax.random.key(1), N, N, P, weight=w_rec)
    return nj.Network(
        {"A": (lif, N)},
        [nj.Projection("A", "A", conn, synapse=nj.Exponential(5.0), method="dense")],
        dt=DT,
    )


def main() -> None:
    drive = jnp.asarray(np.random.default_rng(0).uniform(0.9, 1.5, N), jnp.float32)
    scales = np.linspace(0.95, 1.05, 21)
    for w_rec in (0.0, 0.05, -0.05):
        for slope in (1.0, 5.0, 25.0):
            net = build(slope, w_rec)
            state = net.init_state()

            def rate(scale, trunc=None, net=net, state=state):
                inputs = {"A": scale * drive}
                _, rec = nj.simulate(
                    net, state, inputs, dt=DT, n_steps=STEPS,
                    record=nj.Record(spikes="float"),
                    gradient=nj.SurrogateGradient(truncate_backprop=trunc),
                )  # fmt: skip
                return rec.spikes["A"].sum() / (N * STEPS * DT * 1e-3)

            sim = jax.jit(rate)
            rates = np.array([float(sim(jnp.float32(s))) for s in scales])
            fd = float(np.polyfit(scales, rates, 1)[0])
            for trunc in (None, 50):
                grad = float(jax.jit(jax.grad(lambda s, t=trunc: rate(s, t)))(jnp.float32(1.0)))
                print(
                    json.dumps(
                        {
                            "bench": "surrogate_scale",
                            "w_rec": w_rec,
                            "slope": slope,
                            "truncate_backprop": trunc,
                            "rate_hz": float(rates[10]),
                            "surrogate_grad": grad,
                            "secant_slope": fd,
                            "ratio": grad / fd if fd else None,
                        }
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
