"""The distal reward problem in a spiking network (Izhikevich 2007, Fig. 1) with `nj.RewardSTDP`.

The network of the paper's first experiment: 1000 Izhikevich neurons, 800 excitatory
(regular spiking, `a = 0.02`, `d = 8`) and 200 inhibitory (fast spiking, `a = 0.1`, `d = 2`),
`b = 0.2`, `c = -65`. Each neuron has 100 random postsynaptic targets (drawn with
replacement; excitatory onto any neuron, inhibitory onto excitatory ones only). An excitatory
neuron's synapses have axonal delays of 1 to 20 ms, five synapses per delay; inhibitory
synapses have a delay of 1 ms and a fixed weight of -1. The random input (`--input`) is,
by default, the author's program's: every ms every neuron gets `13 (U - 0.5)` with `U`
uniform in [0, 1) (`"noise"`: about 1.5 Hz excitatory, 1 Hz inhibitory); `"kick"` gives,
every ms, an input of 20 to one randomly chosen neuron (the input of the author's spnet
programs; about 1 Hz). Excitatory weights start at 1, are plastic under dopamine-modulated
STDP and are bounded to [0, 4].

One excitatory->excitatory synapse `n1 -> n2` is chosen at random and started at 0 (as in
the author's code). Whenever `n2` fires within 20 ms after a spike of `n1` has arrived
through that synapse, a reward is scheduled 1-3 s later (uniform, whole ms): the dopamine
concentration jumps by 0.5 and decays with `tau_d = 200 ms` above a tonic level. Over an
hour of model time the rewarded synapse grows to the maximum while the distribution of the
other excitatory weights stays unimodal near 0.

Constants. The paper (E. M. Izhikevich, "Solving the distal reward problem through linkage
of STDP and dopamine signaling", Cerebral Cortex 17:2443-2452, 2007) gives `tau_c = 1 s`,
`tau_d = 0.2 s`, the STDP window with `tau+ = tau- = 20 ms` and `A- / A+ = 1.5`. The
author's published MATLAB program for Fig. 1 (daspnet.m, izhikevich.org/publications)
fixes the scales used here: the pre and post traces are *set* to 0.1 at a spike and decay by
0.95 per ms (nearest-spike pairing, `a_plus = 0.1`, `a_minus = 1.5 * 0.1 = 0.15`); every 10
ms it adds `(0.002 + DA) * c` to the weight and multiplies `c` by 0.99 (so `tau_c` = 995 ms
and `dw/dt = (0.002 + DA) / 10 * c` per ms: the tonic level is 0.002); DA decays by 0.995 per
ms and a reward adds 0.5; rewards fall `1000 + ceil(2000 U)` ms after the rewarded spike of
`n2`; the coincidence interval is 20 ms. Two departures from that program, both taken from
the paper's description of the network instead: delays of 1-20 ms (the program uses 1 ms
for all), and the coincidence is counted from the spike's arrival through the synapse (the
program counts it from the spike of `n1`, one step before its arrival). The neurons use
`nj.Izhikevich(method="spnet")` at `dt = 1 ms`: `v` in two 0.5 ms halves, as the program
(`--neuron published`, one 1 ms step, raises the rates by about 12 %).

In neurojax. `nj.RewardSTDP(a_plus=0.1, a_minus=0.15, tau_plus=tau_minus=20, tau_c=1000,
w_min=0, w_max=4, pairing="nearest")`, with the dopamine `d(t) = (0.002 + DA(t)) / 10` given
as the network input `"dopamine"`. A plastic projection has one delay for all its synapses,
so the excitatory synapses are 20 plastic projections, one per delay. All 1000 neurons are
one population `"N"` (per-neuron `a` and `d`), so that one projection per delay reaches both
excitatory and inhibitory targets; the excitatory projections have no synapses on the
inhibitory rows and the inhibitory projection none on the excitatory rows. The run goes in 1
s chunks (one compiled `nj.simulate` of 1000 steps, reused): a chunk's dopamine series is
computed on the host from the rewards earned before it (a reward is at least 1 s late, so
it always falls in a later chunk), and the rewards a chunk earns are read from its recorded
spikes.

Run: `python -m benchmarks.examples.distal_reward [--seconds 3600] [--seed 0] [--input noise|kick]
[--neuron spnet|published]
[--plot PATH] [--save NPZ]`. Prints, every `--every` seconds, the chosen synapse's weight,
the mean and quantiles of the other excitatory weights, the number of rewards so far and the
mean firing rate, then the wall time per second of model time.
"""

import argparse
import time
from dataclasses import dataclass, field

import equinox as eqx
import jax
import numpy as np

import neurojax as nj

DT = 1.0  # ms
N_EXC, N_INH = 800, 200
N = N_EXC + N_INH
FAN_OUT = 100  # targets per neuron
MAX_DELAY = 20  # ms, excitatory delays 1..MAX_DELAY, FAN_OUT / MAX_DELAY synapses each
INPUT = 20.0  # the random input of one neuron per ms
NOISE = 13.0  # the width of the uniform noise of daspnet.m (input "noise")
W_INIT, W_MAX, W_INH = 1.0, 4.0, -1.0
CHUNK = 1000  # steps (1 s) per compiled run
INTERVAL = 20  # ms: n2 firing at most this long after n1's spike arrives earns a reward
REWARD_DELAY = (1000, 3000)  # ms, the reward comes 1001..3000 ms after the rewarded spike
DA_JUMP, TAU_D, DA_TONIC = 0.5, 200.0, 0.002
DA_SCALE = 0.1  # the program applies (tonic + DA) * c once every 10 ms: per ms, a tenth


def make_rule(sweep_interval: float = 1000.0) -> nj.RewardSTDP:
    """The paper's rule in neurojax's units (see the module docstring)."""
    return nj.RewardSTDP(
        a_plus=0.1, a_minus=0.15, tau_plus=20.0, tau_minus=20.0, tau_c=1000.0,
        w_min=0.0, w_max=W_MAX, pairing="nearest", sweep_interval=sweep_interval,
    )  # fmt: skip


@dataclass
class Experiment:
    """The network, the chosen synapse and the bookkeeping of one run.

    Attributes:
        net: the `nj.Network` (population `"N"`: 800 RS then 200 FS neurons).
        rule: the `nj.RewardSTDP` of the 20 excitatory projections (projections 0..19 have
            delays 1..20 ms; projection 20 is the inhibitory one).
        n1, n2, delay: the chosen synapse's neurons and its delay [steps].
        proj, index: its projection and its index in that projection's synapse order.
    """

    net: nj.Network
    rule: nj.RewardSTDP
    n1: int
    n2: int
    delay: int
    proj: int
    index: int
    rng: np.random.Generator
    input: str = "noise"  # the random input (see `random_input`)
    rewards: list = field(default_factory=list)  # reward times [ms]
    earned: list = field(default_factory=list)  # the spikes of n2 that earned them [step]
    last_arrival: float = -np.inf  # the latest arrival of n1's spike through the synapse [step]


def build(
    seed: int = 0,
    max_delay: int = MAX_DELAY,
    sweep_interval: float = 1000.0,
    neuron_method: str = "spnet",
) -> Experiment:
    """The network of the paper's first experiment with a randomly chosen E->E synapse.

    `max_delay` (a divisor of 100; the paper: 20) sets the excitatory delays `1..max_delay` ms
    and so the number of plastic projections (a smaller network to compile, for tests).
    `neuron_method` is `nj.Izhikevich`'s scheme: `"spnet"` (the program's two 0.5 ms halves
    of `v`) or `"published"` (one 1 ms step, this benchmark's scheme before 2026-11-26 late)."""
    if neuron_method not in ("spnet", "published"):
        raise ValueError(
            f"build: neuron_method must be 'spnet' or 'published', got {neuron_method!r}"
        )
    ok = isinstance(max_delay, int) and not isinstance(max_delay, bool) and max_delay >= 1
    if not ok or FAN_OUT % max_delay:
        raise ValueError(f"build: max_delay must be a divisor of {FAN_OUT} (ms), got {max_delay!r}")
    rng = np.random.default_rng(seed)
    exc_targets = rng.integers(0, N, (N_EXC, FAN_OUT))
    inh_targets = rng.integers(0, N_EXC, (N_INH, FAN_OUT))
    per_delay = FAN_OUT // max_delay
    rule = make_rule(sweep_interval)
    projections = []
    for k in range(max_delay):
        post = exc_targets[:, k * per_delay : (k + 1) * per_delay]
        pre = np.repeat(np.arange(N_EXC), per_delay)
        conn = nj.connect.from_arrays(pre, post.reshape(-1), W_INIT, N, N, allow_multapses=True)
        projections.append(
            nj.Projection("N", "N", conn, synapse=nj.Delta(), delay=float(k + 1), plasticity=rule)
        )
    pre = np.repeat(np.arange(N_EXC, N), FAN_OUT)
    conn = nj.connect.from_arrays(pre, inh_targets.reshape(-1), W_INH, N, N, allow_multapses=True)
    projections.append(nj.Projection("N", "N", conn, synapse=nj.Delta(), delay=1.0))
    exc = np.arange(N) < N_EXC
    neuron = nj.Izhikevich(
        a=np.where(exc, 0.02, 0.1), b=0.2, c=-65.0, d=np.where(exc, 8.0, 2.0),
        method=neuron_method,
    )  # fmt: skip
    net = nj.Network({"N": (neuron, N)}, projections, dt=DT)
    # the chosen synapse: a random excitatory neuron's random excitatory target that it
    # reaches through one synapse only
    while True:
        n1 = int(rng.integers(N_EXC))
        m = int(rng.integers(FAN_OUT))
        n2 = int(exc_targets[n1, m])
        if n2 < N_EXC and n2 != n1 and np.sum(exc_targets[n1] == n2) == 1:
            break
    proj = m // per_delay
    p = net.projections[proj]
    indptr, indices = np.asarray(p.indptr), np.asarray(p.indices)
    row = np.arange(indptr[n1], indptr[n1 + 1])
    index = int(row[indices[row] == n2][0])
    return Experiment(net, rule, n1, n2, proj + 1, proj, index, rng)


def init_state(exp: Experiment):
    """All neurons at rest (`v = -65`, `u = b v`), the chosen synapse at weight 0."""
    state = exp.net.init_state()
    w = state.plastic[exp.proj].weights
    return eqx.tree_at(lambda s: s.plastic[exp.proj].weights, state, w.at[exp.index].set(0.0))


def random_input(rng: np.random.Generator, n_steps: int, kind: str = "kick") -> np.ndarray:
    """The random input, `(n_steps, N)` float32. `"kick"`: every step one random neuron gets
    `INPUT` (the paper's description); `"noise"`: every neuron gets `13 (U - 0.5)`, `U`
    uniform in [0, 1), every step (the author's daspnet.m)."""
    if kind == "noise":
        return (NOISE * (rng.random((n_steps, N)) - 0.5)).astype(np.float32)
    if kind != "kick":
        raise ValueError(f"random_input: kind must be 'kick' or 'noise', got {kind!r}")
    x = np.zeros((n_steps, N), np.float32)
    x[np.arange(n_steps), rng.integers(0, N, n_steps)] = INPUT
    return x


def dopamine(rewards, start: int, n_steps: int) -> np.ndarray:
    """`d` on steps `start .. start + n_steps - 1`: `(DA_TONIC + DA) * DA_SCALE` with `DA` the
    sum of `DA_JUMP exp(-(t - r) / TAU_D)` over the rewards `r <= t` [ms]."""
    t = start + np.arange(n_steps, dtype=np.float64)
    da = np.zeros(n_steps)
    for r in rewards:
        m = t >= r
        da[m] += DA_JUMP * np.exp(-(t[m] - r) / TAU_D)
    return ((DA_TONIC + da) * DA_SCALE).astype(np.float32)


def earned_rewards(pre_steps, post_steps, delay, last_arrival, interval=INTERVAL):
    """The spikes of `n2` (`post_steps`, sorted) that come `1 .. interval` steps after the
    latest arrival of a spike of `n1` (`pre_steps + delay`; `last_arrival` is the latest
    arrival before them, or -inf). A spike emitted on step `k` arrives on step `k + delay`
    (the step whose STDP sees it) and drives the target from step `k + delay + 1`."""
    arrivals = np.concatenate([[-np.inf, last_arrival], np.asarray(pre_steps, np.float64) + delay])
    post = np.asarray(post_steps, np.float64)
    latest = arrivals[np.searchsorted(arrivals, post, side="left") - 1]
    lag = post - latest
    return post[(lag >= 1) & (lag <= interval)].astype(np.int64)


def make_runner(exp: Experiment):
    """The compiled run of one chunk: `(state, inputs) -> (state, rec)`."""
    return jax.jit(lambda s, x: nj.simulate(exp.net, s, x, dt=DT))


def run_chunk(exp: Experiment, runner, state, sec: int, extra=None):
    """Simulate second `sec` (steps `sec * CHUNK ..`); schedule the rewards it earns.
    `extra` (optional, `(CHUNK, N)`) is added to the random input. Returns the new state, the
    spikes `(CHUNK, N)` and the dopamine series used."""
    start = sec * CHUNK
    d = dopamine([r for r in exp.rewards if r < start + CHUNK], start, CHUNK)
    x = random_input(exp.rng, CHUNK, exp.input)
    if extra is not None:
        x = x + np.asarray(extra, np.float32)
    x = {"N": x, "dopamine": d}
    state, rec = runner(state, x)
    spikes = np.asarray(rec.spikes["N"])
    pre = np.flatnonzero(spikes[:, exp.n1]) + start
    post = np.flatnonzero(spikes[:, exp.n2]) + start
    for k in earned_rewards(pre, post, exp.delay, exp.last_arrival):
        exp.earned.append(int(k))
        exp.rewards.append(int(k) + int(exp.rng.integers(REWARD_DELAY[0] + 1, REWARD_DELAY[1] + 1)))
    if len(pre):
        exp.last_arrival = float(pre[-1] + exp.delay)
    return state, spikes, d


def excitatory_weights(exp: Experiment, state) -> np.ndarray:
    """Every excitatory synapse's weight brought to the present; the chosen one is first."""
    ws = [np.asarray(exp.rule.current_weights(s, DT)) for s in state.plastic if s is not None]
    chosen = ws[exp.proj][exp.index]
    ws[exp.proj] = np.delete(ws[exp.proj], exp.index)
    return np.concatenate([[chosen], *ws])


def run(
    seconds: int,
    seed: int = 0,
    every: int = 60,
    verbose: bool = True,
    save=None,
    input="noise",
    neuron="spnet",
):
    """Run the experiment for `seconds` of model time. Returns a dict: `t` [s] and `chosen`
    (the chosen synapse's weight at the end of every second), `others` (the other excitatory
    weights every `every` s, one row per sample, `t_others` their times), `rate` (the mean
    rate of every second [Hz], excitatory and inhibitory), `rewards` (their times [ms]),
    `wall` (seconds of wall time per chunk, compilation excluded) and the experiment. With
    `save` (a path), the arrays so far are written there (`np.savez`) at every sample;
    `neuron` is the Izhikevich scheme (see `build`)."""
    exp = build(seed, neuron_method=neuron)
    if input not in ("kick", "noise"):
        raise ValueError(f"run: input must be 'kick' or 'noise', got {input!r}")
    exp.input = input
    runner = make_runner(exp)
    state = init_state(exp)
    t0 = time.perf_counter()
    runner.lower(state, {"N": random_input(np.random.default_rng(0), CHUNK),
                         "dopamine": dopamine([], 0, CHUNK)}).compile()  # fmt: skip
    compile_s = time.perf_counter() - t0
    chosen, others, t_others, rate, wall = [], [], [], [], []
    for sec in range(seconds):
        t1 = time.perf_counter()
        state, spikes, _ = run_chunk(exp, runner, state, sec)
        w = excitatory_weights(exp, state) if (sec + 1) % every == 0 else None
        chosen.append(float(exp.rule.current_weights(state.plastic[exp.proj], DT)[exp.index]))
        wall.append(time.perf_counter() - t1)
        rate.append((spikes[:, :N_EXC].mean() * 1e3, spikes[:, N_EXC:].mean() * 1e3))
        if w is not None:
            others.append(w[1:])
            t_others.append(sec + 1)
            if save:
                np.savez(save, **_arrays(sec + 1, chosen, others, t_others, rate, exp, wall))
            if verbose:
                o = w[1:]
                q50, q99 = np.quantile(o, [0.5, 0.99])
                print(
                    f"t={sec + 1:5d} s  chosen w={chosen[-1]:.3f}  others mean={o.mean():.3f} "
                    f"median={q50:.3f} q99={q99:.3f} max={o.max():.3f}  "
                    f"rewards={len(exp.rewards)}  rate E={rate[-1][0]:.2f} "
                    f"I={rate[-1][1]:.2f} Hz  wall/s={np.mean(wall[-every:]):.3f}",
                    flush=True,
                )
    out = _arrays(seconds, chosen, others, t_others, rate, exp, wall)
    return {**out, "compile_s": compile_s, "exp": exp}


def _arrays(seconds, chosen, others, t_others, rate, exp, wall):
    return {
        "t": np.arange(1, seconds + 1),
        "chosen": np.array(chosen),
        "others": np.array(others),
        "t_others": np.array(t_others),
        "rate": np.array(rate),
        "rewards": np.array(exp.rewards),
        "wall": np.array(wall),
    }


def plot(result, path: str) -> None:
    """The paper's Fig. 1 panels: the chosen synapse's weight over time with the rewards, and
    the final distribution of the excitatory weights with the chosen one marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6), width_ratios=(2, 1))
    t_min = result["t"] / 60.0
    a.plot(t_min, result["chosen"], lw=1.0, label="rewarded synapse")
    if len(result["others"]):
        a.plot(result["t_others"] / 60.0, result["others"].mean(axis=1), lw=1.0,
               label="others, mean")  # fmt: skip
    r = result["rewards"] / 6e4
    a.plot(r, np.zeros_like(r), "|", color="tab:red", ms=6, label="rewards")
    a.set_xlabel("time [min]")
    a.set_ylabel("weight")
    a.set_ylim(-0.2, W_MAX + 0.2)
    a.legend(loc="upper left", fontsize=8)
    if len(result["others"]):
        b.hist(result["others"][-1], bins=np.linspace(0, W_MAX, 81), color="tab:gray")
        b.axvline(result["chosen"][-1], color="tab:red", lw=1.0, label="rewarded")
        b.set_yscale("log")
    b.set_xlabel("weight (end)")
    b.set_ylabel("excitatory synapses")
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.16, top=0.95, wspace=0.3)
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=3600, help="model time [s]")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--neuron", default="spnet", choices=("spnet", "published"), help="Izhikevich scheme"
    )
    parser.add_argument("--every", type=int, default=60, help="print every N s")
    parser.add_argument("--plot", default=None, help="save the figure here")
    parser.add_argument("--input", default="noise", choices=("kick", "noise"), help="random input")
    parser.add_argument("--save", default=None, help="write the arrays here (.npz) as it runs")
    parser.add_argument("--replot", default=None, help="only plot a saved .npz to --plot")
    args = parser.parse_args(argv)
    if args.replot:
        if not args.plot:
            parser.error("--replot needs --plot PATH")
        plot(dict(np.load(args.replot)), args.plot)
        return
    if args.seconds < 1 or args.every < 1:
        parser.error(f"--seconds and --every must be >= 1, got {args.seconds}, {args.every}")
    res = run(args.seconds, args.seed, min(args.every, args.seconds), save=args.save,
              input=args.input, neuron=args.neuron)  # fmt: skip
    exp = res["exp"]
    print(
        f"chosen synapse {exp.n1} -> {exp.n2} (delay {exp.delay} ms); final weight "
        f"{res['chosen'][-1]:.3f}; {len(res['rewards'])} rewards; mean rate "
        f"E {res['rate'][:, 0].mean():.2f} Hz, I {res['rate'][:, 1].mean():.2f} Hz"
    )
    print(
        f"compile {res['compile_s']:.1f} s; wall {res['wall'].sum():.1f} s for {args.seconds} "
        f"s of model time ({1e3 * res['wall'].mean() / CHUNK:.3f} ms per ms)"
    )
    if args.plot:
        plot(res, args.plot)


if __name__ == "__main__":
    main()
