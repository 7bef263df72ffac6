"""Adversarial inputs (issue 28): a table of bad arguments to every public entry point, each
refused with a `TypeError`/`ValueError` (or the CLI's exit code 2) whose message names the
owner, the argument and the rule, before any program is compiled.

"Before compiling" is measured with JAX's monitoring events: every backend compilation of a
program other than an eager single operation (`jnp.asarray`, a comparison: what a
constructor's checks run) is counted while the bad call runs, and must be zero. The counter
itself is checked on good calls, which do compile."""

import contextlib
import math
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import monitoring
from jax.experimental import sparse

import neurojax as nj
from neurojax import training as tr

F32 = jnp.float32
KEY = jax.random.key(0)

# ------------------------------------------------------------------ the compilation counter

_COMPILED: list[str] = []
# Compiles of one eager operation: the jitted wrapper of a jax.numpy or lax function.
_EAGER = re.compile(r"^jit\((\w+)\)$")
_WORK_HINTS = ("run", "chunk", "scan", "while", "step", "sweep", "simulate", "lambda", "fn")


def _listener(name, duration, **kwargs):
    if name == "/jax/core/compile/backend_compile_duration":
        _COMPILED.append(str(kwargs.get("fun_name", "")))


monitoring.register_event_duration_secs_listener(_listener)


def _work(names):
    """The compiled programs among `names` that are more than one eager operation."""
    out = []
    for n in names:
        m = _EAGER.match(n)
        if m is None or any(h in m.group(1).lower() for h in _WORK_HINTS):
            out.append(n)
    return out


def _compiles_during(call):
    start = len(_COMPILED)
    try:
        call()
    finally:
        names = _COMPILED[start:]
    return _work(names)


def test_the_counter_sees_the_compilation_of_a_run():
    lif = nj.LIF(tau_m=13.7)  # a parameter value no other test uses: a fresh program
    names = _compiles_during(
        lambda: jax.block_until_ready(
            nj.simulate(lif, lif.init_state(7), 20.0, dt=0.1, n_steps=37, record=("v",))
        )
    )
    assert names, "a simulate call compiled nothing that the counter saw"
    assert not _work(["jit(convert_element_type)", "jit(multiply)", "jit(broadcast_in_dim)"])


# ------------------------------------------------------------------ builders of arguments

lif = nj.LIF()
lif_state = lif.init_state(3)
conn = nj.connect.fixed_prob(jax.random.key(1), 10, 10, 0.3, weight=0.5)
net = nj.Network({"E": (nj.LIF(), 10)}, [nj.Projection("E", "E", conn)], dt=0.1)
net_state = net.init_state(KEY)
brain = nj.assembly.Brain({"A": (50, 5)}, {"s": 5}, p=0.2, beta=0.1, mode="explicit", key=KEY)
brain_state = brain.init_state(KEY)


def bcoo(data, idx, shape=(3, 3)):
    return sparse.BCOO((jnp.asarray(data, F32), jnp.asarray(idx)), shape=shape)


def sim(**kw):
    args = dict(model=lif, state=lif_state, inputs=0.0, dt=0.1, n_steps=5)
    args.update(kw)
    m, s, i = args.pop("model"), args.pop("state"), args.pop("inputs")
    return lambda: nj.simulate(m, s, i, **args)


def layer():
    return tr.SpikingDense(4, 3, key=KEY)


# (id, call, exception, message regex)
# valid projections for the network cases below (built here, outside the measured attempts)
_PROJ_X_E = nj.Projection("X", "E", conn)
_PROJ_E_E = nj.Projection("E", "E", conn)
_PROJ_E_E_DELAYED = nj.Projection("E", "E", conn, delay=1.0)


CASES = [
    # --- neuron models
    ("lif-tau-zero", lambda: nj.LIF(tau_m=0.0), ValueError, r"LIF: tau_m must be > 0"),
    ("lif-tau-neg", lambda: nj.LIF(tau_m=-1.0), ValueError, r"LIF: tau_m must be > 0"),
    ("lif-tau-nan", lambda: nj.LIF(tau_m=math.nan), ValueError, r"LIF: tau_m"),
    ("lif-tau-str", lambda: nj.LIF(tau_m="10"), TypeError, r"LIF: parameter tau_m .*'10'"),
    ("lif-tau-bool", lambda: nj.LIF(tau_m=True), TypeError, r"LIF: parameter tau_m"),
    ("lif-tau-complex", lambda: nj.LIF(tau_m=1j), TypeError, r"LIF: parameter tau_m"),
    ("lif-vth-below-reset", lambda: nj.LIF(v_th=-70.0), ValueError, r"LIF: .*v_th"),
    ("lif-tref-neg", lambda: nj.LIF(t_ref=-1.0), ValueError, r"LIF: t_ref"),
    ("lif-rm-inf", lambda: nj.LIF(r_m=math.inf), ValueError, r"LIF: r_m"),
    ("lif-method", lambda: nj.LIF(method="rk45"), ValueError, r"LIF: method must be one of"),
    ("lif-init-shape", lambda: lif.init_state(-3), ValueError, r"init_state|shape"),
    (
        "lif-init-key",
        lambda: lif.init_state(3, key=jnp.zeros(2, F32)),
        TypeError,
        r"LIF.init_state: key must be a JAX PRNG key",
    ),
    (
        "lif-init-keys",
        lambda: lif.init_state(3, key=jax.random.split(KEY, 3)),
        ValueError,
        r"LIF.init_state: key must be a single",
    ),
    ("izh-preset", lambda: nj.Izhikevich.preset("XX"), ValueError, r"Izhikevich.*XX"),
    ("izh-a-str", lambda: nj.Izhikevich(a="x"), TypeError, r"Izhikevich: parameter a"),
    ("izh-method", lambda: nj.Izhikevich(method="rk4"), ValueError, r"Izhikevich: method"),
    ("hh-method", lambda: nj.HodgkinHuxley(method="euler"), ValueError, r"HodgkinHuxley: method"),
    ("hh-cm-zero", lambda: nj.HodgkinHuxley(c_m=0.0), ValueError, r"HodgkinHuxley: c_m"),
    ("hh-gna-neg", lambda: nj.HodgkinHuxley(g_na=-1.0), ValueError, r"HodgkinHuxley: g_na"),
    ("hh-gk-str", lambda: nj.HodgkinHuxley(g_k="a"), TypeError, r"HodgkinHuxley: parameter g_k"),
    (
        "hh-key",
        lambda: nj.HodgkinHuxley().init_state(2, key="k"),
        TypeError,
        r"HodgkinHuxley.init_state: key",
    ),
    ("adex-tau-zero", lambda: nj.AdEx(tau_w=0.0), ValueError, r"AdEx: tau_w"),
    ("adex-a-nan", lambda: nj.AdEx(a=math.nan), ValueError, r"AdEx: a must be finite"),
    ("adex-str", lambda: nj.AdEx(b="1"), TypeError, r"AdEx: parameter b"),
    # --- synapses and outputs
    ("exp-tau-zero", lambda: nj.Exponential(0.0), ValueError, r"Exponential: tau"),
    ("exp-tau-neg", lambda: nj.Exponential(-2.0), ValueError, r"Exponential: tau"),
    ("alpha-tau-nan", lambda: nj.Alpha(math.nan), ValueError, r"Alpha: tau"),
    ("dual-rise-ge-decay", lambda: nj.DualExponential(5.0, 2.0), ValueError, r"DualExponential"),
    (
        "cond-erev-nan",
        lambda: nj.ConductanceOutput(math.nan),
        ValueError,
        r"ConductanceOutput: e_rev",
    ),
    # --- projections
    (
        "proj-conn-type",
        lambda: nj.Projection("A", "B", "conn"),
        TypeError,
        r"Projection: conn must be",
    ),
    (
        "proj-oob-dense",
        lambda: nj.Projection("A", "B", bcoo([1.0], [[0, 3]]), method="dense"),
        ValueError,
        r"Projection: conn has 1 synapse.*outside \[0, 3\)",
    ),
    (
        "proj-oob-bcoo",
        lambda: nj.Projection("A", "B", bcoo([1.0], [[0, 3]]), method="bcoo"),
        ValueError,
        r"Projection: conn has 1 synapse",
    ),
    (
        "proj-neg-dense",
        lambda: nj.Projection("A", "B", bcoo([1.0], [[-1, 0]]), method="dense"),
        ValueError,
        r"presynaptic index is outside",
    ),
    (
        "proj-neg-event",
        lambda: nj.Projection("A", "B", bcoo([1.0], [[0, -2]]), method="event"),
        ValueError,
        r"postsynaptic index is outside",
    ),
    (
        "proj-nan-w",
        lambda: nj.Projection("A", "B", bcoo([math.nan], [[0, 1]])),
        ValueError,
        r"non-finite weight",
    ),
    (
        "proj-inf-w-dense",
        lambda: nj.Projection("A", "B", bcoo([math.inf], [[0, 1]]), method="dense"),
        ValueError,
        r"non-finite weight",
    ),
    (
        "proj-delay-neg",
        lambda: nj.Projection("A", "B", conn, delay=-1.0),
        ValueError,
        r"Projection: delay must be finite and >= 0",
    ),
    (
        "proj-delay-nan",
        lambda: nj.Projection("A", "B", conn, delay=math.nan),
        ValueError,
        r"Projection: delay",
    ),
    (
        "proj-delay-str",
        lambda: nj.Projection("A", "B", conn, delay="1"),
        TypeError,
        r"Projection: delay",
    ),
    (
        "proj-delay-shape",
        lambda: nj.Projection("A", "B", conn, delay=jnp.ones(3)),
        ValueError,
        r"Projection: delay must be a scalar or have one value per synapse",
    ),
    (
        "proj-synapse",
        lambda: nj.Projection("A", "B", conn, synapse="exp"),
        TypeError,
        r"Projection: synapse must be",
    ),
    (
        "proj-output",
        lambda: nj.Projection("A", "B", conn, output=3),
        TypeError,
        r"Projection: output must be",
    ),
    (
        "proj-method",
        lambda: nj.Projection("A", "B", conn, layout="csr"),
        ValueError,
        r"layout must be one of",
    ),
    (
        "proj-plastic-dense",
        lambda: nj.Projection("A", "B", conn, method="dense", plasticity=nj.STDP()),
        ValueError,
        r"Projection: plastic weights need layout='event'",
    ),
    (
        "proj-plastic-bounds",
        lambda: nj.Projection(
            "A", "B", nj.connect.fixed_prob(KEY, 5, 5, 0.5, weight=3.0), plasticity=nj.STDP()
        ),
        ValueError,
        r"initial weights must lie within",
    ),
    (
        "proj-rule-type",
        lambda: nj.Projection("A", "B", conn, plasticity="stdp"),
        TypeError,
        r"plasticity",
    ),
    # --- networks (the projections are built beforehand: a valid projection's own build may
    # compile, for example after another test cleared JAX's caches; the network refuses)
    (
        "explain-state-none",
        lambda: nj.kernels.explain(net, None, dt=0.1, n_steps=10),
        TypeError,
        r"Network.explain_run: state must be this network's state .* got NoneType",
    ),
    (
        "explain-dt-negative",
        lambda: nj.kernels.explain(net, net.init_state(KEY), dt=-1.0, n_steps=10),
        ValueError,
        r"Network.explain_run: dt must be finite and > 0 ms, got -1.0",
    ),
    (
        "explain-record-every",
        lambda: nj.kernels.explain(net, net.init_state(KEY), dt=0.1, n_steps=10, record_every=3),
        ValueError,
        r"Network.explain_run: record_every=3 must divide n_steps=10",
    ),
    ("net-pop-size", lambda: nj.Network({"E": (nj.LIF(), 0)}, []), ValueError, r"Network"),
    ("net-pop-model", lambda: nj.Network({"E": ("lif", 5)}, []), TypeError, r"Network"),
    (
        "net-unknown-pre",
        lambda: nj.Network({"E": (nj.LIF(), 10)}, [_PROJ_X_E]),
        ValueError,
        r"Network.*'X'",
    ),
    (
        "net-size-mismatch",
        lambda: nj.Network({"E": (nj.LIF(), 12)}, [_PROJ_E_E]),
        ValueError,
        r"Network.*10",
    ),
    (
        "net-delay-no-dt",
        lambda: nj.Network({"E": (nj.LIF(), 10)}, [_PROJ_E_E_DELAYED]),
        ValueError,
        r"dt",
    ),
    (
        "net-dt-neg",
        lambda: nj.Network({"E": (nj.LIF(), 10)}, [], dt=-0.1),
        ValueError,
        r"dt must be finite and > 0",
    ),
    (
        "net-input-name",
        lambda: nj.Network({"E": (nj.LIF(), 10)}, [], inputs={"Q": 1.0}),
        ValueError,
        r"Network.*'Q'",
    ),
    (
        "net-key-float",
        lambda: net.init_state(jnp.zeros(2, F32)),
        TypeError,
        r"Network.init_state: key must be a JAX PRNG key",
    ),
    (
        "net-key-batch",
        lambda: net.init_state(jax.random.split(KEY, 2)),
        ValueError,
        r"Network.init_state: key must be a single",
    ),
    (
        "net-key-str",
        lambda: net.init_state("seed"),
        TypeError,
        r"Network.init_state: key .* str 'seed'",
    ),
    (
        "net-step-dt",
        lambda: net.step(net_state, None, 0.2),
        ValueError,
        r"Network.step: dt=0.2 ms but the network was built with dt=0.1",
    ),
    (
        "net-step-ext",
        lambda: net.step(net_state, {"Q": 1.0}, 0.1),
        ValueError,
        r"Network.step: ext names 'Q'",
    ),
    ("net-capacity", lambda: net.with_capacity(0), ValueError, r"Network.with_capacity"),
    # --- simulate
    ("sim-dt-zero", sim(dt=0.0), ValueError, r"simulate: dt must be finite and > 0"),
    ("sim-dt-nan", sim(dt=math.nan), ValueError, r"simulate: dt must be finite"),
    (
        "sim-dt-tiny",
        sim(dt=1e-300),
        ValueError,
        r"simulate: dt=1e-300 ms is not representable in float32",
    ),
    ("sim-dt-huge", sim(dt=1e300), ValueError, r"simulate: dt=1e\+300 ms is not representable"),
    ("sim-dt-str", sim(dt="0.1"), TypeError, r"simulate: dt must be a Python number"),
    (
        "sim-dt-traced",
        lambda: jax.jit(lambda d: nj.simulate(lif, lif_state, 0.0, dt=d, n_steps=3))(0.1),
        TypeError,
        r"simulate: dt must be a static",
    ),
    ("sim-nsteps-zero", sim(n_steps=0), ValueError, r"simulate: n_steps"),
    ("sim-nsteps-float", sim(n_steps=5.0), TypeError, r"simulate: n_steps"),
    (
        "sim-nsteps-wrap",
        sim(n_steps=2**31),
        ValueError,
        r"simulate: the run would take the step index from 0 to 2147483648",
    ),
    (
        "sim-nsteps-huge-record",
        sim(n_steps=10**12),
        ValueError,
        r"simulate: (the run would take|the recording would take)",
    ),
    ("sim-record-every-zero", sim(record_every=0), ValueError, r"simulate: record_every"),
    (
        "sim-record-every-divide",
        sim(record_every=3),
        ValueError,
        r"simulate: record_every=3 must divide n_steps=5",
    ),
    (
        "sim-record-every-wrap",
        sim(n_steps=2**31, record_every=2**31),
        ValueError,
        r"record_every=2147483648 is more than 2\*\*31 - 1",
    ),
    (
        "sim-chunk-multiple",
        sim(n_steps=6, record_every=2, chunk_size=3),
        ValueError,
        r"chunk_size=3 must be a multiple of record_every=2",
    ),
    ("sim-record-field", sim(record=("w",)), ValueError, r"simulate: record"),
    ("sim-record-type", sim(record=3), TypeError, r"simulate: record"),
    (
        "sim-record-nonarray",
        sim(record=lambda s, o: "x"),
        TypeError,
        r"simulate: the record function returned str",
    ),
    (
        "sim-record-object",
        sim(record=lambda s, o: {"a": object()}),
        TypeError,
        r"simulate: the record function returned object .* at \['a'\]",
    ),
    (
        "sim-inputs-nan",
        sim(inputs=math.nan),
        ValueError,
        r"simulate: inputs must be finite, got nan",
    ),
    (
        "sim-inputs-inf-array",
        sim(inputs=jnp.array([0.0, math.inf, 0.0], F32)),
        ValueError,
        r"simulate: inputs hold 1 non-finite",
    ),
    (
        "sim-inputs-nan-series",
        sim(inputs=jnp.full((5, 3), math.nan, F32), n_steps=None),
        ValueError,
        r"simulate: inputs hold 15 non-finite",
    ),
    (
        "sim-inputs-complex",
        sim(inputs=jnp.ones(3, jnp.complex64)),
        TypeError,
        r"simulate: inputs are complex",
    ),
    ("sim-inputs-complex-scalar", sim(inputs=2j), TypeError, r"simulate: inputs must be real"),
    (
        "sim-inputs-complex-fn",
        sim(inputs=lambda t, i: jnp.ones(3, jnp.complex64)),
        TypeError,
        r"inputs function returns complex",
    ),
    ("sim-inputs-shape", sim(inputs=jnp.ones(4, F32)), ValueError, r"simulate: inputs of shapes"),
    (
        "sim-inputs-fn-raises",
        sim(inputs=lambda t: 1.0),
        ValueError,
        r"simulate: the inputs function must take \(t_ms, step_index\)",
    ),
    (
        "sim-state-other-model",
        sim(state=nj.Izhikevich().init_state(3)),
        TypeError,
        r"simulate: state is a IzhikevichState, but LIF.init_state makes a LIFState",
    ),
    (
        "sim-state-field-shape",
        sim(state=eqx.tree_at(lambda s: s.refractory, lif_state, jnp.zeros(4, F32))),
        ValueError,
        r"state field refractory is float32\[4\]",
    ),
    (
        "sim-state-field-dtype",
        sim(state=eqx.tree_at(lambda s: s.v, lif_state, jnp.zeros(3, jnp.int32))),
        ValueError,
        r"state field v is int32\[3\]",
    ),
    (
        "sim-net-other-size",
        lambda: nj.simulate(
            net, nj.Network({"E": (nj.LIF(), 30)}, []).init_state(KEY), dt=0.1, n_steps=5
        ),
        ValueError,
        r"ring buffers have shapes \[\] but this network needs \[\(1, 10\)\]",
    ),
    (
        "sim-net-other-pops",
        lambda: nj.simulate(
            net, nj.Network({"I": (nj.LIF(), 10)}, []).init_state(KEY), dt=0.1, n_steps=5
        ),
        ValueError,
        r"simulate: the state holds populations \['I'\], but the network has \['E'\]",
    ),
    (
        "sim-net-wrap",
        lambda: nj.simulate(
            net, eqx.tree_at(lambda s: s.step, net_state, jnp.int32(2**31 - 3)), dt=0.1, n_steps=5
        ),
        ValueError,
        r"from 2147483645 to 2147483650",
    ),
    (
        "sim-model",
        lambda: nj.simulate("lif", lif_state, dt=0.1, n_steps=5),
        TypeError,
        r"simulate: model must have a step",
    ),
    ("sim-progress", sim(progress=1), TypeError, r"simulate: progress must be a bool"),
    ("sim-check", sim(check="yes"), TypeError, r"simulate: check must be a bool"),
    ("sim-spike-dtype", sim(spike_dtype="int8"), ValueError, r"simulate: spike_dtype"),
    ("sim-start-neg", sim(start=-1), ValueError, r"simulate: start must be a non-negative int"),
    ("sim-start-wrap", sim(start=2**31 - 2), ValueError, r"from 2147483646 to 2147483651"),
    (
        "sim-batch-block",
        sim(run=nj.Execution(batch_block=2), state=lif.init_state((3, 3))),
        ValueError,
        r"simulate: batch_block=2 must divide",
    ),
    # --- connectivity builders
    (
        "fp-key",
        lambda: nj.connect.fixed_prob(3, 5, 5, 0.5),
        TypeError,
        r"fixed_prob: key must be a JAX PRNG key",
    ),
    (
        "fp-key-batch",
        lambda: nj.connect.fixed_prob(jax.random.split(KEY, 2), 5, 5, 0.5),
        ValueError,
        r"fixed_prob: key must be a single PRNG key",
    ),
    (
        "fp-key-raw-batch",
        lambda: nj.connect.fixed_prob(jax.random.key_data(jax.random.split(KEY, 2)), 5, 5, 0.5),
        ValueError,
        r"fixed_prob: key must be a single PRNG key, got raw key data",
    ),
    (
        "fp-p",
        lambda: nj.connect.fixed_prob(KEY, 5, 5, 1.5),
        ValueError,
        r"fixed_prob: p must be in \[0, 1\], got 1.5",
    ),
    ("fp-p-nan", lambda: nj.connect.fixed_prob(KEY, 5, 5, math.nan), ValueError, r"fixed_prob: p"),
    ("fp-n", lambda: nj.connect.fixed_prob(KEY, -5, 5, 0.5), ValueError, r"fixed_prob: n_pre"),
    (
        "fp-n-float",
        lambda: nj.connect.fixed_prob(KEY, 5.5, 5, 0.5),
        TypeError,
        r"fixed_prob: n_pre",
    ),
    (
        "fp-memory",
        lambda: nj.connect.fixed_prob(KEY, 10**6, 10**6, 0.5),
        ValueError,
        r"fixed_prob: n_pre \* n_post \* p = .* GB while building",
    ),
    (
        "fp-weight-nan",
        lambda: nj.connect.fixed_prob(KEY, 5, 5, 0.5, weight=math.nan),
        ValueError,
        r"fixed_prob: weight",
    ),
    (
        "fp-self",
        lambda: nj.connect.fixed_prob(KEY, 5, 6, 0.5, allow_self=False),
        ValueError,
        r"fixed_prob",
    ),
    (
        "fi-k",
        lambda: nj.connect.fixed_indegree(KEY, 5, 5, 9),
        ValueError,
        r"fixed_indegree: k must be",
    ),
    (
        "fi-k-neg",
        lambda: nj.connect.fixed_indegree(KEY, 5, 5, -1),
        ValueError,
        r"fixed_indegree: k",
    ),
    (
        "fi-memory",
        lambda: nj.connect.fixed_indegree(KEY, 10**9, 10**9, 1000),
        ValueError,
        r"fixed_indegree: n_post \* k",
    ),
    (
        "fo-k",
        lambda: nj.connect.fixed_outdegree(KEY, 5, 5, 9),
        ValueError,
        r"fixed_outdegree: k must be",
    ),
    (
        "fo-memory",
        lambda: nj.connect.fixed_outdegree(KEY, 10**9, 10**9, 1000),
        ValueError,
        r"fixed_outdegree: n_pre \* k",
    ),
    (
        "ata-memory",
        lambda: nj.connect.all_to_all(10**6, 10**6),
        ValueError,
        r"all_to_all: n_pre \* n_post",
    ),
    ("one-to-one-n", lambda: nj.connect.one_to_one(0), ValueError, r"one_to_one: n"),
    (
        "from-dense-3d",
        lambda: nj.connect.from_dense(jnp.ones((2, 2, 2), F32)),
        ValueError,
        r"from_dense",
    ),
    (
        "from-arrays-oob",
        lambda: nj.connect.from_arrays([0, 5], [0, 1], 1.0, 3, 3),
        ValueError,
        r"from_arrays",
    ),
    ("stats-type", lambda: nj.connect.stats("conn"), TypeError, r"stats"),
    # --- plasticity rules
    ("stdp-mode", lambda: nj.STDP(mode="both"), ValueError, r"STDP: mode"),
    ("stdp-tau", lambda: nj.STDP(tau_plus=0.0), ValueError, r"STDP: tau_plus"),
    ("stdp-bounds", lambda: nj.STDP(w_min=1.0, w_max=0.5), ValueError, r"STDP: w_min"),
    ("stdp-a-nan", lambda: nj.STDP(a_plus=math.nan), ValueError, r"STDP: a_plus"),
    ("stdp-a-str", lambda: nj.STDP(a_minus="x"), TypeError, r"real number"),
    # --- assembly calculus
    ("brain-areas", lambda: nj.assembly.Brain({}, key=KEY), ValueError, r"Brain: areas"),
    ("brain-k-gt-n", lambda: nj.assembly.Brain({"A": (5, 10)}, key=KEY), ValueError, r"Brain"),
    ("brain-p", lambda: nj.assembly.Brain({"A": (50, 5)}, p=2.0, key=KEY), ValueError, r"Brain: p"),
    (
        "brain-beta",
        lambda: nj.assembly.Brain({"A": (50, 5)}, beta=-1.0, key=KEY),
        ValueError,
        r"beta must be finite and > -1",
    ),
    (
        "brain-mode",
        lambda: nj.assembly.Brain({"A": (50, 5)}, mode="lazy", key=KEY),
        ValueError,
        r"Brain: mode",
    ),
    (
        "brain-winners-range",
        lambda: brain.set_winners(brain_state, "A", jnp.array([1, 50])),
        ValueError,
        r"Brain.set_winners: labels of area 'A' must be in \[0, 50\) \(n\), got \[50\]",
    ),
    (
        "brain-winners-neg",
        lambda: brain.set_winners(brain_state, "A", jnp.array([-3])),
        ValueError,
        r"got \[-3\]",
    ),
    (
        "brain-winners-dup",
        lambda: brain.set_winners(brain_state, "A", jnp.array([4, 4])),
        ValueError,
        r"must be distinct",
    ),
    (
        "brain-winners-many",
        lambda: brain.set_winners(brain_state, "A", jnp.arange(6)),
        ValueError,
        r"at most k=5",
    ),
    ("brain-area", lambda: brain.set_winners(brain_state, "Z", jnp.array([1])), ValueError, r"'Z'"),
    ("brain-fix-area", lambda: brain.fix(brain_state, "Q"), ValueError, r"Brain.fix.*'Q'"),
    # --- training
    ("dense-sizes", lambda: tr.SpikingDense(0, 3, key=KEY), ValueError, r"SpikingDense"),
    (
        "dense-key",
        lambda: tr.SpikingDense(4, 3, key=3),
        TypeError,
        r"SpikingDense: key must be a JAX PRNG",
    ),
    (
        "dense-scale",
        lambda: tr.SpikingDense(4, 3, key=KEY, weight_scale=math.nan),
        ValueError,
        r"SpikingDense: weight_scale",
    ),
    ("rec-sizes", lambda: tr.SpikingRecurrent(-1, 3, key=KEY), ValueError, r"SpikingRecurrent"),
    ("readout-sizes", lambda: tr.LeakyReadout(4, 0, key=KEY), ValueError, r"LeakyReadout"),
    ("sequential-empty", lambda: tr.Sequential([]), ValueError, r"Sequential"),
    (
        "rate-encode-range",
        lambda: tr.rate_encode(jnp.array([0.5], F32), 0, key=KEY),
        ValueError,
        r"rate_encode: n_steps",
    ),
    (
        "poisson-key",
        lambda: tr.poisson_encode(jnp.array([0.5], F32), 10, 1.0, key=3),
        TypeError,
        r"poisson_encode.*key",
    ),
    (
        "latency-tmax",
        lambda: tr.latency_encode(jnp.array([0.5], F32), 0),
        ValueError,
        r"latency_encode",
    ),
    (
        "train-step-fn",
        lambda: tr.make_train_step("loss", optax.sgd(0.1)),
        TypeError,
        r"make_train_step",
    ),
    (
        "dense-key-batch",
        lambda: tr.SpikingDense(4, 3, key=jax.random.split(KEY, 2)),
        ValueError,
        r"SpikingDense: key must be a single PRNG key",
    ),
    (
        "layer-input-shape",
        lambda: layer()(jnp.ones((5, 7), F32), dt=1.0),
        ValueError,
        r"SpikingDense",
    ),
    # --- parallel
    (
        "sweep-fn",
        lambda: nj.parallel.sweep(3, jnp.ones(3, F32)),
        TypeError,
        r"sweep: fn must be callable",
    ),
    (
        "sweep-params-empty",
        lambda: nj.parallel.sweep(lambda p: p, {}),
        ValueError,
        r"sweep: params must contain at least one array",
    ),
    (
        "sweep-batch",
        lambda: nj.parallel.sweep(lambda p: p, jnp.ones(3, F32), batch_size=0),
        ValueError,
        r"sweep: batch_size",
    ),
    (
        "sweep-axes",
        lambda: nj.parallel.sweep(lambda p: p, {"a": jnp.ones(3), "b": jnp.ones(4)}),
        ValueError,
        r"sweep",
    ),
    (
        "sweep-nonarray",
        lambda: nj.parallel.sweep(lambda p: "x", jnp.ones(3, F32)),
        TypeError,
        r"sweep: fn returned str 'x'",
    ),
    (
        "sweep-to-host",
        lambda: nj.parallel.sweep(lambda p: p, jnp.ones(3, F32), to_host=1),
        TypeError,
        r"sweep: to_host must be a bool",
    ),
    # --- I/O
    ("save-path", lambda: nj.save(3, {"a": 1}), TypeError, r"save: path must be a non-empty str"),
    (
        "save-traced",
        lambda: jax.jit(lambda x: nj.save("/tmp/x.nj", x))(1.0),
        TypeError,
        r"save: leaf .* is a traced value",
    ),
    (
        "save-object-dtype",
        lambda: nj.save("/tmp/nj-adv.nj", np.array([object()])),
        TypeError,
        r"save: leaf .* cannot be stored without pickle",
    ),
    (
        "save-no-folder",
        lambda: nj.save("/nonexistent-folder/x.nj", {"a": 1}),
        FileNotFoundError,
        r"save: the directory",
    ),
    (
        "load-missing",
        lambda: nj.load("/nonexistent-folder/x.nj", {"a": 1}),
        FileNotFoundError,
        r"load: no checkpoint at",
    ),
    ("load-path", lambda: nj.load(None, {"a": 1}), TypeError, r"load: path must be"),
    (
        "spike-table-dt",
        lambda: nj.io.spike_table(np.zeros((3, 2), bool), dt=-1.0),
        ValueError,
        r"spike_table",
    ),
    (
        "spike-table-both",
        lambda: nj.io.spike_table(np.zeros((3, 2), bool), dt=0.1, t=np.arange(3.0)),
        ValueError,
        r"spike_table: give dt or t, not both",
    ),
    (
        "save-recording-type",
        lambda: nj.io.save_recording("/tmp/nj-adv.npz", {"t": 1}),
        TypeError,
        r"save_recording",
    ),
    (
        "compilation-cache-time",
        lambda: nj.enable_compilation_cache(min_compile_time_s=-1.0),
        ValueError,
        r"enable_compilation_cache: min_compile_time_s must be >= 0",
    ),
]

# --- round 3 (issue 42): what is edited in memory or forged is checked as what is built, at
# the start of simulate, on the compiled kernel's path and the pure-JAX path alike.


def _merged():
    """Two projections E -> E with equal kinetics that share one synaptic state."""
    c1 = nj.connect.fixed_prob(jax.random.key(2), 10, 10, 0.3, weight=0.5)
    c2 = nj.connect.fixed_prob(jax.random.key(3), 10, 10, 0.3, weight=-0.5)
    projs = [nj.Projection("E", "E", c, synapse=nj.Exponential(5.0)) for c in (c1, c2)]
    return nj.Network({"E": (nj.LIF(), 10)}, projs, dt=0.1, merge_synapses=True)


merged = _merged()
merged_state = merged.init_state(KEY)
merged_edited = eqx.tree_at(lambda n: n.projections[1].synapse.tau, merged, jnp.asarray(9.0, F32))
stp_net = nj.Network(
    {"E": (nj.LIF(), 10)},
    [nj.Projection("E", "E", conn, short_term=nj.TsodyksMarkram.preset("depressing"))],
    dt=0.1,
)
stp_state = stp_net.init_state(KEY)
stp_u3 = eqx.tree_at(lambda n: n.projections[0].short_term.u, stp_net, jnp.asarray(3.0, F32))
ev_net = nj.Network({"E": (nj.LIF(), 10)}, [nj.Projection("E", "E", conn, method="event")], dt=0.1)
ev_state = ev_net.init_state(KEY)
csr_bad = eqx.tree_at(
    lambda n: n.projections[0].layout.indices,
    ev_net,
    ev_net.projections[0].layout.indices.at[2].set(10),
)
_delayed = nj.Network(
    {"E": (nj.LIF(), 10)},
    [nj.Projection("E", "E", conn, delay=np.linspace(0.1, 1.0, conn.nse))],
    dt=0.1,
)
_delayed_state = _delayed.init_state(KEY)


def _forged_delay(value):
    d = _delayed.projections[0].delay_steps
    return eqx.tree_at(lambda n: n.projections[0].delay_steps, _delayed, d.at[3].set(value))


_proc = nj.Network(
    {"E": (nj.LIF(), 50)},
    [nj.Projection("E", "E", nj.connect.procedural.fixed_prob(KEY, 50, 50, 0.1, weight=0.5))],
    dt=0.1,
)
_proc_counts = _proc.projections[0].layout.conn.counts
proc_forged = eqx.tree_at(
    lambda n: n.projections[0].layout.conn.counts, _proc, _proc_counts.at[4].set(10**6)
)
_learn = nj.Network(
    {"E": (nj.LIF(), 10)},
    [nj.Projection("E", "E", conn, delay=0.5, learnable_delays=True, max_delay=2.0)],
    dt=0.1,
)
_learn_nan = eqx.tree_at(
    lambda n: n.projections[0].delay_ms, _learn, _learn.projections[0].delay_ms.at[1].set(jnp.nan)
)
izh = nj.Izhikevich()
izh_nan_u = eqx.tree_at(lambda s: s.u, izh.init_state(3), jnp.array([0.0, jnp.nan, 0.0], F32))
lif_nan_v = eqx.tree_at(lambda s: s.v, lif_state, jnp.array([jnp.nan, -65.0, -65.0], F32))


def _reference(call):
    def run():
        with nj.kernels.use("reference"):
            return call()

    return run


CASES += [
    (
        "sim-merged-synapse-edited",
        sim(model=merged_edited, state=merged_state, inputs=None),
        ValueError,
        r"simulate: projections\[1\] \(E -> E\) shares the synaptic state of projections\[0\] "
        r"\(merge_synapses=True\), but its synapse differs",
    ),
    (
        "sim-stp-u-edited",
        sim(model=stp_u3, state=stp_state, inputs=None),
        ValueError,
        r"simulate: the TsodyksMarkram fails its constructor's check: TsodyksMarkram: u must be "
        r"in \(0, 1\], got 3.0",
    ),
    (
        "sim-csr-index-edited",
        sim(model=csr_bad, state=ev_state, inputs=None),
        ValueError,
        r"simulate: EventLayout: 1 postsynaptic indices outside \[0, 10\), e.g. \[10\]",
    ),
    (
        "sim-csr-index-edited-reference",
        _reference(sim(model=csr_bad, state=ev_state, inputs=None)),
        ValueError,
        r"simulate: EventLayout: 1 postsynaptic indices outside \[0, 10\)",
    ),
    (
        "sim-delay-forged-100",
        sim(model=_forged_delay(100), state=_delayed_state, inputs=None),
        ValueError,
        r"simulate: projections\[0\] \(E -> E\): delay_steps holds 1 delay\(s\) outside "
        r"\[0, 10\] steps, the ring buffer's 11 slots, e.g. \[100\] \(first at synapse 3\)",
    ),
    (
        "sim-delay-forged-negative",
        _reference(sim(model=_forged_delay(-100), state=_delayed_state, inputs=None)),
        ValueError,
        r"simulate: projections\[0\] \(E -> E\): delay_steps .* e.g. \[-100\]",
    ),
    (
        "sim-procedural-row-forged",
        _reference(sim(model=proc_forged, state=_proc.init_state(KEY), inputs=None)),
        ValueError,
        r"simulate: ProceduralLayout: conn.counts holds 1 row length\(s\) outside "
        r"\[0, max_fan_out=\d+\], e.g. \[1000000\] \(first at presynaptic neuron 4\)",
    ),
    (
        "sim-learnable-delay-nan",
        sim(model=_learn_nan, state=_learn.init_state(KEY), inputs=None),
        ValueError,
        r"simulate: projections\[0\] \(E -> E\): the learnable delays hold 1 NaN or infinite "
        r"value\(s\) \(first at synapse 1\)",
    ),
    (
        "sim-initial-v-nan",
        sim(state=lif_nan_v),
        ValueError,
        r"simulate: the initial state field v holds 1 NaN value\(s\), the first at index \(0,\)",
    ),
    (
        "sim-initial-u-nan",
        sim(model=izh, state=izh_nan_u),
        ValueError,
        r"simulate: the initial state field u holds 1 NaN value\(s\), the first at index \(1,\)",
    ),
    (
        "sim-state-none",
        sim(state=None),
        TypeError,
        r"simulate: state is None; pass the initial state, made with LIF.init_state",
    ),
    (
        "sim-network-given-neuron-state",
        sim(model=net, state=lif_state, inputs=None),
        TypeError,
        r"simulate: state is a LIFState, but Network.init_state makes a NetworkState",
    ),
    (
        "stp-u-str",
        lambda: nj.TsodyksMarkram(u="0.5"),
        TypeError,
        r"TsodyksMarkram: parameter u must be a real number or array: .*string '0.5'",
    ),
    (
        "lif-tau-none",
        lambda: nj.LIF(tau_m=None),
        TypeError,
        r"LIF: parameter tau_m must be a real number or array",
    ),
    (
        "model-coba-int-key",
        lambda: nj.models.coba(0),
        TypeError,
        r"coba: key must be a JAX PRNG key such as jax.random.key\(0\), got int 0",
    ),
    (
        "model-microcircuit-int-key",
        lambda: nj.models.microcircuit(0, scale=0.01),
        TypeError,
        r"microcircuit: key must be a JAX PRNG key such as jax.random.key\(0\), got int 0",
    ),
    (
        "compilation-cache-int",
        lambda: nj.enable_compilation_cache(5),
        TypeError,
        r"enable_compilation_cache: path must be a folder .* got int 5",
    ),
    (
        "compilation-cache-file",
        lambda: nj.enable_compilation_cache(__file__),
        ValueError,
        r"enable_compilation_cache: path .*test_adversarial.py' is not a folder",
    ),
]

# --- the command line: (id, argv, message regex); each exits with code 2 before any work
CLI_CASES = [
    (
        "cli-duration-huge",
        ["run", "coba", "--duration", "1e30"],
        r"argument --duration: at most 2\*\*31 - 1 steps",
    ),
    (
        "cli-duration-memory",
        ["run", "hh", "--duration", "1e8", "--dt", "0.05"],
        r"argument --duration: the spike raster .* GB",
    ),
    ("cli-duration-neg", ["run", "hh", "--duration", "-5"], r"argument --duration"),
    ("cli-duration-nan", ["run", "hh", "--duration", "nan"], r"argument --duration"),
    ("cli-duration-text", ["run", "hh", "--duration", "ten"], r"argument --duration"),
    (
        "cli-duration-multiple",
        ["run", "hh", "--duration", "1.05", "--dt", "0.1"],
        r"must be a positive whole multiple of --dt",
    ),
    ("cli-dt-zero", ["run", "hh", "--dt", "0"], r"argument --dt"),
    ("cli-dt-inf", ["run", "hh", "--dt", "inf"], r"argument --dt"),
    ("cli-batch-zero", ["run", "hh", "--batch", "0"], r"argument --batch"),
    ("cli-seed-neg", ["run", "hh", "--seed", "-1"], r"argument --seed"),
    ("cli-model", ["run", "nomodel"], r"invalid choice"),
    ("cli-plot-folder", ["run", "hh", "--plot", "/nonexistent-folder/x.png"], r"argument --plot"),
    ("cli-devices", ["run", "hh", "--devices", "2"], r"argument --devices"),
]


@pytest.mark.parametrize("call, error, match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_with_a_message_before_compiling(call, error, match):
    caught = []

    def attempt():
        with pytest.raises(error, match=match) as info:
            call()
        caught.append(info.value)

    compiled = _compiles_during(attempt)
    assert compiled == [], f"compiled {compiled} before raising {caught}"


@pytest.mark.parametrize("argv, match", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_bad_command_line_exits_2_with_a_message_before_compiling(argv, match, capsys):
    from neurojax import cli

    def attempt():
        try:
            code = cli.main(argv)
        except SystemExit as stop:
            code = stop.code
        assert code == 2

    compiled = _compiles_during(attempt)
    err = capsys.readouterr().err
    assert re.search(match, err), err
    assert "Traceback" not in err
    assert compiled == [], f"compiled {compiled}"


def test_the_table_covers_at_least_100_inputs_of_every_area():
    ids = [c[0] for c in CASES] + [c[0] for c in CLI_CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 100
    for prefix in (
        "lif",
        "proj",
        "net",
        "sim",
        "fp",
        "stdp",
        "brain",
        "dense",
        "sweep",
        "save",
        "load",
        "cli",
    ):
        assert any(i.startswith(prefix) for i in ids), prefix


# ------------------------------------------------------------------ round 3 (issue 42)


def _runtime_error(call, match):
    """`call()` fails when the compiled run executes (an `equinox` check on traced values),
    with a message that matches `match`."""
    with pytest.raises(Exception, match=match):
        jax.block_until_ready(call())


def test_edits_traced_under_jit_are_refused_when_the_run_executes():
    # Under the caller's jit the edited values are tracers: the start check cannot read them
    # and flags them instead, naming the field, before any spike is delivered.
    def run(model, state):
        return jax.jit(lambda m: nj.simulate(m, state, dt=0.1, n_steps=20)[0].step)(model)

    _runtime_error(
        lambda: run(merged_edited, merged_state),
        r"projections\[1\] \(E -> E\) shares the synaptic state of projections\[0\]",
    )
    _runtime_error(lambda: run(stp_u3, stp_state), r"TsodyksMarkram: u must be in \(0, 1\]")
    with nj.kernels.use("reference"):
        _runtime_error(
            lambda: run(csr_bad, ev_state),
            r"EventLayout: indices hold a postsynaptic index outside \[0, 10\)",
        )
        _runtime_error(
            lambda: run(_forged_delay(100), _delayed_state),
            r"projections\[0\] \(E -> E\): delay_steps holds a delay outside \[0, 10\] steps",
        )
    # the same networks unedited run under jit
    assert int(run(merged, merged_state)) == 20
    assert int(run(stp_net, stp_state)) == 20


@pytest.mark.parametrize(
    "forged, like, match",
    [
        (lambda: csr_bad, lambda: ev_net, r"EventLayout: 1 postsynaptic indices outside \[0, 10\)"),
        (
            lambda: _forged_delay(100),
            lambda: _delayed,
            r"delay_steps holds 1 delay\(s\) outside \[0, 10\] steps",
        ),
        (
            lambda: _forged_delay(-100),
            lambda: _delayed,
            r"delay_steps holds 1 delay\(s\) outside .*\[-100\]",
        ),
        (
            lambda: proc_forged,
            lambda: _proc,
            r"ProceduralLayout: conn.counts holds 1 row length\(s\) outside",
        ),
        (
            lambda: stp_u3,
            lambda: stp_net,
            r"TsodyksMarkram fails its constructor's check.*u must be in \(0, 1\]",
        ),
        (
            lambda: merged_edited,
            lambda: merged,
            r"projections\[1\] .* shares the synaptic state of projections",
        ),
    ],
)
def test_forged_checkpoints_are_refused_by_load(tmp_path, forged, like, match):
    # The file's checksums are right (nj.save wrote it): only the classes' checks, run again
    # by load, can refuse it.
    nj.save(tmp_path / "net.nj", forged())
    with pytest.raises(ValueError, match=r"load: checkpoint .*" + match):
        nj.load(tmp_path / "net.nj", like())
    nj.save(tmp_path / "good.nj", like())
    assert bool(eqx.tree_equal(nj.load(tmp_path / "good.nj", like()), like()))


def test_the_start_check_is_cached_and_checks_an_edited_leaf_again():
    from neurojax.network import _checks

    _checks._CACHE.clear()
    nj.simulate(merged, merged_state, dt=0.1, n_steps=2)
    assert len(_checks._CACHE) == 1
    # the same objects again: answered by the cache (a counted module walk would show it)
    walked = []
    original = _checks.modules
    _checks.modules = lambda tree: walked.append(1) or original(tree)
    try:
        nj.simulate(merged, merged_state, dt=0.1, n_steps=2)
        assert walked == []
        with pytest.raises(ValueError, match=r"shares the synaptic state"):
            nj.simulate(merged_edited, merged_state, dt=0.1, n_steps=2)
        assert walked == [1]
    finally:
        _checks.modules = original


@pytest.mark.parametrize(
    "variable, read, allowed",
    [
        ("NEUROJAX_CPU_KERNEL", "_config._env_default", "1, true, yes, on, 0, false, no, off"),
        ("NEUROJAX_CROSS_PLATFORM", "_config._env_cross_platform", "1, true, yes, on, 0"),
        ("NEUROJAX_PALLAS_INTERPRET", "_pallas._env_default", "gpu, tpu"),
    ],
)
def test_environment_variables_refuse_unknown_values(monkeypatch, variable, read, allowed):
    from neurojax.kernels import _config, _pallas

    module, name = read.split(".")
    fn = getattr({"_config": _config, "_pallas": _pallas}[module], name)
    monkeypatch.setenv(variable, "maybe")
    with pytest.raises(ValueError) as info:
        fn()
    message = str(info.value)
    assert "\n" not in message
    assert f"{variable}='maybe' is not one of" in message and allowed in message
    for value in ("0", "OFF", " no "):
        monkeypatch.setenv(variable, value)
        assert fn() in ("reference", False, "off")
    monkeypatch.setenv(variable, "")
    fn()  # empty: the default


def test_an_unknown_kernel_switch_stops_the_import_with_one_line():
    import subprocess
    import sys

    env = {**__import__("os").environ, "NEUROJAX_CPU_KERNEL": "maybe"}
    out = subprocess.run(
        [sys.executable, "-c", "import neurojax"], capture_output=True, text=True, env=env
    )
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1] == (
        "ValueError: neurojax: the environment variable NEUROJAX_CPU_KERNEL='maybe' is not "
        "one of 1, true, yes, on, 0, false, no, off; set one of those or unset it"
    )


def test_cli_refuses_an_unknown_compilation_cache_switch(monkeypatch, capsys):
    from neurojax import cli

    monkeypatch.setenv("NEUROJAX_COMPILATION_CACHE", "maybe")

    def attempt():
        with pytest.raises(SystemExit) as stop:
            cli.main(["run", "hh", "--duration", "1"])
        assert stop.value.code == 2

    assert _compiles_during(attempt) == []
    err = capsys.readouterr().err
    assert "NEUROJAX_COMPILATION_CACHE='maybe' is not one of" in err and "Traceback" not in err


def test_no_cache_is_written_into_a_refused_cache_folder(tmp_path, monkeypatch):
    import os

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("NEUROJAX_CACHE_DIR", str(shared))
    monkeypatch.delenv("NEUROJAX_COMPILATION_CACHE_DIR", raising=False)
    # a JAX cache configured earlier in this process (the CLI's tests enable one) would be
    # kept as the user's own: start from none
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    try:
        with pytest.raises(ValueError, match=r"neurojax cache folder .*writable by other users"):
            nj.enable_compilation_cache()
        assert list(shared.iterdir()) == []  # no xla/ folder made inside it
        assert jax.config.jax_compilation_cache_dir is None
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


def test_traced_checks_compose_with_vmap_and_grad():
    # vmap over edited parameters: one bad member of the batch is refused by name, a good
    # batch runs and equals the runs one by one.
    def final_v(u):
        model = eqx.tree_at(lambda n: n.projections[0].short_term.u, stp_net, u)
        ext = {"E": jnp.full(10, 3.0, F32)}
        return nj.simulate(model, stp_state, ext, dt=0.1, n_steps=30)[0].populations["E"].v

    _runtime_error(
        lambda: jax.vmap(final_v)(jnp.array([0.5, 3.0], F32)),
        r"TsodyksMarkram: u must be in \(0, 1\]",
    )
    good = jax.vmap(final_v)(jnp.array([0.5, 0.2], F32))
    np.testing.assert_array_equal(np.asarray(good[1]), np.asarray(final_v(jnp.float32(0.2))))

    # grad through the run with respect to learnable delays, which the check flags when
    # traced: the flag leaves the gradient that of the same steps without simulate
    ext = {"E": jnp.full(10, 3.0, F32)}

    def loss(d):
        model = eqx.tree_at(lambda n: n.projections[0].delay_ms, _learn, d)
        fin, _ = nj.simulate(model, _learn.init_state(KEY), ext, dt=0.1, n_steps=40)
        return jnp.sum(fin.populations["E"].v)

    def loss_steps(d):
        model = eqx.tree_at(lambda n: n.projections[0].delay_ms, _learn, d)
        fin = jax.lax.fori_loop(
            0, 40, lambda _, st: model.step(st, ext, 0.1)[0], _learn.init_state(KEY)
        )
        return jnp.sum(fin.populations["E"].v)

    d0 = _learn.projections[0].delay_ms
    g = jax.grad(loss)(d0)
    assert g.shape == d0.shape and bool(jnp.all(jnp.isfinite(g)))
    np.testing.assert_allclose(
        np.asarray(g), np.asarray(jax.grad(loss_steps)(d0)), rtol=1e-5, atol=1e-6
    )
    _runtime_error(lambda: jax.grad(loss)(d0.at[0].set(jnp.nan)), r"learnable delays hold NaN")


_DRIVE = {"E": jnp.full(10, 40.0, F32)}


def _own_loop(model, state, n=60):
    """A loop of one's own over `Network.step` (no `simulate`): what a user writes to
    interleave their own code with the steps."""

    def body(_, st):
        return model.step(st, _DRIVE, 0.1)[0]

    return jax.lax.fori_loop(0, n, body, state)


@pytest.mark.parametrize("path", ["kernel", "reference"])
def test_a_loop_over_network_step_refuses_an_edited_index_on_every_path(path):
    """Issue 42: an out-of-range CSR index edited in memory is refused by a hand-written loop
    over `Network.step` on the pure-JAX path as on the kernel's, eagerly, with the network
    closed over by `jit`, and with it passed into `jit` as an argument (traced: the flag
    stops the run when it executes), where it used to be dropped silently."""
    ctx = nj.kernels.use("reference") if path == "reference" else contextlib.nullcontext()
    eager_msg = r"Network.step: EventLayout: 1 postsynaptic indices outside \[0, 10\), e.g. \[10\]"
    with ctx:
        with pytest.raises(ValueError, match=eager_msg):
            csr_bad.step(ev_state, None, 0.1)
        with pytest.raises(ValueError, match=eager_msg):
            jax.jit(lambda st: _own_loop(csr_bad, st))(ev_state)
        _runtime_error(
            lambda: eqx.filter_jit(_own_loop)(csr_bad, ev_state),
            r"Network.step: EventLayout: indices hold a postsynaptic index outside \[0, 10\)",
        )
        _runtime_error(
            lambda: eqx.filter_jit(_own_loop)(_forged_delay(100), _delayed_state),
            r"Network.step: projections\[0\] \(E -> E\): delay_steps holds a delay outside",
        )
        # the unedited network in the same loops: the steps of simulate, bit for bit
        want = nj.simulate(ev_net, ev_state, _DRIVE, dt=0.1, n_steps=60)
        for got in (
            jax.jit(lambda st: _own_loop(ev_net, st))(ev_state),
            eqx.filter_jit(_own_loop)(ev_net, ev_state),
        ):
            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want[0]), strict=True):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert int(want[1].spikes["E"].sum()) > 0
