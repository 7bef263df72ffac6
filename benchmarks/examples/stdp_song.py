"""Example: STDP drives the weights of one neuron to the bounds (Song, Miller and Abbott 2000).

The experiment of Brian2's `examples/synapses/STDP.py`: 1000 Poisson inputs at 15 Hz onto one
leaky integrate-and-fire neuron through conductance synapses with additive STDP, 100 s.
Depression slightly outweighs potentiation (`a_minus = 1.05 a_plus`), so synapses whose spikes
do not help to fire the neuron drift to 0 while the causal ones are pushed to `gmax`: the
final weight distribution is U-shaped (bimodal), and the output rate settles.

The Brian2 model, `tau_m dv/dt = ge (E_e - v) + E_L - v` (forward Euler, spike when
`v > v_t`, reset to `v_r`, no refractory period) with `ge` dimensionless (in units of the leak
conductance), maps onto `nj.LIF(r_m=1, method="euler")` with `nj.ConductanceOutput(0.0)` and
`nj.Exponential(5.0)`; `tau_m` = 10 ms, `E_L` = -74 mV, `v_t` = -54 mV, `v_r` = -60 mV,
`gmax` = 0.01, `a_plus` = 0.01 gmax, `a_minus` = 1.05 a_plus, `tau_plus = tau_minus` = 20 ms,
initial weights uniform in `[0, gmax]`, dt = 0.1 ms. (Brian2's example starts `v` at 0 mV, so
its neuron fires in the first step; here `v` starts uniform in `[v_r, v_t)`; it does not
matter after a few ms.)

The weights and the spike counts are recorded every 100 ms (`record_every`), the run is split
into chunks of 10 s (`chunk_size`) so that memory stays small. Prints one JSON line: the
fractions of weights in the lowest and highest 10 % of `[0, gmax]` (initially about 0.1 each),
`bimodal` (both end bins of a 10-bin histogram hold more weights than any middle bin), the mean
weight, the output rate over the whole run and over its last 10 %, and `wall_s` (the simulate
call, compilation included). The figure (`--out`) shows the final weight histogram, the
trajectories of a few synapses and the output rate over time.

Run: `python -m benchmarks.examples.stdp_song [--duration S] [--seed N] [--out FILE] [--quick]`
(`--duration` in seconds, default 100; `--quick` simulates 2 s). The common benchmark flags
(`--threads`, ...) are accepted; `--sizes`, `--repeats` and `--peers` are not used.
"""

import sys
import time
from pathlib import Path

from .. import _harness

DT = 0.1  # ms
DURATION_S = 100.0
QUICK_DURATION_S = 2.0
N_INPUTS = 1000
RATE_HZ = 15.0
RECORD_EVERY = 1000  # steps: 100 ms
CHUNK = 100_000  # steps: 10 s
OUT = _harness.REPO_ROOT / "benchmarks" / "out" / "stdp_song.png"

# Brian2's examples/synapses/STDP.py (mV, ms).
TAU_M, E_L, V_T, V_R, E_E, TAU_E = 10.0, -74.0, -54.0, -60.0, 0.0, 5.0
GMAX = 0.01
A_PLUS = 0.01 * GMAX
A_MINUS = 1.05 * A_PLUS  # Brian2: dApost = -dApre * taupre / taupost * 1.05
TAU_PLUS = TAU_MINUS = 20.0


def _extra(parser) -> None:
    parser.add_argument("--duration", type=float, default=None, help="simulated seconds (100)")
    parser.add_argument("--seed", type=int, default=0, help="PRNG seed")
    parser.add_argument("--out", type=Path, default=OUT, help="figure path (.png)")


def build(key):
    """The network `{"in": 1000 Poisson sources, "out": one LIF}` and its initial state."""
    import jax.random as jr

    import neurojax as nj

    k_w, k_state = jr.split(key)
    lif = nj.LIF(tau_m=TAU_M, v_rest=E_L, v_reset=V_R, v_th=V_T, r_m=1.0, t_ref=0.0, method="euler")
    conn = nj.connect.all_to_all(N_INPUTS, 1, weight=nj.connect.uniform(0.0, GMAX), key=k_w)
    stdp = nj.STDP(
        a_plus=A_PLUS,
        a_minus=A_MINUS,
        tau_plus=TAU_PLUS,
        tau_minus=TAU_MINUS,
        w_min=0.0,
        w_max=GMAX,
        mode="additive",
    )
    proj = nj.Projection(
        "in",
        "out",
        conn,
        synapse=nj.Exponential(TAU_E),
        output=nj.ConductanceOutput(E_E),
        plasticity=stdp,
    )
    net = nj.Network({"in": (nj.PoissonSource(RATE_HZ), N_INPUTS), "out": (lif, 1)}, [proj])
    return net, net.init_state(k_state)


def end_fractions(w_over_gmax, width: float = 0.1) -> tuple[float, float]:
    """Fractions of weights in the lowest and highest `width` of the range (w / gmax)."""
    import numpy as np

    w = np.asarray(w_over_gmax)
    return float(np.mean(w <= width)), float(np.mean(w >= 1.0 - width))


def is_bimodal(w_over_gmax) -> bool:
    """Both end bins of a 10-bin histogram on [0, 1] hold more weights than any middle bin."""
    import numpy as np

    counts, _ = np.histogram(np.asarray(w_over_gmax), bins=10, range=(0.0, 1.0))
    return bool(min(counts[0], counts[-1]) > counts[1:-1].max())


def plot(path: Path, w0, w_final, t_rec_s, w_rec, rate_t_s, rate_hz, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(3, 1, figsize=(7, 9), constrained_layout=True)
    ax = axes[0]
    bins = np.linspace(0.0, 1.0, 21)
    ax.hist(w_final, bins=bins, color="C0", label="final")
    ax.hist(w0, bins=bins, histtype="step", color="k", label="initial")
    ax.set_xlabel("w / gmax")
    ax.set_ylabel("synapses")
    ax.set_title(title, fontsize=10)
    ax.legend()
    ax = axes[1]
    # A few synapses that end low, in the middle and high.
    order = np.argsort(w_final)
    picks = order[np.linspace(0, len(order) - 1, 5).astype(int)]
    for i in picks:
        ax.plot(t_rec_s, w_rec[:, i], lw=0.8)
    ax.set_title("5 synapses, from the lowest to the highest final weight")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("w / gmax")
    ax.set_ylim(-0.02, 1.02)
    ax = axes[2]
    ax.plot(rate_t_s, rate_hz, color="C3")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("output rate (Hz)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    args = _harness.parse_args(
        __doc__.splitlines()[0],
        sizes=(N_INPUTS,),
        quick_sizes=(N_INPUTS,),
        argv=argv,
        extra=_extra,
    )
    import jax
    import numpy as np

    import neurojax as nj

    duration_s = args.duration or (QUICK_DURATION_S if args.quick else DURATION_S)
    n_steps = int(round(duration_s * 1000.0 / DT))
    if n_steps < RECORD_EVERY or n_steps % RECORD_EVERY:
        raise SystemExit(f"--duration must be a positive multiple of 0.1 s, got {duration_s}")
    net, state = build(jax.random.key(args.seed))
    w0 = np.asarray(state.plastic[0].weights) / GMAX

    _harness.log(f"stdp_song: {duration_s:g} s ({n_steps} steps)")
    t0 = time.perf_counter()
    final, rec = nj.simulate(
        net,
        state,
        dt=DT,
        n_steps=n_steps,
        record=lambda st, out: st.plastic[0].weights,
        record_every=RECORD_EVERY,
        chunk_size=min(CHUNK, n_steps),
    )
    w_final = np.asarray(jax.block_until_ready(final.plastic[0].weights)) / GMAX
    wall = time.perf_counter() - t0

    w_rec = np.asarray(rec.values) / GMAX  # (windows, N_INPUTS)
    out_counts = np.asarray(rec.spikes["out"]).sum(axis=-1)  # spikes per 100 ms window
    in_counts = np.asarray(rec.spikes["in"]).sum()
    window_s = RECORD_EVERY * DT * 1e-3
    rate_out = float(out_counts.sum() / duration_s)
    tail = max(1, len(out_counts) // 10)
    rate_tail = float(out_counts[-tail:].sum() / (tail * window_s))
    # Output rate in bins of 1 s (or of one window in short runs).
    per_bin = max(1, min(10, len(out_counts) // 10))
    n_bins = len(out_counts) // per_bin
    binned = out_counts[: n_bins * per_bin].reshape(n_bins, per_bin).sum(axis=1)
    rate_t = (np.arange(n_bins) + 0.5) * per_bin * window_s
    low, high = end_fractions(w_final)
    low0, high0 = end_fractions(w0)
    bimodal = is_bimodal(w_final)

    plot(
        args.out,
        w0,
        w_final,
        (np.arange(len(w_rec)) + 1) * window_s,
        w_rec,
        rate_t,
        binned / (per_bin * window_s),
        f"STDP (Song et al. 2000) after {duration_s:g} s: {low:.0%} of weights <= 0.1 gmax, "
        f"{high:.0%} >= 0.9 gmax",
    )
    _harness.emit(
        {
            "bench": "stdp_song",
            "impl": "neurojax",
            "duration_s": duration_s,
            "dt": DT,
            "steps": n_steps,
            "seed": args.seed,
            "threads": args.threads,
            "n_inputs": N_INPUTS,
            "frac_low": low,
            "frac_high": high,
            "frac_low_initial": low0,
            "frac_high_initial": high0,
            "bimodal": bimodal,
            "mean_w_over_gmax": float(w_final.mean()),
            "rate_out_hz": rate_out,
            "rate_out_last10pct_hz": rate_tail,
            "rate_in_hz": float(in_counts / (N_INPUTS * duration_s)),
            "wall_s": wall,
            "figure": str(args.out),
        }
    )


if __name__ == "__main__":
    main(sys.argv[1:])
