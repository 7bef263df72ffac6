"""The one run loop (`neurojax._run_loop`) as `nj.simulate` uses it: chunks, blocks of trials,
reruns of a chunk whose spikes did not fit, spike ids, and the split of compile and run time.

References: the unchunked, unblocked run of the same call (bit for bit), and the raster's own
nonzero entries for the spike-id recording."""

import jax
import numpy as np
import pytest

import neurojax as nj


def _coba(batch=()):
    return nj.models.coba(jax.random.key(3), batch=batch)


def test_batch_blocks_in_chunks_equal_one_blocked_call():
    net, state = _coba(batch=(4,))
    blocks = nj.Execution(batch_block=2)
    _, whole = nj.simulate(net, state, dt=0.1, n_steps=300, run=blocks, record_every=10)
    final, chunked = nj.simulate(
        net,
        state,
        dt=0.1,
        n_steps=300,
        run=nj.Execution(batch_block=2, chunk_size=100),
        record_every=10,
    )
    for pop in whole.spikes:
        np.testing.assert_array_equal(np.asarray(whole.spikes[pop]), chunked.spikes[pop])
    assert chunked.info.chunks == 3
    assert int(final.step) == 300


def test_spike_ids_equal_the_raster_and_keep_the_clock():
    net, state = _coba()
    mid, _ = nj.simulate(net, state, dt=0.1, n_steps=50)
    _, raster = nj.simulate(net, mid, dt=0.1, n_steps=400)
    _, ids = nj.simulate(
        net, mid, dt=0.1, n_steps=400, record=nj.Record(spikes="ids"), chunk_size=100
    )
    for pop, r in raster.spikes.items():
        steps, neurons = np.nonzero(np.asarray(r))
        got = ids.spikes[pop]
        assert isinstance(got, nj.SpikeTimes)
        np.testing.assert_array_equal(got.i, neurons)
        np.testing.assert_array_equal(got.step, steps + 50)
        np.testing.assert_allclose(got.t, (steps + 51) * 0.1)
        assert got.trial is None
    # From rest, COBA's first steps fire more neurons than a first buffer of 256 ids holds:
    # the chunk reruns with a larger one and no spike is lost.
    _, burst_raster = nj.simulate(net, state, dt=0.1, n_steps=30)
    _, burst = nj.simulate(net, state, dt=0.1, n_steps=30, record=nj.Record(spikes="ids"))
    assert burst.info.reruns >= 1
    counts = np.asarray(burst_raster.spikes["E"]).sum(axis=1)
    assert counts.max() > 256
    np.testing.assert_array_equal(np.bincount(burst.spikes["E"].step, minlength=30), counts)


def test_spike_ids_of_a_batch_name_the_trial():
    net, state = _coba(batch=(3,))
    _, raster = nj.simulate(net, state, dt=0.1, n_steps=200)
    _, ids = nj.simulate(net, state, dt=0.1, n_steps=200, record=nj.Record(spikes="ids"))
    for pop, r in raster.spikes.items():
        steps, trials, neurons = np.nonzero(np.asarray(r))
        got = ids.spikes[pop]
        np.testing.assert_array_equal(got.trial, trials)
        np.testing.assert_array_equal(got.i, neurons)
        np.testing.assert_array_equal(got.step, steps)


def test_spike_ids_are_refused_where_they_cannot_be_built():
    lif = nj.LIF()
    with pytest.raises(ValueError, match="spikes='ids' keeps every spike with its step"):
        nj.Record(spikes="ids", every=2)
    ids = nj.Record(spikes="ids")
    f = jax.jit(lambda s: nj.simulate(lif, s, 20.0, dt=0.1, n_steps=10, record=ids)[0])
    with pytest.raises(ValueError, match=r"as nj.Record\(spikes='ids'\) does"):
        f(lif.init_state(5))
    with pytest.raises(ValueError, match="spikes must be one of 'raster', 'ids', 'float'"):
        nj.Record(spikes="int")


def test_run_info_splits_compile_from_run_time():
    lif = nj.LIF(tau_m=17.0)  # a configuration no other test compiles
    _, first = nj.simulate(lif, lif.init_state(7), 20.0, dt=0.1, n_steps=300)
    _, again = nj.simulate(lif, lif.init_state(7), 20.0, dt=0.1, n_steps=300)
    assert first.info.n_steps == 300 and first.info.chunks == 1
    assert first.info.compile_s > 0.0
    # The second call reuses the compiled program: nothing is traced or compiled.
    assert again.info.compile_s == 0.0
    assert again.info.run_s > 0.0 and again.info.steps_per_s > 0.0
    # Under a transformation nothing runs inside simulate: no info.
    rec = jax.jit(lambda s: nj.simulate(lif, s, 20.0, dt=0.1, n_steps=10)[1])(lif.init_state(7))
    assert rec.info is None
