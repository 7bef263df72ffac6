"""A NumPy re-implementation of the author's program for the distal reward network.

Independent of neurojax: a step-by-step reading of E. M. Izhikevich's published MATLAB
program daspnet.m (izhikevich.org/publications/dastdp, the code of Fig. 1 of "Solving the
distal reward problem through linkage of STDP and dopamine signaling", Cerebral Cortex 17,
2007), written again here with the synapses vectorised. What one step `t` does, in the
program's order:

1. input `13 (U - 0.5)` for every neuron; the neurons with `v >= 30` fire and are reset;
2. their trace is set to 0.1 (the trace of every neuron decays by 0.95 per ms);
3. potentiation: for each incoming excitatory synapse of a fired neuron, `sd += ` the
   presynaptic trace at time `t - g`, `g` the synapse's delay group (1..D);
4. the spikes emitted on steps `t - D + 1 .. t` are delivered through the synapses of group
   `t - t_spike + 1` (the current joins this step's `v` update) and depress them:
   `sd -= 1.5 *` the postsynaptic trace at time `t`;
5. `v` in two 0.5 ms halves, `u`, the trace decay, `DA *= 0.995`;
6. every 10 ms: `w = clip(w + (0.002 + DA) sd, 0, 4)` for the excitatory synapses, `sd *=
   0.99`;
7. a spike of `n2` less than 20 ms after the latest spike of `n1` (and strictly after it)
   schedules a reward `1000 + ceil(2000 U)` ms later; on that step `DA += 0.5`.

`D = 1` is the program (all synapses of 1 ms); `D = 20` the paper's 1-20 ms (five synapses
of each delay per neuron). In the program a neuron's current to a target it reaches twice
is written, not summed (MATLAB's `I(ind) = I(ind) + s` with a repeated index keeps the last
value): `duplicates="last"` does the same, `"sum"` adds every synapse (neurojax's behaviour).

Run: `python -m benchmarks.peers.daspnet_numpy [--seconds 3600] [--seed 0] [--delays 1]
[--save NPZ]`.
"""

import argparse
import time

import numpy as np

NE, NI = 800, 200
N = NE + NI
M = 100  # synapses per neuron
W_MAX = 4.0
INTERVAL = 20


def _check(name, value, allowed, ok):
    if not ok:
        raise ValueError(f"daspnet: {name} must be {allowed}, got {value!r}")


class Daspnet:
    """The network and its state. `post[i, m]` is neuron `i`'s `m`-th target, `s` the
    weights, `sd` the eligibilities (both `(N, M)`), `group[m]` the delay of column `m`.

    Args:
        seed: seeds the connectivity, the choice of the rewarded synapse and the input.
        delays: `D`, the number of delay groups (a divisor of 100): 1 as in the program,
            20 as in the paper.
        duplicates: `"last"` (the program) or `"sum"` for repeated targets of one neuron.
        post: optional `(N, M)` targets (0-based) to use instead of random ones.
        chosen: optional `(n1, m)`: the rewarded synapse is `post[n1, m]`.
        shift: 1 adds a ms to every delay (neurojax's delay 1 acts one step later than the
            program's: its spike drives the target from the second step after it).
        halves: 2: `v` advanced in two 0.5 ms halves (the program); 1: one 1 ms Euler step
            (as `nj.Izhikevich(method="published")` at `dt = 1`).
    """

    def __init__(
        self, seed=0, delays=1, duplicates="last", post=None, chosen=None, halves=2, shift=0
    ):
        ok = isinstance(delays, int) and not isinstance(delays, bool) and delays >= 1
        _check("delays", delays, "a divisor of 100", ok and M % delays == 0)
        _check("halves", halves, "1 or 2", halves in (1, 2))
        self.halves = halves
        _check("duplicates", duplicates, "'last' or 'sum'", duplicates in ("last", "sum"))
        self.rng = np.random.default_rng(seed)
        if post is None:
            post = np.concatenate(
                [self.rng.integers(0, N, (NE, M)), self.rng.integers(0, NE, (NI, M))]
            )
        post = np.asarray(post, np.int64)
        _check("post", post.shape, f"of shape {(N, M)}", post.shape == (N, M))
        self.post, self.duplicates = post, duplicates
        _check("shift", shift, "0 or 1", shift in (0, 1))
        self.group = np.arange(M) // (M // delays) + 1 + shift  # delay of column m [ms]
        self.D = delays = delays + shift  # the longest delay
        self.a = np.where(np.arange(N) < NE, 0.02, 0.1)
        self.d = np.where(np.arange(N) < NE, 8.0, 2.0)
        self.s = np.where(np.arange(N)[:, None] < NE, 1.0, -1.0) * np.ones((1, M))
        self.sd = np.zeros((N, M))
        # incoming excitatory synapses of each neuron: flat index, presynaptic neuron, delay
        flat = np.flatnonzero((np.arange(N)[:, None] < NE) & np.ones((1, M), bool))
        tgt = post.reshape(-1)[flat]
        order = np.argsort(tgt, kind="stable")
        flat, tgt = flat[order], tgt[order]
        bounds = np.searchsorted(tgt, np.arange(N + 1))
        self.inc = [flat[bounds[i] : bounds[i + 1]] for i in range(N)]
        if chosen is None:
            while True:
                n1, m = int(self.rng.integers(NE)), int(self.rng.integers(M))
                n2 = int(post[n1, m])
                if n2 < NE and n2 != n1 and np.sum(post[n1] == n2) == 1:
                    break
        else:
            n1, m = chosen
        self.n1, self.syn, self.n2 = n1, m, int(post[n1, m])
        self.s[n1, m] = 0.0
        self.v = np.full(N, -65.0)
        self.u = 0.2 * self.v
        self.trace = np.zeros((delays + 1, N))  # trace[k % (D+1)]: the trace at time k
        self.recent = [[] for _ in range(delays)]  # fired neurons of the last D steps
        self.t = 0
        self.DA = 0.0
        self.rewards, self.earned, self._due = [], [], {}
        self.n1_last, self.n_spikes = -(10**9), np.zeros(N, np.int64)

    def step(self, I):
        """One ms with the external input `I` (`(N,)`); returns the fired neurons."""
        t, D = self.t, self.D
        fired = np.flatnonzero(self.v >= 30.0)
        self.v[fired] = -65.0
        self.u[fired] += self.d[fired]
        now = self.trace[t % (D + 1)]
        now[fired] = 0.1
        for i in fired:  # potentiation: the presynaptic trace at t - delay
            syn = self.inc[i]
            g = self.group[syn % M]
            self.sd.flat[syn] += self.trace[(t - g) % (D + 1), syn // M]
        self.recent = [fired] + self.recent[:-1]
        I = np.array(I, np.float64)
        for j, spk in enumerate(self.recent):  # spikes of step t - j: delay group j + 1
            cols = np.flatnonzero(self.group == j + 1)
            for n in spk:
                tg = self.post[n, cols]
                if self.duplicates == "last":
                    I[tg] = I[tg] + self.s[n, cols]
                else:
                    np.add.at(I, tg, self.s[n, cols])
                self.sd[n, cols] -= 1.5 * now[tg]
        v, u = self.v, self.u
        for _ in range(self.halves):
            v += (1.0 / self.halves) * ((0.04 * v + 5.0) * v + 140.0 - u + I)
        u += self.a * (0.2 * v - u)
        self.trace[(t + 1) % (D + 1)] = 0.95 * now
        self.DA *= 0.995
        if (t + 1) % 10 == 0:
            e = self.s[:NE] + (0.002 + self.DA) * self.sd[:NE]
            self.s[:NE] = np.clip(e, 0.0, W_MAX)
            self.sd *= 0.99
        if self.n1 in fired:
            self.n1_last = t
        if self.n2 in fired and 0 < t - self.n1_last < INTERVAL:
            self.earned.append(t)
            r = t + 1000 + int(np.ceil(2000 * self.rng.random()))
            self.rewards.append(r)
            self._due[r] = self._due.get(r, 0) + 1
        self.DA += 0.5 * self._due.pop(t, 0)
        self.n_spikes[fired] += 1
        self.t = t + 1
        return fired

    def run(self, steps, inputs=None):
        """`steps` ms; `inputs` (`(steps, N)`) or, by default, the program's `13 (U - 0.5)`.
        Returns the spike raster `(steps, N)` bool."""
        raster = np.zeros((steps, N), bool)
        for k in range(steps):
            I = inputs[k] if inputs is not None else 13.0 * (self.rng.random(N) - 0.5)
            raster[k, self.step(I)] = True
        return raster

    def others(self):
        """The weights of every excitatory synapse but the rewarded one."""
        w = self.s[:NE].copy().reshape(-1)
        return np.delete(w, self.n1 * M + self.syn)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=int, default=3600)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--delays", type=int, default=1)
    p.add_argument("--duplicates", default="last", choices=("last", "sum"))
    p.add_argument("--halves", type=int, default=2, choices=(1, 2))
    p.add_argument("--every", type=int, default=300)
    p.add_argument("--save", default=None)
    a = p.parse_args(argv)
    net = Daspnet(a.seed, a.delays, a.duplicates, halves=a.halves)
    t0, traj = time.perf_counter(), []
    for sec in range(a.seconds):
        net.run(1000)
        traj.append(net.s[net.n1, net.syn])
        if (sec + 1) % a.every == 0 or sec + 1 == a.seconds:
            o = net.others()
            q = np.percentile(o, [50, 95, 99])
            rate = net.n_spikes.sum() / N / (sec + 1)
            print(
                f"{sec + 1:5d} s  w={traj[-1]:.3f}  others median {q[0]:.3f} p95 {q[1]:.3f}"
                f" p99 {q[2]:.3f} >3.6 {np.mean(o > 3.6):.4f}  rewards {len(net.rewards)}"
                f"  rate {rate:.2f} Hz  wall {time.perf_counter() - t0:.0f} s",
                flush=True,
            )
            if a.save:
                np.savez(a.save, chosen=np.array(traj), others=o, rewards=np.array(net.rewards))


if __name__ == "__main__":
    main()
