r"""Assembly calculus in "sparse mode", in plain vectorised NumPy (the NumPy peer).

This is the reference-faithful peer that the JAX assembly-calculus code is timed and
statistically compared against. It follows the sparse simulation of Papadimitriou et al.
(2020) as implemented in `dmitropolsky/assemblies` (`brain.py`, non-explicit areas), written
anew with NumPy array operations instead of Python loops over synapses.

## Model

A brain has areas of `n` neurons of which at most `k` fire per step (the cap), and stimuli
of `k_s` neurons that always fire together. Every ordered pair (stimulus -> area and
area -> area, self-pairs included) is a random graph with independent Bernoulli(`p`)
synapses of initial weight 1. One step computes, for each target area, the synaptic input
every neuron receives from the neurons that fired at the previous step, keeps the `k` with
the largest input (ties go to the lower index), and multiplies every synapse from a neuron
that fired at the previous step onto a neuron that fires now by `1 + beta`.

## Sparse representation

Only the `w` neurons of an area that have ever fired (its *support*) are stored, labelled
`0 .. w-1` in order of first firing. A stimulus -> area connectome is a float32 vector of
length `w` (the summed weight from all `k_s` stimulus neurons, since they always fire
together); an area -> area connectome is a float32 matrix `(w_src, w_tgt)`. The
`n - w` never-fired neurons of a target are not stored: their inputs are i.i.d.
Binomial(`total_k`, `p`), and only the `k` largest of them can enter the cap, so the step
draws `k` values from the normal approximation of the upper tail of that binomial:

$$
q = \frac{n_{eff} - k}{n_{eff}},\quad n_{eff} = n - w,\quad
\alpha = F^{-1}_{\mathrm{Bin}(K, p)}(q),\quad \mu = K p,\quad \sigma = \sqrt{K p (1-p)}
$$
$$
x_{new} = \mathrm{round}\big(\mu + \sigma Z\big),\quad
Z \sim \mathcal N(0, 1) \text{ truncated to } \big[(\alpha - \mu)/\sigma,\ (K - \mu)/\sigma\big],
$$

where `K = total_k` is the number of presynaptic neurons that fire into the target (the
firing stimuli's sizes plus the firing source areas' winner counts).

## One step (`NumpyBrain.project`)

All targets update synchronously from the *previous* winners of their sources; every input
and every random draw of a step uses the state from before the step, and the connectomes
grow afterwards, so the result does not depend on the order in which targets are listed.
For each target `t` that is not fixed:

1. inputs of the support: the firing stimuli's vectors plus, for each firing source area,
   the sum of the rows of `W[src][t]` at the source's winners;
2. `k` candidate inputs of never-fired neurons from the truncated normal above, rounded;
3. k-cap over `[support inputs, candidates]`, ties to the lower index; the winning
   candidates become new support neurons `w, w+1, ...` in the order of the cap's
   descending list;
4. a new neuron with input `m` gets its `m` presynaptic partners as a uniform subset of the
   `K` firing neurons (so the split over the firing sources is multivariate
   hypergeometric): its weight from a firing stimulus is that stimulus's share, and its
   column in `W[src][t]` holds ones at that many uniformly chosen winners of `src` and
   Bernoulli(`p`) entries at the other support neurons of `src`.

A fixed target keeps its winners and gains no neurons. Every other synapse that comes into
existence because a support grows is Bernoulli(`p`): stimuli that did not fire into `t` get
Binomial(`k_s`, `p`) weights onto its new neurons (the reference code leaves those vectors
short, which breaks a later projection of that stimulus), new rows of `t` onto every area
and new columns from areas that did not fire into `t` are Bernoulli(`p`), including the
block between the new neurons of two areas that both grew. Finally (unless
`plasticity=False`) the Hebbian update multiplies, for every firing source, the synapses
from its previous winners onto all of the target's winners of this step (first-time winners
included) by `1 + beta[source, target]`.

## Departures from the reference code

- stimulus vectors of non-firing stimuli are extended (see above), and growth happens after
  all targets are computed, so new-row x new-column blocks are Bernoulli(`p`) and the
  random stream does not depend on dictionary order (targets and their sources are always
  processed in the order the areas and stimuli were declared);
- the split of a new neuron's input over its sources is drawn directly from the
  multivariate hypergeometric distribution (a chain of hypergeometric draws) rather than by
  sampling `m` indices and counting: the same distribution, vectorised;
- when the binomial quantile equals `total_k` (tiny inputs only) the truncated normal is a
  point mass at `total_k`; the reference's scipy call fails there;
- bad inputs raise `ValueError` before any state changes.

Example:

```python
brain = NumpyBrain({"A": (100_000, 317)}, {"stim": 317}, p=0.01, beta=0.05, seed=0)
brain.project(stimuli={"stim": ["A"]})
for _ in range(24):
    brain.project(stimuli={"stim": ["A"]}, areas={"A": ["A"]})
brain.support["A"], brain.new_winners["A"]   # about 1250 and 0
```

Run `python -m benchmarks.peers.assembly_numpy [SPEC_JSON]` to time `run_projection`
(defaults: `n=100000, k=317, p=0.01, beta=0.05, steps=100, seed=0, repeats=3`); it prints
one JSON line.

References:
    C. H. Papadimitriou, S. S. Vempala, D. Mitropolsky, M. Collins, W. Maass (2020),
    "Brain computation by assemblies of neurons", PNAS 117(25):14464-14472.
    Reference code: https://github.com/dmitropolsky/assemblies (`brain.py`).
"""

import math
import numbers
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.stats import binom, truncnorm

__all__ = [
    "NumpyBrain",
    "candidate_threshold",
    "sample_candidate_inputs",
    "k_cap",
    "split_inputs",
    "run_projection",
]


def candidate_threshold(n_eff: int, k: int, total_k: int, p: float) -> float:
    r"""Input threshold `alpha` above which a never-fired neuron can reach the cap.

    $\alpha = F^{-1}_{\mathrm{Bin}(K, p)}\big((n_{eff} - k)/n_{eff}\big)$, the binomial
    quantile that leaves `k` of the `n_eff` never-fired neurons above it on average.

    Args:
        n_eff: number of never-fired neurons of the target (`n - w`), `> k`.
        k: cap of the target.
        total_k: number of presynaptic neurons firing into the target (`K`).
        p: connection probability.

    Returns:
        `alpha` as a float (an integer value, as scipy's `binom.ppf` returns it).
    """
    return float(binom.ppf((n_eff - k) / n_eff, total_k, p))


def sample_candidate_inputs(
    n_eff: int, k: int, total_k: int, p: float, rng: np.random.Generator
) -> np.ndarray:
    r"""Draw the inputs of the `k` best never-fired neurons (the sparse-mode approximation).

    $x = \mathrm{round}(\mu + \sigma Z)$ with $\mu = Kp$, $\sigma = \sqrt{Kp(1-p)}$ and
    $Z$ standard normal truncated to $[(\alpha - \mu)/\sigma, (K - \mu)/\sigma]$, `alpha`
    from `candidate_threshold`. When `alpha == K` the interval is empty and every candidate
    receives the maximal input `K`.

    Args:
        n_eff: never-fired neurons of the target (`n - w`), `> k`.
        k: cap of the target (number of candidates drawn).
        total_k: presynaptic neurons firing into the target, `>= 1`.
        p: connection probability in (0, 1).
        rng: NumPy random generator.

    Returns:
        float64 array of shape `(k,)` holding integer values in `[alpha, total_k]`.
    """
    alpha = candidate_threshold(n_eff, k, total_k, p)
    mu = total_k * p
    sd = math.sqrt(total_k * p * (1.0 - p))
    if alpha >= total_k:
        return np.full(k, float(total_k))
    a = (alpha - mu) / sd
    b = (total_k - mu) / sd
    draws = truncnorm.rvs(a, b, loc=mu, scale=sd, size=k, random_state=rng)
    return np.round(np.asarray(draws, dtype=np.float64))


def k_cap(inputs: np.ndarray, k: int) -> np.ndarray:
    """Indices of the `k` largest `inputs`, largest first, ties to the lower index.

    The same order as `heapq.nlargest(k, range(len(inputs)), inputs.__getitem__)` (a stable
    descending sort). Everything at or above the `k`-th largest value is found with a
    partition, then only those are sorted.

    Args:
        inputs: 1-D array of inputs.
        k: number of winners, `1 <= k`; if `k >= len(inputs)` all indices are returned.

    Returns:
        int64 array of `min(k, len(inputs))` indices.
    """
    neg = -np.asarray(inputs)
    size = neg.shape[0]
    if k >= size:
        return np.argsort(neg, kind="stable").astype(np.int64)
    kth = np.partition(neg, k - 1)[k - 1]
    # every index at or above the k-th value, in increasing index order, so that a stable
    # sort of their values breaks ties toward the lower index
    contenders = np.flatnonzero(neg <= kth)
    order = np.argsort(neg[contenders], kind="stable")[:k]
    return contenders[order].astype(np.int64)


def split_inputs(m: np.ndarray, sizes: list[int], rng: np.random.Generator) -> np.ndarray:
    """Split each new neuron's input over the firing sources (multivariate hypergeometric).

    A neuron with input `m` has `m` presynaptic partners forming a uniform subset of the
    `sum(sizes)` firing neurons, laid out in blocks of `sizes` (firing stimuli first, then
    firing source areas). The per-block counts are drawn as a chain of hypergeometric
    draws: block `b` takes `Hypergeometric(sizes[b], rest, remaining)` of the remaining
    partners, and the last block takes what is left.

    Args:
        m: integer-valued array `(f,)` of inputs, each in `[0, sum(sizes)]`.
        sizes: block sizes, each `>= 1`.
        rng: NumPy random generator.

    Returns:
        int64 array `(f, len(sizes))` whose rows sum to `m`.
    """
    remaining = np.asarray(m).astype(np.int64)
    counts = np.empty((remaining.shape[0], len(sizes)), dtype=np.int64)
    if remaining.shape[0] == 0:
        return counts
    pool = int(sum(sizes))
    for b, size in enumerate(sizes[:-1]):
        pool -= size
        got = rng.hypergeometric(size, pool, remaining).astype(np.int64)
        counts[:, b] = got
        remaining = remaining - got
    counts[:, -1] = remaining
    return counts


@dataclass
class _Plan:
    """What one target does in a step, computed from the state before the step."""

    stims: list[str]
    srcs: list[str]
    winners: np.ndarray  # new winner labels of the target, cap order
    n_first: int = 0
    stim_cols: dict[str, np.ndarray] = field(default_factory=dict)  # (f,) float32
    area_cols: dict[str, np.ndarray] = field(default_factory=dict)  # (w_src, f) float32


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _names(value: Any, what: str) -> list[str]:
    """A list of names from a list/tuple/set, refusing a bare string."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValueError(
            f"project: {what} must be a list of area names, got {value!r} "
            f"(write [{value!r}] for a single area)"
        )
    names = list(value)
    if len(set(names)) != len(names):
        raise ValueError(f"project: {what} lists an area twice: {names!r}")
    return names


class NumpyBrain:
    r"""A brain of sparse-mode areas and stimuli (assembly calculus, NumPy peer).

    See the module docstring for the model and the step. State is stored on the object and
    mutated by `project`, `set_winners`, `fix` and `unfix` (this is a NumPy reference, not a
    neurojax module).

    Args:
        areas: `{name: (n, k)}`, `n` neurons with cap `k`, `1 <= k < n`; at least one area.
        stimuli: `{name: k_s}`, stimulus sizes `>= 1`; names distinct from area names.
        p: connection probability, `0 < p < 1`.
        beta: plasticity, either one number for every synapse type, or a dict whose keys are
            area names (the default for all synapses *into* that area) and/or
            `(source, target)` tuples (`source` a stimulus or area name); a tuple key wins
            over an area key, and every `(source, target)` pair must be covered. Each value
            is finite and `> -1` (weights are multiplied by `1 + beta`).
        seed: seed of the NumPy generator, an int `>= 0`.

    Attributes (read-only copies):
        winners: `{area: int64 labels}` of the last step (empty before the first).
        support: `{area: w}`, neurons that have ever fired.
        new_winners: `{area: first-time winners in the last step that updated the area}`.
        fixed: `{area: bool}`.

    Example:
        ```python
        brain = NumpyBrain({"A": (10_000, 100)}, {"s": 100}, p=0.05, seed=1)
        brain.project(stimuli={"s": ["A"]})
        brain.project(stimuli={"s": ["A"]}, areas={"A": ["A"]})
        ```
    """

    def __init__(
        self,
        areas: dict[str, tuple[int, int]],
        stimuli: dict[str, int],
        p: float,
        beta: float | dict = 0.05,
        seed: int = 0,
    ) -> None:
        if not isinstance(areas, Mapping) or len(areas) == 0:
            raise ValueError(
                f"NumpyBrain: areas must be a non-empty dict {{name: (n, k)}}, got {areas!r}"
            )
        if not isinstance(stimuli, Mapping):
            raise ValueError(f"NumpyBrain: stimuli must be a dict {{name: size}}, got {stimuli!r}")
        self._n: dict[str, int] = {}
        self._k: dict[str, int] = {}
        for name, nk in areas.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"NumpyBrain: area names must be non-empty strings, got {name!r}")
            if not isinstance(nk, (tuple, list)) or len(nk) != 2:
                raise ValueError(f"NumpyBrain: areas[{name!r}] must be a pair (n, k), got {nk!r}")
            n, k = nk
            if not (_is_int(n) and _is_int(k)) or not 1 <= k < n:
                raise ValueError(
                    f"NumpyBrain: areas[{name!r}] = (n, k) must be integers with "
                    f"1 <= k < n, got {nk!r}"
                )
            self._n[name], self._k[name] = int(n), int(k)
        self._stim_size: dict[str, int] = {}
        for name, size in stimuli.items():
            if not isinstance(name, str) or not name:
                raise ValueError(
                    f"NumpyBrain: stimulus names must be non-empty strings, got {name!r}"
                )
            if name in self._n:
                raise ValueError(
                    f"NumpyBrain: stimulus name {name!r} is also an area name; "
                    "names must be distinct"
                )
            if not _is_int(size) or size < 1:
                raise ValueError(
                    f"NumpyBrain: stimuli[{name!r}] must be an integer >= 1, got {size!r}"
                )
            self._stim_size[name] = int(size)
        if not _is_real(p) or not 0.0 < p < 1.0:
            raise ValueError(f"NumpyBrain: p must be a number in (0, 1), got {p!r}")
        if not _is_int(seed) or seed < 0:
            raise ValueError(f"NumpyBrain: seed must be an integer >= 0, got {seed!r}")
        self._p = float(p)
        self._areas = list(self._n)
        self._stims = list(self._stim_size)
        self._beta = self._resolve_beta(beta)
        self._rng = np.random.default_rng(int(seed))

        self._w = {a: 0 for a in self._areas}
        self._cap = {a: 0 for a in self._areas}
        self._winners = {a: np.zeros(0, dtype=np.int64) for a in self._areas}
        self._new_winners = {a: 0 for a in self._areas}
        self._fixed = {a: False for a in self._areas}
        # Buffers with spare capacity; only [:w] (vectors) and [:w_src, :w_tgt] are valid.
        self._stim_w = {
            (s, a): np.zeros(0, dtype=np.float32) for s in self._stims for a in self._areas
        }
        self._W = {
            (s, t): np.zeros((0, 0), dtype=np.float32) for s in self._areas for t in self._areas
        }

    # ------------------------------------------------------------------ set-up helpers
    def _resolve_beta(self, beta: Any) -> dict[tuple[str, str], float]:
        def check(value: Any, where: str) -> float:
            if not _is_real(value) or not math.isfinite(value) or value <= -1.0:
                raise ValueError(f"NumpyBrain: {where} must be a finite number > -1, got {value!r}")
            return float(value)

        sources = self._stims + self._areas
        if not isinstance(beta, Mapping):
            value = check(beta, "beta")
            return {(s, t): value for s in sources for t in self._areas}
        per_area: dict[str, float] = {}
        per_pair: dict[tuple[str, str], float] = {}
        for key, value in beta.items():
            if isinstance(key, str):
                if key not in self._n:
                    raise ValueError(
                        f"NumpyBrain: beta key {key!r} is not an area; string keys name "
                        f"the target area, one of {self._areas}"
                    )
                per_area[key] = check(value, f"beta[{key!r}]")
            elif isinstance(key, tuple) and len(key) == 2:
                src, tgt = key
                if src not in sources or tgt not in self._n:
                    raise ValueError(
                        f"NumpyBrain: beta key {key!r} must be (source, target) with "
                        f"source in {sources} and target in {self._areas}"
                    )
                per_pair[(src, tgt)] = check(value, f"beta[{key!r}]")
            else:
                raise ValueError(
                    f"NumpyBrain: beta keys must be area names or (source, target) "
                    f"tuples, got {key!r}"
                )
        table: dict[tuple[str, str], float] = {}
        missing = []
        for s in sources:
            for t in self._areas:
                if (s, t) in per_pair:
                    table[(s, t)] = per_pair[(s, t)]
                elif t in per_area:
                    table[(s, t)] = per_area[t]
                else:
                    missing.append((s, t))
        if missing:
            raise ValueError(
                f"NumpyBrain: beta has no value for {missing}; give the target area's "
                "name as a key (default for synapses into it) or the (source, target) pair"
            )
        return table

    def _check_area(self, area: Any, where: str) -> str:
        if area not in self._n:
            raise ValueError(f"{where}: unknown area {area!r}; areas are {self._areas}")
        return area

    # ------------------------------------------------------------------ public state
    @property
    def winners(self) -> dict[str, np.ndarray]:
        """`{area: int64 labels}` that fired at the last step (copies)."""
        return {a: w.copy() for a, w in self._winners.items()}

    @property
    def support(self) -> dict[str, int]:
        """`{area: w}`, the number of neurons that have ever fired."""
        return dict(self._w)

    @property
    def new_winners(self) -> dict[str, int]:
        """`{area: first-time winners in the last step that updated the area}`."""
        return dict(self._new_winners)

    @property
    def fixed(self) -> dict[str, bool]:
        """`{area: whether its assembly is fixed}`."""
        return dict(self._fixed)

    def beta(self, source: str, target: str) -> float:
        """Plasticity of the synapses from `source` (stimulus or area) into area `target`."""
        if (source, target) not in self._beta:
            raise ValueError(
                f"beta: ({source!r}, {target!r}) is not a (source, target) pair; sources "
                f"are {self._stims + self._areas}, targets {self._areas}"
            )
        return self._beta[(source, target)]

    def weights(self, source: str, target: str) -> np.ndarray:
        """A copy of the connectome from `source` into area `target`.

        Returns a float32 vector `(w_target,)` for a stimulus source (summed weight of the
        stimulus onto each support neuron) or a float32 matrix `(w_source, w_target)` for
        an area source.
        """
        self._check_area(target, "weights")
        wt = self._w[target]
        if source in self._stim_size:
            return self._stim_w[(source, target)][:wt].copy()
        if source in self._n:
            return self._W[(source, target)][: self._w[source], :wt].copy()
        raise ValueError(
            f"weights: unknown source {source!r}; sources are {self._stims + self._areas}"
        )

    def set_winners(self, area: str, labels: Any) -> None:
        """Make `labels` (distinct support labels, at most `k` of them) the area's winners."""
        self._check_area(area, "set_winners")
        arr = np.asarray(labels)
        if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(
                f"set_winners: labels must be a 1-D sequence of integers, got {labels!r}"
            )
        arr = arr.astype(np.int64)
        w, k = self._w[area], self._k[area]
        if arr.size and (arr.min() < 0 or arr.max() >= w):
            raise ValueError(
                f"set_winners: labels of area {area!r} must lie in [0, support={w}), "
                f"got min {arr.min()} and max {arr.max()}"
            )
        if np.unique(arr).size != arr.size:
            raise ValueError(f"set_winners: labels of area {area!r} must be distinct")
        if arr.size > k:
            raise ValueError(f"set_winners: area {area!r} has cap k={k}, got {arr.size} labels")
        self._winners[area] = arr.copy()

    def fix(self, area: str) -> None:
        """Freeze the area's winners: later steps keep them and add no new neurons."""
        self._check_area(area, "fix")
        if self._winners[area].size == 0:
            raise ValueError(f"fix: area {area!r} has no winners to fix")
        self._fixed[area] = True

    def unfix(self, area: str) -> None:
        """Let the area's winners change again."""
        self._check_area(area, "unfix")
        self._fixed[area] = False

    # ------------------------------------------------------------------ the step
    def project(
        self,
        stimuli: Mapping[str, Iterable[str]] | None = None,
        areas: Mapping[str, Iterable[str]] | None = None,
        plasticity: bool = True,
    ) -> None:
        """One synchronous step: fire `stimuli` and the current winners of `areas`' keys.

        Args:
            stimuli: `{stimulus: [target areas]}`.
            areas: `{source area: [target areas]}`; every source needs winners.
            plasticity: apply the Hebbian update (`False` leaves existing weights as they
                are; new synapses are still created).
        """
        stim_in, area_in = self._validate_projection(stimuli, areas, plasticity)
        targets = [a for a in self._areas if stim_in[a] or area_in[a]]
        plans = {t: self._plan(t, stim_in[t], area_in[t]) for t in targets}
        self._grow(plans)
        if plasticity:
            self._hebbian(plans)
        for t, plan in plans.items():
            self._winners[t] = plan.winners
            self._w[t] += plan.n_first
            self._new_winners[t] = plan.n_first

    def _validate_projection(
        self, stimuli: Any, areas: Any, plasticity: Any
    ) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        stimuli = {} if stimuli is None else stimuli
        areas = {} if areas is None else areas
        if not isinstance(stimuli, Mapping):
            raise ValueError(
                f"project: stimuli must be a dict {{stimulus: [areas]}}, got {stimuli!r}"
            )
        if not isinstance(areas, Mapping):
            raise ValueError(f"project: areas must be a dict {{source: [targets]}}, got {areas!r}")
        if not isinstance(plasticity, (bool, np.bool_)):
            raise ValueError(f"project: plasticity must be True or False, got {plasticity!r}")
        stim_in: dict[str, list[str]] = {a: [] for a in self._areas}
        area_in: dict[str, list[str]] = {a: [] for a in self._areas}
        for stim, targets in stimuli.items():
            if stim not in self._stim_size:
                raise ValueError(f"project: unknown stimulus {stim!r}; stimuli are {self._stims}")
            for t in _names(targets, f"stimuli[{stim!r}]"):
                stim_in[self._check_area(t, "project")].append(stim)
        for src, targets in areas.items():
            self._check_area(src, "project")
            names = _names(targets, f"areas[{src!r}]")
            if names and self._winners[src].size == 0:
                raise ValueError(
                    f"project: area {src!r} has no winners to project from; project a "
                    "stimulus into it or call set_winners first"
                )
            for t in names:
                area_in[self._check_area(t, "project")].append(src)
        # canonical (declaration) order makes the random stream independent of dict order
        stim_rank = {s: i for i, s in enumerate(self._stims)}
        area_rank = {a: i for i, a in enumerate(self._areas)}
        for t in self._areas:
            stim_in[t].sort(key=stim_rank.__getitem__)
            area_in[t].sort(key=area_rank.__getitem__)
            if (stim_in[t] or area_in[t]) and not self._fixed[t]:
                n_eff = self._n[t] - self._w[t]
                if n_eff <= self._k[t]:
                    raise ValueError(
                        f"project: area {t!r} has only n - w = {n_eff} never-fired "
                        f"neurons, not more than k = {self._k[t]}; sparse mode needs n - w > k"
                    )
        return stim_in, area_in

    def _plan(self, t: str, stims: list[str], srcs: list[str]) -> _Plan:
        """Inputs, cap and new synapses of target `t`, from the state before the step."""
        if self._fixed[t]:
            return _Plan(stims, srcs, self._winners[t].copy())
        rng, p = self._rng, self._p
        w, k = self._w[t], self._k[t]
        x = np.zeros(w, dtype=np.float32)
        for s in stims:
            x += self._stim_w[(s, t)][:w]
        for src in srcs:
            x += self._W[(src, t)][self._winners[src], :w].sum(axis=0, dtype=np.float32)
        sizes = [self._stim_size[s] for s in stims] + [self._winners[a].size for a in srcs]
        total_k = int(sum(sizes))
        candidates = sample_candidate_inputs(self._n[t] - w, k, total_k, p, rng)
        inputs = np.concatenate([x.astype(np.float64), candidates])
        order = k_cap(inputs, k)
        first = order >= w
        n_first = int(first.sum())
        m = inputs[order[first]]
        winners = order.copy()
        winners[first] = w + np.arange(n_first, dtype=np.int64)
        plan = _Plan(stims, srcs, winners, n_first)
        if n_first == 0:
            return plan
        counts = split_inputs(m, sizes, rng)
        for i, s in enumerate(stims):
            plan.stim_cols[s] = counts[:, i].astype(np.float32)
        cols = np.arange(n_first)
        for j, src in enumerate(srcs):
            c = counts[:, len(stims) + j]
            win = self._winners[src]
            block = (rng.random((self._w[src], n_first)) < p).astype(np.float32)
            block[win, :] = 0.0
            # each column: a uniform random permutation of the source winners; the first
            # c of it are the new neuron's partners
            perm = np.argsort(rng.random((win.size, n_first)), axis=0)
            chosen = np.arange(win.size)[:, None] < c[None, :]
            block[win[perm][chosen], np.broadcast_to(cols, perm.shape)[chosen]] = 1.0
            plan.area_cols[src] = block
        return plan

    def _reserve(self, area: str, needed: int) -> None:
        """Make room for `needed` support neurons in every buffer touching `area`."""
        cap = self._cap[area]
        if needed <= cap:
            return
        # grow by half: amortised O(1) copies per new neuron, at most a third of the buffer idle
        self._cap[area] = min(self._n[area], max(needed, cap + cap // 2, 2 * self._k[area]))
        for s in self._stims:
            old = self._stim_w[(s, area)]
            new = np.zeros(self._cap[area], dtype=np.float32)
            new[: self._w[area]] = old[: self._w[area]]
            self._stim_w[(s, area)] = new
        for (src, tgt), old in self._W.items():
            if area in (src, tgt):
                new = np.zeros((self._cap[src], self._cap[tgt]), dtype=np.float32)
                ws, wt = self._w[src], self._w[tgt]
                new[:ws, :wt] = old[:ws, :wt]
                self._W[(src, tgt)] = new

    def _grow(self, plans: dict[str, _Plan]) -> None:
        """Append the new neurons of every target that grew (old supports still in `_w`)."""
        rng, p = self._rng, self._p
        grown = {t: plan for t, plan in plans.items() if plan.n_first}
        for t, plan in grown.items():
            self._reserve(t, self._w[t] + plan.n_first)
        # columns: synapses from the old support of every source onto the new neurons
        for t, plan in grown.items():
            w, f = self._w[t], plan.n_first
            for s in self._stims:
                col = plan.stim_cols.get(s)
                if col is None:
                    col = rng.binomial(self._stim_size[s], p, size=f).astype(np.float32)
                self._stim_w[(s, t)][w : w + f] = col
            for src in self._areas:
                block = plan.area_cols.get(src)
                if block is None:
                    block = (rng.random((self._w[src], f)) < p).astype(np.float32)
                self._W[(src, t)][: self._w[src], w : w + f] = block
        # rows: synapses from the new neurons onto the whole (grown) support of every area
        new_w = {a: self._w[a] + (grown[a].n_first if a in grown else 0) for a in self._areas}
        for t, plan in grown.items():
            w, f = self._w[t], plan.n_first
            for other in self._areas:
                block = (rng.random((f, new_w[other])) < p).astype(np.float32)
                self._W[(t, other)][w : w + f, : new_w[other]] = block

    def _hebbian(self, plans: dict[str, _Plan]) -> None:
        """Scale synapses from the sources' previous winners onto this step's winners."""
        for t, plan in plans.items():
            cols = np.sort(plan.winners)
            for s in plan.stims:
                beta = self._beta[(s, t)]
                if beta != 0.0:
                    self._stim_w[(s, t)][cols] *= 1.0 + beta
            for src in plan.srcs:
                beta = self._beta[(src, t)]
                if beta != 0.0:
                    # the block W[np.ix_(rows, cols)], addressed through flat indices of the
                    # contiguous buffer in increasing order: about twice as fast as np.ix_
                    W = self._W[(src, t)]
                    rows = np.sort(self._winners[src])
                    flat = (rows[:, None] * W.shape[1] + cols[None, :]).ravel()
                    W.reshape(-1)[flat] *= 1.0 + beta


def run_projection(n: int, k: int, p: float, beta: float, steps: int, seed: int) -> dict[str, Any]:
    """Projection of a stimulus into one area until an assembly forms.

    A stimulus of `k` neurons fires into area `A` (`n` neurons, cap `k`) once, then
    `steps - 1` rounds of stimulus + `A -> A` follow (the reference's `project_sim`).

    Args:
        n, k, p, beta: area size, cap, connection probability, plasticity.
        steps: total number of steps, `>= 1`.
        seed: generator seed.

    Returns:
        `{"support": [w after each step], "new_winners": [first-time winners per step],
        "overlap_prev": [winners shared with the previous step; 0 at step 1],
        "winners": final int64 labels}`.
    """
    if not _is_int(steps) or steps < 1:
        raise ValueError(f"run_projection: steps must be an integer >= 1, got {steps!r}")
    brain = NumpyBrain({"A": (n, k)}, {"stim": k}, p=p, beta=beta, seed=seed)
    support, new, overlap = [], [], []
    prev = np.zeros(0, dtype=np.int64)
    for step in range(steps):
        brain.project(stimuli={"stim": ["A"]}, areas={"A": ["A"]} if step else None)
        cur = brain._winners["A"]
        support.append(brain._w["A"])
        new.append(brain._new_winners["A"])
        overlap.append(int(np.intersect1d(prev, cur).size))
        prev = cur
    return {
        "support": support,
        "new_winners": new,
        "overlap_prev": overlap,
        "winners": prev.copy(),
    }


def _main(argv: list[str]) -> None:
    import json

    from .._harness import emit, time_call

    spec = {"n": 100_000, "k": 317, "p": 0.01, "beta": 0.05, "steps": 100, "seed": 0}
    spec["repeats"] = 3
    if len(argv) > 1:
        spec.update(json.loads(argv[1]))
    args = [spec[key] for key in ("n", "k", "p", "beta", "steps", "seed")]
    timing, out = time_call(lambda: run_projection(*args), repeats=int(spec["repeats"]))
    timing.compile_s = None  # nothing is compiled; the first call is only a warm-up
    record = {"impl": "numpy_sparse", "benchmark": "assembly_projection", **spec}
    record.update(timing.as_dict())
    record["per_step_ms"] = 1e3 * timing.run_s / spec["steps"]
    record["final_support"] = out["support"][-1]
    record["last_new_winner_step"] = max(
        (i + 1 for i, v in enumerate(out["new_winners"]) if v), default=0
    )
    emit(record)


if __name__ == "__main__":
    _main(sys.argv)
