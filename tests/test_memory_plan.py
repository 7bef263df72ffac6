"""`Network.memory()`, `nj.network.plan_memory` and the refusal of builds that do not fit.

Reference: the bytes of the arrays actually allocated (the state made by `init_state`, the
projections' tables), against which the report computed from shapes alone must agree exactly.
"""

import jax
import numpy as np
import pytest

import neurojax as nj
from neurojax.network import _memory

DT = 0.1


def _net(method="event"):
    lif = nj.LIF(tau_m=20.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0)
    if method == "procedural":
        ee = nj.connect.procedural.fixed_prob(
            jax.random.key(0),
            300,
            300,
            0.1,
            weight=0.5,
            delay=nj.connect.uniform(0.1, 2.0),
            dt=DT,
        )
    else:
        ee = nj.connect.fixed_indegree(jax.random.key(0), 300, 300, 30, weight=0.5)
    ei = nj.connect.fixed_indegree(jax.random.key(1), 300, 100, 20, weight=0.5)
    delay = 0.0 if method == "procedural" else np.linspace(0.1, 2.0, 9000)
    return nj.Network(
        {"E": (lif, 300), "I": (nj.Izhikevich(), 100)},
        [
            nj.Projection("E", "E", ee, synapse=nj.Exponential(5.0), delay=delay),
            nj.Projection("E", "I", ei, synapse=nj.Alpha(3.0), delay=1.0),
        ],
        dt=DT,
    )


def _bytes(tree):
    return sum(x.nbytes for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("method", ["event", "procedural"])
@pytest.mark.parametrize("batch", [(), (3,)])
def test_report_equals_the_bytes_actually_allocated(method, batch):
    net = _net(method)
    report = net.memory(batch=batch)
    state = net.init_state(jax.random.key(2), batch=batch)
    n_trials = int(np.prod(batch))
    for row in report.populations:
        got = _bytes(state.populations[row.name])
        assert row.state_bytes_per_neuron * row.neurons == got
    for row, syn in zip(report.projections, state.synapses, strict=True):
        assert row.state_bytes == _bytes(syn)
    assert [r.bytes for r in report.rings] == [b.nbytes for b in state.buffers]
    assert report.rings[0].bytes_per_slot == 4 * 400 * n_trials  # E feeds E and I
    assert report.rings[0].slots == state.buffers[0].shape[-2]
    assert report.table_bytes == net.nbytes()
    allocated = _bytes((state.populations, state.synapses, state.buffers))
    assert report.state_bytes == allocated
    text = str(report)
    assert "E->E [" + method + "]" in text and "ring E" in text


def test_plan_from_sizes_equals_the_built_network():
    built = _net("event").memory()
    lif = nj.LIF(tau_m=20.0, v_rest=-60.0, v_reset=-60.0, v_th=-50.0)
    Plan = nj.network.ProjectionPlan
    planned = nj.network.plan_memory(
        {"E": (lif, 300), "I": (nj.Izhikevich(), 100)},
        [
            Plan("E", "E", 9000, "event", max_delay=2.0, per_synapse_delays=True),
            Plan("E", "I", 2000, "dense", max_delay=1.0, synapse_state=8),
        ],
        dt=DT,
    )
    assert [p.table_bytes for p in planned.projections] == [
        p.table_bytes for p in built.projections
    ]
    assert planned.state_bytes == built.state_bytes
    assert planned.total_bytes == built.total_bytes


def test_procedural_tables_grow_with_neurons_and_the_big_plan_is_refused():
    lif = nj.LIF()
    Plan = nj.network.ProjectionPlan
    pops = {"E": (lif, 10**6)}
    stored = nj.network.plan_memory(pops, [Plan("E", "E", 10**10, "event", max_delay=1.5)], dt=DT)
    procedural = nj.network.plan_memory(
        pops, [Plan("E", "E", 10**10, "procedural", max_delay=1.5)], dt=DT
    )
    assert stored.projections[0].bytes_per_synapse == pytest.approx(8.0, rel=1e-3)
    assert procedural.projections[0].table_bytes == 4 * 10**6 + 16
    with pytest.raises(nj.network.MemoryPlanError, match="needs 80.1 GB more memory") as err:
        stored.check(available=24 * 10**9)
    assert "E->E [event]" in str(err.value)  # the report comes with the refusal
    assert procedural.check(available=24 * 10**9) is procedural


def test_init_state_refuses_before_allocating(monkeypatch):
    net = _net("event")
    monkeypatch.setattr(_memory, "available_memory", lambda: 1000)
    with pytest.raises(nj.network.MemoryPlanError, match="Network.init_state: the network needs"):
        net.init_state(jax.random.key(0), batch=(10,))


def test_bad_plans_are_refused():
    Plan = nj.network.ProjectionPlan
    with pytest.raises(ValueError, match="method must be one of"):
        Plan("E", "E", 10, "sparse")
    with pytest.raises(ValueError, match="n_synapses must be an int >= 0, got -1"):
        Plan("E", "E", -1)
    with pytest.raises(ValueError, match="plastic projections need method='event'"):
        Plan("E", "E", 10, "procedural", plastic=True)
    with pytest.raises(ValueError, match="names 'X'"):
        nj.network.plan_memory({"E": (nj.LIF(), 5)}, [Plan("E", "X", 10)])
    with pytest.raises(ValueError, match="batch must be an int >= 1"):
        nj.network.plan_memory({"E": (nj.LIF(), 5)}, [], batch=0)


@pytest.mark.parametrize(("max_delay", "dtype", "width"), [(2.0, np.int8, 1), (20.0, np.int16, 2)])
def test_per_synapse_delays_cost_their_steps_only(max_delay, dtype, width):
    """Per-synapse delays are kept once, as whole steps (int8 up to 127 steps, int16 beyond):
    the event layout's 8 bytes per synapse plus 1 or 2, in the report and in the plan."""
    conn = nj.connect.fixed_indegree(jax.random.key(0), 300, 300, 30, weight=0.5)
    delay = np.linspace(0.1, max_delay, conn.nse)
    for dt in (None, DT):  # steps made by the network, or by the projection itself
        proj = nj.Projection("E", "E", conn, synapse=nj.Exponential(5.0), delay=delay, dt=dt)
        net = nj.Network({"E": (nj.LIF(), 300)}, [proj], dt=DT)
        kept = net.projections[0]
        assert kept.delay_ms is None and kept.delay_steps.dtype == dtype
        layout = _bytes(kept.layout)  # indptr, indices, weights: 4 (n_pre + 1) + 8 nnz
        assert layout == 4 * 301 + 8 * 9000
        assert (
            net.nbytes()
            == kept.nbytes()
            == layout + width * 9000
            == _bytes((kept.layout, kept.delay_steps))
        )
        report = net.memory()
        assert report.table_bytes == net.nbytes()
        assert report.projections[0].bytes_per_synapse == pytest.approx(8 + width, abs=0.15)
        # before the network is built, the report says what the network will keep
        unbuilt = nj.network.plan_memory({"E": (nj.LIF(), 300)}, [proj], dt=DT)
        assert unbuilt.table_bytes == net.nbytes()
    planned = nj.network.plan_memory(
        {"E": (nj.LIF(), 300)},
        [nj.network.ProjectionPlan("E", "E", 9000, max_delay=max_delay, per_synapse_delays=True)],
        dt=DT,
    )
    assert planned.table_bytes == net.nbytes()
