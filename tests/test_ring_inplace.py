"""The ring buffers are updated in place: no step copies a ring (issue 25).

A network step reads slot `step mod D` of every ring and then writes the ring (the slot
zeroed, this step's spikes added). XLA runs those writes in place only if it can see that
every reader of the slot runs first; otherwise it copies the whole ring every step (128 MB
per step for the full-scale microcircuit). These tests compile runs of networks with every
kind of ring (one slot and many, fed back into its own group or reaching other groups,
one trial and several, the compiled CPU kernel and the pure-JAX path) and check the
optimised HLO: no instruction outside the entry computation copies an array of a ring's
shape (or of its flat view). The entry computation may copy each ring once per call (its
arguments are not donated).

They also check that the values did not change: a reduced microcircuit run gives, spike for
spike and bit for bit in its final membrane potentials, the run of the earlier formulation
(which cleared the slot in the arrival phase), stored in
`tests/data/ring_inplace_microcircuit.json` by `_microcircuit_run` on main at commit
164337d, before the change.
"""

import json
import math
import re
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import neurojax as nj
from neurojax._simulate import simulate
from neurojax.models._microcircuit import POPULATIONS

DATA = Path(__file__).parent / "data" / "ring_inplace_microcircuit.json"
MODES = ("auto", "reference")  # the compiled CPU kernel, the pure-JAX path


def ring_copies(text: str, ring_shapes) -> list[str]:
    """The instructions of the optimised HLO `text` outside its entry computation that copy
    an array shaped like a ring (`(*batch, D, W)`) or like its flat view."""
    names = set()
    for shape in ring_shapes:
        names.add("f32[" + ",".join(map(str, shape)) + "]")
        names.add(f"f32[{math.prod(shape)}]")
    found, in_entry = [], False
    for line in text.splitlines():
        if line.startswith("ENTRY"):
            in_entry = True
        elif line.startswith("}"):
            in_entry = False
        m = re.match(r"\s*(?:ROOT )?%(\S+) = (f32\[[\d,]*\])\S* (\S+?)\(", line)
        if in_entry or not m:
            continue
        name, shape, op = m.groups()
        if shape in names and (op == "copy" or "copy" in name.split(".")[0].split("_")):
            found.append(line.strip()[:160])
    return found


def compiled_run(model, state, n_steps: int, mode: str):
    """`simulate` of `model` compiled in kernel mode `mode`: (compiled function, HLO text)."""
    with nj.kernels.use(mode):
        fn = jax.jit(
            lambda m, s: simulate(m, s, dt=0.1, n_steps=n_steps, record=nj.Record(spikes="float"))
        ).lower(model, state)
        compiled = fn.compile()
    return compiled, compiled.as_text()


def test_ring_copies_finds_a_copied_ring():
    """The detector itself: a loop that reads a ring and updates it without an ordering that
    XLA can see (the earlier formulation) copies the ring, and is reported."""

    def body(carry, _):
        ring, v, k = carry
        row = jax.lax.dynamic_index_in_dim(ring, k % 5, 0, keepdims=False)
        v = 0.9 * v + row
        ring = jax.lax.dynamic_update_index_in_dim(ring, jnp.zeros_like(row), k % 5, 0)
        ring = ring.at[(k + 3) % 5].add(v)
        return (ring, v, k + 1), None

    run = jax.jit(lambda r, v: jax.lax.scan(body, (r, v, jnp.int32(0)), None, length=4))
    text = run.lower(jnp.ones((5, 64)), jnp.ones(64)).compile().as_text()
    assert ring_copies(text, [(5, 64)])


# ---------------------------------------------------------------- the reduced microcircuit


class _SpikeIds(eqx.Module):
    """The network stepped with, as its output, the ids of this step's spiking neurons of the
    eight populations (`cap` entries, -1 past the last) and their number: the program whose
    stored results this module compares against."""

    net: nj.Network
    cap: int = eqx.field(static=True)

    def init_state(self, *args, **kwargs):
        return self.net.init_state(*args, **kwargs)

    def step(self, state, inputs, dt):
        state, out = self.net.step(state, inputs, dt)
        x = jnp.concatenate([out[p] for p in POPULATIONS], axis=-1) > 0
        (ids,) = jnp.nonzero(x, size=self.cap, fill_value=-1)
        return state, (ids.astype(jnp.int32), jnp.sum(x, dtype=jnp.int32))


def _microcircuit(merge_synapses: bool = False):
    # The stored values come from before pathways could share ring columns: one block each.
    net, state = nj.models.microcircuit(
        jax.random.key(7),
        scale=0.02,
        k_scale=0.1,
        thalamus=True,
        merge_synapses=merge_synapses,
    )
    n_total = sum(net.sizes[p] for p in POPULATIONS)
    # every spike of the pure-JAX path in one buffer: no rerun, one program
    return _SpikeIds(net.with_capacity(n_total), n_total), state


def _microcircuit_run(mode: str, n_steps: int = 1000):
    """Spike counts per step, spike ids and final membrane potentials of the eight
    populations, and the HLO text, of the reduced microcircuit run in mode `mode`."""
    model, state = _microcircuit()
    compiled, text = compiled_run(model, state, n_steps, mode)
    final, rec = compiled(model, state)
    ids, counts = (np.asarray(x) for x in rec.spikes)
    v = np.concatenate([np.asarray(final.populations[p].v) for p in POPULATIONS])
    rings = [b.shape for b in state.buffers]
    return counts, ids[ids >= 0], v, text, rings


# The pure-JAX path runs this microcircuit with every spike in one buffer (about a minute
# here): it goes with the slow tests; the kernel path's run stays in the default suite.
@pytest.fixture(scope="module", params=["auto", pytest.param("reference", marks=pytest.mark.slow)])
def microcircuit_run(request):
    return request.param, _microcircuit_run(request.param)


def test_microcircuit_rings_are_not_copied(microcircuit_run):
    # Rings: recurrent (fed back into its group, per-synapse delays, the event layout),
    # Poisson background (another group, one delay, the input layout), thalamus (another
    # group, per-synapse delays, the event layout).
    mode, (_, _, _, text, rings) = microcircuit_run
    assert len(rings) == 3 and all(shape[0] > 1 for shape in rings)
    assert ring_copies(text, rings) == [], mode


def test_merged_microcircuit_rings_are_not_copied():
    """The microcircuit as built by default: the pathways onto a population share one block
    of the recurrent and thalamic rings (one column per neuron), still updated in place."""
    model, state = _microcircuit(merge_synapses=True)
    rings = [b.shape for b in state.buffers]
    net = model.net
    # one block per population a ring reaches, whatever the number of pathways onto it
    want = []
    for _, idx in net.senders:
        posts = {net.projections[i].post for i in idx}
        want.append(sum(net.sizes[p] for p in posts))
    assert [r[1] for r in rings] == want
    assert want[0] == sum(net.sizes[p] for p in POPULATIONS)
    _, text = compiled_run(model, state, 50, "auto")
    assert ring_copies(text, rings) == []


def test_microcircuit_values_are_those_of_the_earlier_formulation(microcircuit_run):
    mode, (counts, ids, v, _, _) = microcircuit_run
    expected = json.loads(DATA.read_text())
    assert counts.sum() > 300  # a run with activity, not a silent one
    np.testing.assert_array_equal(counts, np.asarray(expected["counts"]))
    np.testing.assert_array_equal(ids, np.asarray(expected["ids"]))
    # bit for bit: float32 values stored exactly as float64 in the JSON
    np.testing.assert_array_equal(v, np.asarray(expected["v"], np.float32))


# ---------------------------------------------------------------- other rings


def _delay_network(batch):
    """Two LIF populations stepped as one group (a ring fed back into it, per-synapse
    delays) and a Poisson source (a ring onto the other group, one delay)."""
    k = jax.random.split(jax.random.key(3), 4)
    lif = nj.LIF(tau_m=10.0, v_rest=-65.0, v_reset=-65.0, v_th=-50.0, t_ref=2.0)
    ee = nj.connect.fixed_prob(k[0], 300, 200, 0.1, weight=0.8)
    ba = nj.connect.fixed_prob(k[1], 200, 300, 0.1, weight=-1.5)
    inp = nj.connect.fixed_prob(k[2], 100, 300, 0.05, weight=4.0)
    delay = np.asarray(jax.random.uniform(k[3], (ee.nse,), minval=0.1, maxval=2.0))
    net = nj.Network(
        {"A": (lif, 300), "B": (lif, 200), "P": (nj.PoissonSource(rate=200.0), 100)},
        [
            nj.Projection("A", "B", ee, synapse=nj.Exponential(5.0), delay=delay),
            nj.Projection("B", "A", ba, synapse=nj.Exponential(10.0), delay=0.7),
            nj.Projection("P", "A", inp, synapse=nj.Exponential(5.0), delay=1.0),
        ],
        inputs={"A": 14.0, "B": 14.0},
        dt=0.1,
    )
    return net, net.init_state(jax.random.key(4), batch=batch)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch", [(), (3,)])
def test_delay_rings_are_not_copied(mode, batch):
    net, state = _delay_network(batch)
    rings = [b.shape for b in state.buffers]
    assert all(shape[-2] > 1 for shape in rings)
    _, text = compiled_run(net, state, 8, mode)
    assert ring_copies(text, rings) == []


@pytest.mark.parametrize("mode", MODES)
def test_one_slot_rings_are_not_copied(mode):
    """The COBA network: no delay, one-slot rings handed to delivery as fresh."""
    net, state = nj.models.coba(jax.random.key(0), n_exc=400, n_inh=100, method="event")
    rings = [b.shape for b in state.buffers]
    assert all(shape[-2] == 1 for shape in rings)
    _, text = compiled_run(net, state, 8, mode)
    assert ring_copies(text, rings) == []


# ---------------------------------------------------------------- the delivery's clear


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("step", [0, 4, 7])
def test_delivery_clears_the_read_slot_then_adds(mode, step):
    """`deliver(..., clear=True)` against a NumPy loop: slot `step mod D` of each trial
    zeroed, then every spike's synapses added at `(step + 1 + delay) mod D`, in the
    kernel's order (neurons, then synapses, ascending), in float32."""
    from neurojax.network._propagation import EventArrays, EventSpec, deliver

    rng = np.random.default_rng(step)
    n_pre, n_post, n_slots, trials = 9, 6, 4, 2
    mask = rng.random((n_pre, n_post)) < 0.5
    indptr = np.concatenate([[0], np.cumsum(mask.sum(1))]).astype(np.int32)
    post = np.nonzero(mask)[1].astype(np.int32)
    w = rng.uniform(0.5, 1.5, post.size).astype(np.float32)
    d = rng.integers(0, n_slots, post.size).astype(np.int8)  # D - 1 lands in the read slot
    s = (rng.random((trials, n_pre)) < 0.5).astype(np.float32)
    ring = rng.normal(size=(trials, n_slots, n_post)).astype(np.float32)

    want = ring.copy()
    want[:, step % n_slots, :] = 0.0
    for b in range(trials):
        for i in np.flatnonzero(s[b]):
            for k in range(indptr[i], indptr[i + 1]):
                slot = (step + 1 + int(d[k])) % n_slots
                want[b, slot, post[k]] += np.float32(s[b, i] * w[k])

    spec = EventSpec(n_pre, 0, n_pre, n_post, int(mask.sum(1).max()), n_slots, None, n_post, 0)
    arr = EventArrays(jnp.asarray(indptr), jnp.asarray(post), jnp.asarray(w), jnp.asarray(d))
    with nj.kernels.use(mode):
        got, need = jax.jit(lambda s_, k_, r_: deliver((spec,), s_, k_, (arr,), r_, clear=True))(
            jnp.asarray(s), jnp.int32(step), jnp.asarray(ring)
        )
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(need), 0)
