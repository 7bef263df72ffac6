"""Reliability (issue 28): memory-safe kernels, verified loads, a clock that cannot wrap,
no silent wrong result, checkpoints that keep their configuration, early size checks and a
private kernel cache. Each test failed before the change it covers."""

import os
import stat
import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import sparse

import neurojax as nj
from neurojax import kernels

F32 = jnp.float32
KEY = jax.random.key(0)


def _net(method="event", delay=1.0, plastic=False, n=20):
    conn = nj.connect.fixed_prob(jax.random.key(1), n, n, 0.3, weight=0.5 if plastic else 4.0)
    proj = nj.Projection(
        "A", "A", conn, method=method, delay=delay, plasticity=nj.STDP() if plastic else None
    )
    return nj.Network({"A": (nj.LIF(), n)}, [proj], inputs={"A": 20.0}, dt=0.1)


def _corrupt(net, field, value_fn):
    return eqx.tree_at(
        lambda m: getattr(m.projections[0].layout, field),
        net,
        value_fn(getattr(net.projections[0].layout, field)),
    )


# ------------------------------------------------------------------ 1. memory-safe kernels

CORRUPTIONS = [
    ("indices", lambda a: a.at[3].set(10**6), "postsynaptic index outside"),
    ("indices", lambda a: a.at[0].set(-5), "postsynaptic index outside"),
    ("indptr", lambda a: a.at[-1].set(10**6), "rows with indptr outside"),
    ("indptr", lambda a: a.at[5].set(-7), "rows with indptr outside"),
    ("indptr", lambda a: a.at[4].set(a[6] + 1), "rows with indptr outside"),
]


@pytest.mark.parametrize("field, fn, match", CORRUPTIONS)
def test_cpu_delivery_kernel_reports_corrupted_rows_instead_of_crashing(field, fn, match):
    # Before: a segmentation fault or "double free or corruption" (the process died).
    net = _net()
    bad = _corrupt(net, field, fn)
    with pytest.raises(Exception, match=match):
        jax.block_until_ready(nj.simulate(bad, net.init_state(KEY), dt=0.1, n_steps=200))


@pytest.mark.parametrize("field", ["col_syn", "col_pre", "col_ptr", "indices"])
def test_cpu_stdp_kernel_reports_corrupted_columns_instead_of_crashing(field):
    net = _net(plastic=True)
    bad = _corrupt(net, field, lambda a: a.at[1].set(10**6))
    with pytest.raises(Exception, match="corrupted connectivity"):
        jax.block_until_ready(nj.simulate(bad, net.init_state(KEY), dt=0.1, n_steps=200))


def test_intact_networks_still_deliver_every_spike_on_both_paths():
    net = _net(delay=0.5)
    st = net.init_state(KEY)
    _, rec = nj.simulate(net, st, dt=0.1, n_steps=300)
    with kernels.use("reference"):
        _, ref = nj.simulate(net, st, dt=0.1, n_steps=300)
    assert int(rec.spikes["A"].sum()) > 40
    np.testing.assert_array_equal(np.asarray(rec.spikes["A"]), np.asarray(ref.spikes["A"]))


@pytest.mark.parametrize(
    "field, fn, match",
    CORRUPTIONS
    + [
        ("weights", lambda a: a.at[2].set(jnp.nan), "non-finite weights"),
        ("indptr", lambda a: a.at[0].set(1), "indptr starts at 1"),
    ],
)
def test_load_revalidates_forged_connectivity(tmp_path, field, fn, match):
    # A file whose checksums are right but whose compressed rows point outside the
    # population: before, `load` returned it and the next run crashed the process.
    net = _net()
    nj.save(tmp_path / "net.nj", _corrupt(net, field, fn))
    with pytest.raises(ValueError, match=r"load: checkpoint .*EventLayout") as info:
        nj.load(tmp_path / "net.nj", net)
    assert any(w in str(info.value) for w in (match, "indptr", "indices")), info.value


def test_load_revalidates_forged_columns_and_parameters(tmp_path):
    net = _net(plastic=True)
    nj.save(tmp_path / "net.nj", _corrupt(net, "col_syn", lambda a: a[::-1]))
    with pytest.raises(ValueError, match=r"the columns \(col_syn, col_pre\) are not those"):
        nj.load(tmp_path / "net.nj", net)
    lif = nj.LIF()
    nj.save(tmp_path / "lif.nj", eqx.tree_at(lambda m: m.tau_m, lif, jnp.asarray(-1.0, F32)))
    with pytest.raises(ValueError, match=r"loaded LIF fails its constructor's check.*tau_m"):
        nj.load(tmp_path / "lif.nj", lif)


@pytest.mark.parametrize("method", ["dense", "bcoo", "event"])
@pytest.mark.parametrize(
    "index, match",
    [((0, 5), r"postsynaptic index is outside \[0, 3\).*\[5\]"), ((-1, 1), r"presynaptic.*\[-1\]")],
)
def test_out_of_range_bcoo_indices_are_refused_by_every_layout(method, index, match):
    # Before: the dense and BCOO layouts dropped the entry (negative ones wrapped around).
    conn = sparse.BCOO((jnp.ones(2, F32), jnp.array([[0, 1], list(index)])), shape=(3, 3))
    with pytest.raises(ValueError, match="Projection: conn has 1 synapse"):
        nj.Projection("A", "B", conn, method=method)
    with pytest.raises(ValueError, match=match):
        nj.Projection("A", "B", conn, method=method)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_bcoo_weights_are_refused(bad):
    conn = sparse.BCOO((jnp.array([1.0, bad], F32), jnp.array([[0, 1], [1, 2]])), shape=(3, 3))
    with pytest.raises(ValueError, match=r"Projection: conn has 1 non-finite weight.*entry 1"):
        nj.Projection("A", "B", conn)
