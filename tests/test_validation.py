"""Bad inputs fail early with a message that names the argument, the rule and the value."""

import jax.numpy as jnp
import numpy as np
import pytest

import neurojax as nj
from neurojax import surrogate as sg

LIF = nj.LIF()
S3 = LIF.init_state(3)


def _sim(**kw):
    args = dict(model=LIF, state=S3, inputs=20.0, dt=0.1, n_steps=10)
    args.update(kw)
    model, state, inputs = args.pop("model"), args.pop("state"), args.pop("inputs")
    return lambda: nj.simulate(model, state, inputs, **args)


# (id, callable, exception type, regex the message must match)
CASES = [
    # LIF parameters
    (
        "lif-tau-negative",
        lambda: nj.LIF(tau_m=-1.0),
        ValueError,
        r"LIF: tau_m must be > 0 ms, got -1\.0",
    ),
    (
        "lif-tau-zero-in-array",
        lambda: nj.LIF(tau_m=jnp.array([1.0, 0.0])),
        ValueError,
        r"LIF: tau_m must be > 0 ms, got \[0\.\]",
    ),
    (
        "lif-tau-nan",
        lambda: nj.LIF(tau_m=float("nan")),
        ValueError,
        r"LIF: tau_m must be finite, got nan",
    ),
    ("lif-r-m-zero", lambda: nj.LIF(r_m=0.0), ValueError, r"LIF: r_m must be > 0 MOhm, got 0\.0"),
    (
        "lif-t-ref-negative",
        lambda: nj.LIF(t_ref=-0.5),
        ValueError,
        r"LIF: t_ref must be >= 0 ms, got -0\.5",
    ),
    (
        "lif-reset-above-threshold",
        lambda: nj.LIF(v_reset=-40.0, v_th=-50.0),
        ValueError,
        r"LIF: v_reset must be < v_th, got v_reset=-40\.0 and v_th=-50\.0",
    ),
    (
        "lif-v-th-inf",
        lambda: nj.LIF(v_th=float("inf")),
        ValueError,
        r"LIF: v_th must be finite, got inf",
    ),
    ("lif-string-param", lambda: nj.LIF(tau_m="10"), TypeError, r"got string '10'"),
    ("lif-bool-param", lambda: nj.LIF(r_m=True), TypeError, r"got boolean True"),
    ("lif-complex-param", lambda: nj.LIF(v_rest=1j), TypeError, r"got complex 1j"),
    (
        "lif-unknown-surrogate",
        lambda: nj.LIF(surrogate="sigmoid"),
        ValueError,
        r"surrogate must be .* one of \('fast_sigmoid', 'arctan', 'triangular', 'heaviside'\), got 'sigmoid'",
    ),
    (
        "lif-param-shape-mismatch",
        lambda: nj.LIF(tau_m=jnp.ones(4)).init_state(3),
        ValueError,
        r"LIF: parameter tau_m has shape \(4,\), which does not broadcast to the population shape \(3,\)",
    ),
    # Izhikevich
    (
        "izh-unknown-preset",
        lambda: nj.Izhikevich.preset("XX"),
        ValueError,
        r"Izhikevich.preset: name must be one of \('RS', 'IB', 'CH', 'FS', 'LTS', 'TC', 'RZ'\), got 'XX'",
    ),
    (
        "izh-unknown-override",
        lambda: nj.Izhikevich.preset("RS", e=1.0),
        TypeError,
        r"Izhikevich.preset: unknown override\(s\) \['e'\]",
    ),
    (
        "izh-unknown-method",
        lambda: nj.Izhikevich(method="rk4"),
        ValueError,
        r"Izhikevich: method must be one of \('euler', 'published', 'spnet'\), got 'rk4'",
    ),
    (
        "izh-reset-above-peak",
        lambda: nj.Izhikevich(c=40.0),
        ValueError,
        r"Izhikevich: c must be < v_peak, got c=40.0 and v_peak=30.0",
    ),
    (
        "izh-a-nan",
        lambda: nj.Izhikevich(a=float("nan")),
        ValueError,
        r"Izhikevich: a must be finite, got nan",
    ),
    # AdEx
    ("adex-c-m-zero", lambda: nj.AdEx(c_m=0.0), ValueError, r"AdEx: c_m must be > 0 pF, got 0.0"),
    (
        "adex-g-l-negative",
        lambda: nj.AdEx(g_l=-3.0),
        ValueError,
        r"AdEx: g_l must be > 0 nS, got -3.0",
    ),
    (
        "adex-delta-t-negative",
        lambda: nj.AdEx(delta_t=-1.0),
        ValueError,
        r"AdEx: delta_t must be > 0 mV, got -1.0",
    ),
    (
        "adex-tau-w-zero",
        lambda: nj.AdEx(tau_w=0.0),
        ValueError,
        r"AdEx: tau_w must be > 0 ms, got 0.0",
    ),
    (
        "adex-unknown-method",
        lambda: nj.AdEx(method="midpoint"),
        ValueError,
        r"AdEx: method must be one of \('rk4', 'euler'\), got 'midpoint'",
    ),
    (
        "adex-exp-overflow",
        lambda: nj.AdEx(delta_t=0.5),
        ValueError,
        r"AdEx: \(v_peak - v_t\) / delta_t must be <= 78.7 so that the exponential term stays finite in float32",
    ),
    (
        "adex-reset-above-peak",
        lambda: nj.AdEx(v_reset=30.0),
        ValueError,
        r"AdEx: v_reset must be < v_peak, got v_reset=30.0 and v_peak=20.0",
    ),
    # state shapes
    (
        "init-state-negative-shape",
        lambda: LIF.init_state(-2),
        ValueError,
        r"LIF.init_state: shape entries must be >= 0, got \(-2,\)",
    ),
    (
        "init-state-float-shape",
        lambda: LIF.init_state(2.5),
        TypeError,
        r"LIF.init_state: shape must be an int or a tuple of ints, got 2\.5",
    ),
    # surrogates
    (
        "fast-sigmoid-slope",
        lambda: sg.FastSigmoid(slope=0.0),
        ValueError,
        r"FastSigmoid: slope must be > 0, got 0\.0",
    ),
    (
        "arctan-alpha",
        lambda: sg.Arctan(alpha=-2.0),
        ValueError,
        r"Arctan: alpha must be > 0, got -2\.0",
    ),
    (
        "triangular-width",
        lambda: sg.Triangular(width=float("nan")),
        ValueError,
        r"Triangular: width must be finite, got nan",
    ),
    # simulate
    ("sim-dt-zero", _sim(dt=0.0), ValueError, r"simulate: dt must be finite and > 0 ms, got 0\.0"),
    (
        "sim-dt-nan",
        _sim(dt=float("nan")),
        ValueError,
        r"simulate: dt must be finite and > 0 ms, got nan",
    ),
    (
        "sim-dt-string",
        _sim(dt="0.1"),
        TypeError,
        r"simulate: dt must be a Python number in ms, got '0\.1'",
    ),
    (
        "sim-n-steps-zero",
        _sim(n_steps=0),
        ValueError,
        r"simulate: n_steps must be a positive int, got 0",
    ),
    (
        "sim-n-steps-float",
        _sim(n_steps=10.0),
        TypeError,
        r"simulate: n_steps must be a positive int, got 10\.0",
    ),
    (
        "sim-n-steps-missing",
        _sim(n_steps=None),
        ValueError,
        r"simulate: n_steps is required unless inputs is a time-major array",
    ),
    (
        "sim-record-unknown",
        _sim(record=("w",)),
        ValueError,
        r"simulate: record names unknown state field 'w'; the state has \['v', 'refractory'\]",
    ),
    (
        "sim-record-type",
        _sim(record=3),
        TypeError,
        r"simulate: record must be None, a tuple of state field names",
    ),
    (
        "sim-record-every",
        _sim(record_every=3),
        ValueError,
        r"simulate: record_every=3 must divide n_steps=10",
    ),
    (
        "sim-chunk-multiple",
        _sim(record_every=2, chunk_size=3),
        ValueError,
        r"simulate: chunk_size=3 must be a multiple of record_every=2",
    ),
    (
        "sim-chunk-negative",
        _sim(chunk_size=-4),
        ValueError,
        r"simulate: chunk_size must be a positive int, got -4",
    ),
    (
        "sim-input-shape",
        _sim(inputs=jnp.ones(4)),
        ValueError,
        r"simulate: inputs of shapes \(4,\) fit the state of shapes .* neither as a constant nor as a time series",
    ),
    (
        "sim-input-ambiguous",
        _sim(inputs=jnp.ones(3), n_steps=3),
        ValueError,
        r"simulate: inputs of shapes \(3,\) are ambiguous with n_steps=3",
    ),
    (
        "sim-series-length",
        _sim(inputs=jnp.ones((7, 3)), n_steps=10),
        ValueError,
        r"neither as a constant nor as a time series of n_steps=10",
    ),
    (
        "sim-input-fn-signature",
        _sim(inputs=lambda t: t),
        ValueError,
        r"simulate: the inputs function must take \(t_ms, step_index\)",
    ),
    (
        "sim-not-a-model",
        _sim(model=object()),
        TypeError,
        r"simulate: model must have a step\(state, inputs, dt\) method",
    ),
    (
        "sim-spike-dtype",
        _sim(spike_dtype="int8"),
        ValueError,
        r"simulate: spike_dtype must be 'bool', 'ids' or None, got 'int8'",
    ),
    (
        "sim-progress-type",
        _sim(progress="yes"),
        TypeError,
        r"simulate: progress must be a bool, got 'yes'",
    ),
]


@pytest.mark.parametrize("make, exc, match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_rejected_with_a_clear_message(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_table_is_large_enough():
    assert len(CASES) >= 25
    assert len({c[0] for c in CASES}) == len(CASES)


def test_validation_is_skipped_for_traced_parameters():
    # Models built inside vmap see tracers; construction must not force them to the host.
    import jax

    taus = jax.vmap(lambda t: nj.LIF(tau_m=t).tau_m)(jnp.array([5.0, 10.0]))
    np.testing.assert_array_equal(np.asarray(taus), [5.0, 10.0])


def test_public_helpers_are_the_ones_the_models_use():
    from neurojax import _validation
    from neurojax.neurons import _base

    for name in nj.validation.__all__:
        assert getattr(nj.validation, name) is getattr(_validation, name)
    # The old private import paths keep working.
    assert _base.check_broadcast is nj.validation.check_broadcast
    for name in ("input_current", "refractory_clamped", "refractory_next"):
        assert getattr(nj.neurons, name) is getattr(_base, name)
    with pytest.raises(ValueError, match=r"Mine: tau_w must be > 0 ms, got -2\.0"):
        nj.validation.check_positive("Mine", "tau_w", nj.validation.as_float(-2.0), "ms")
    with pytest.raises(ValueError, match=r"Mine: v_reset must be < v_th, got v_reset=\[-40\.\]"):
        nj.validation.check_less("Mine", "v_reset", jnp.array([-60.0, -40.0]), "v_th", -50.0)
    with pytest.raises(ValueError, match=r"Mine: method must be one of \('a', 'b'\), got 'c'"):
        nj.validation.check_choice("Mine", "method", "c", ("a", "b"))
    with pytest.raises(TypeError, match=r"got string '10'"):
        nj.validation.as_float("10")
    with pytest.raises(ValueError, match=r"LIF: parameter tau_m has shape \(4,\)"):
        nj.validation.check_broadcast(nj.LIF(tau_m=jnp.ones(4)), (3,))


def test_check_state_fields_names_the_model_the_field_and_who_needs_it():
    import equinox as eqx
    import jax

    class NoV(eqx.Module):
        u: jax.Array

    lif = nj.LIF()
    assert nj.NeuronModel.required_state_fields == ("v",)
    nj.neurons.check_state_fields(lif, eqx.filter_eval_shape(lif.init_state, 4))
    nj.neurons.check_state_fields(lif, {"v": jnp.zeros(2)})
    with pytest.raises(
        ValueError,
        match=r"LIF: the state \(NoV\) has no field 'v'; projection 'e->i' "
        r"\(ConductanceOutput\) needs it; its fields are \('u',\)",
    ):
        nj.neurons.check_state_fields(
            lif, NoV(jnp.zeros(2)), needed_by="projection 'e->i' (ConductanceOutput)"
        )
    with pytest.raises(ValueError, match=r"LIF: the state \(dict\) has no field 'w'"):
        nj.neurons.check_state_fields(lif, {"v": jnp.zeros(2)}, ("v", "w"))
