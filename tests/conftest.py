"""Test-session settings: strict dtype promotion, the fast loop, time limits, markers.

Implicit promotion between different array dtypes (say float32 with int32 arrays) raises
during the tests, so that a model never silently computes in an unexpected precision.
Python scalars stay weakly typed and are allowed. `tests/README.md` maps modules to test
files and describes the markers (`fast`, `slow`, `cross_platform`).
"""

import os

# `make test` runs two pytest-xdist workers; on a GPU each would otherwise preallocate 75 % of
# the device's memory at its first JAX call, and the second would fail. No effect on CPU.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402  (after the environment is set)
import pytest  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")

# `pytester` runs a pytest session inside a test (tests/test_docs_tests.py checks the hooks
# below that way).
pytest_plugins = ("pytester",)

# Float32 matrix products at full precision on every backend. On recent NVIDIA GPUs JAX's
# default lets XLA use TF32 (10-bit mantissa) for float32 matmuls, and the tests compare
# batched, looped, checkpointed and reference runs to within 1e-5 or exactly. On CPU this
# changes nothing.
jax.config.update("jax_default_matmul_precision", "highest")


# ------------------------------------------------------------------------------ the fast loop

# `make test-fast` (`pytest -m fast`): a smoke test of every module, chosen here and nowhere
# else. File name -> test names: a parametrized test by its full name (`test_x[case]`, that
# case only) or by its function name (every case). Each entry runs its module at a small
# size: a value against a reference where one is cheap, else the module's checks of its
# arguments, which import and exercise it; the whole set runs in under 3 minutes on two
# cores. `tests/test_docs_tests.py` checks that every test file has an entry (or a reason
# in `NO_FAST_TESTS`) and that every name exists.
FAST_TESTS: dict[str, tuple[str, ...]] = {
    "test_adex.py": ("test_init_state", "test_refractory_clamp"),
    "test_adversarial.py": (
        "test_bad_input_is_refused_with_a_message_before_compiling[lif-tau-zero]",
    ),
    "test_analysis.py": (
        "test_firing_rates_of_hand_built_raster",
        "test_cv_of_regular_trains_is_zero_and_small_counts_are_reported",
    ),
    "test_assembly.py": (
        "test_kcap_breaks_ties_toward_lower_index_and_always_fires_k",
        "test_overlap_counts_shared_neurons",
    ),
    "test_assembly_accelerators.py": (
        "test_census_regex_sees_tuple_shaped_whiles_and_unknown_trip_counts",
    ),
    "test_assembly_kernels.py": (
        "test_dense_update_kernel_equals_definition_and_jax_exactly[True]",
    ),
    "test_assembly_numpy_reference.py": (
        "test_k_cap_ties_to_lower_index",
        "test_candidate_threshold_is_the_binomial_quantile",
    ),
    "test_assembly_soft.py": ("test_soft_kcap_is_monotone",),
    "test_bench_gpu.py": ("test_effective_limit_keeps_the_later_sections_minimum",),
    "test_benchmarks_plasticity_stp.py": (
        "test_same_spikes_releases_equal_the_static_weight[auto]",
    ),
    "test_benchmarks_run_all.py": (
        "test_every_script_is_run_or_left_out_with_a_reason",
        "test_quick_plan",
    ),
    "test_benchmarks_sweep.py": ("test_scales_hold_the_published_parameters",),
    "test_benchmarks_training.py": ("test_problem_is_deterministic_float32",),
    "test_checkpoint_fuzz.py": ("test_any_json_header_gives_the_documented_error",),
    "test_cli.py": ("test_unknown_model_exits_2_naming_the_choices",),
    "test_compilation_cache.py": ("test_bad_arguments_are_refused",),
    "test_connectivity.py": (
        "test_fixed_degrees_are_exact[300-200-40-True-fixed_indegree]",
        "test_stats_on_hand_made_matrices",
    ),
    "test_connectivity_fixed_total.py": ("test_exact_count_shape_and_order",),
    "test_contract.py": (
        "test_state_protocol[lif]",
        "test_batched_equals_stacked_single_runs[lif]",
    ),
    "test_distal_reward_network.py": ("test_rewards_follow_the_pairings_of_the_chosen_synapse",),
    "test_docs.py": ("test_nav_references_only_pages_that_exist_and_lists_every_page",),
    "test_docs_snippets.py": (
        "test_blocks_reads_fences_markers_and_indented_blocks",
        "test_outputs_match_words_exactly_and_numbers_within_tolerance",
        "test_every_block_runs_or_says_why",
    ),
    "test_docs_tests.py": ("test_fast_tests_name_every_test_file_and_existing_tests",),
    "test_formats.py": ("test_missing_extra_names_it[<lambda>-h5py-sonata]",),
    "test_hh_fused.py": ("test_applies_only_to_hodgkin_huxley_steps_with_constant_float_input",),
    "test_hodgkin_huxley.py": (
        "test_init_state_is_the_resting_state[float32]",
        "test_rates_match_formulas[float32]",
    ),
    "test_io.py": ("test_round_trip_of_every_leaf_kind", "test_spike_table_of_a_small_raster"),
    "test_izhikevich.py": ("test_presets_have_published_parameters", "test_init_state"),
    "test_kernels.py": (
        "test_registration_rejects_duplicates_and_bad_entries",
        "test_bad_mode_is_refused",
    ),
    "test_layouts.py": ("test_product_equals_numpy[event]",),
    "test_learnable_delays.py": ("test_invalid_options_are_refused",),
    "test_lif.py": (
        "test_first_step_and_first_spike_match_nest",
        "test_refractory_clamp_lasts_t_ref",
    ),
    "test_lif_fused.py": ("test_applies_only_to_lif_steps_with_constant_float_input",),
    "test_lowering.py": ("test_lowering_fails_loudly_for_an_unsupported_kernel",),
    "test_memory_plan.py": ("test_bad_plans_are_refused",),
    "test_merge_synapses.py": ("test_merge_synapses_argument_is_checked",),
    "test_microcircuit.py": (
        "test_bad_arguments_are_refused",
        "test_dc_compensation_matches_the_reference_formula",
    ),
    "test_network.py": (
        "test_arrivals_match_reference_without_delay[kernel-event]",
        "test_homogeneous_delay_matches_reference[jax-event]",
    ),
    "test_nir.py": ("test_affine_linear_scale_match_numpy",),
    "test_notebooks.py": ("test_the_numbered_notebooks_are_exactly_the_expected_ones",),
    "test_pallas.py": (
        "test_slot_cases_exist",
        "test_interpret_switch_is_checked_and_read_from_the_environment",
    ),
    "test_parallel_multihost.py": ("test_initialize_argument_errors",),
    "test_parallel_shard.py": ("test_argument_errors",),
    "test_parallel_sweep.py": ("test_sweep_errors",),
    "test_plasticity_kernels.py": ("test_only_rules_the_kernel_implements_claim_it",),
    "test_plasticity_rules.py": ("test_incomplete_or_foreign_rules_are_rejected",),
    "test_procedural.py": ("test_bad_inputs_are_refused_with_clear_messages",),
    "test_procedural_draws.py": ("test_uniform_is_inside_the_open_interval_at_every_word",),
    "test_procedural_kernel.py": ("test_corrupted_descriptions_are_refused",),
    "test_reliability.py": (
        "test_non_finite_and_complex_inputs_are_refused",
        "test_set_winners_out_of_range_raises_with_the_value_at_once",
    ),
    "test_reward_stdp.py": ("test_bad_inputs_and_parameters_are_rejected",),
    "test_ring_inplace.py": ("test_ring_copies_finds_a_copied_ring",),
    "test_round_trips.py": ("test_census_sees_conditionals_and_data_dependent_loops",),
    "test_sharded_checkpoints.py": ("test_checksum_is_the_same_for_numpy_and_jax_arrays",),
    "test_short_term.py": ("test_invalid_parameters_are_refused",),
    "test_simulate.py": ("test_input_kinds_agree", "test_record_function_and_pytree_outputs"),
    "test_spike_matmul.py": ("test_forward_equals_numpy",),
    "test_stdp.py": ("test_single_pair_reproduces_window_in_float32[0.1]",),
    "test_surrogate.py": ("test_forward_is_exact_step", "test_derivative_equals_analytic_form"),
    "test_synapses.py": ("test_kernel_is_sampled_exactly_on_the_grid", "test_outputs"),
    "test_threads.py": ("test_parse_env", "test_use_cpu_threads_refuses_bad_counts"),
    "test_threefry_host.py": (
        "test_threefry_known_answer",
        "test_split_fold_in_and_bits_equal_jax_random[0]",
    ),
    "test_trace_platforms.py": ("test_bad_flag_is_refused",),
    "test_training.py": (
        "test_current_encode_repeats",
        "test_dense_layer_equals_numpy_recursion_and_stepwise",
    ),
    "test_training_conv.py": ("test_conv_output_shape_follows_pytorch",),
    "test_training_examples.py": ("test_digits_rejects_bad_arguments",),
    "test_triplet_stdp.py": ("test_presets_are_the_papers_sets",),
    "test_adversarial_io.py": ("test_from_nir_refuses_malformed_edges",),
    "test_eventprop.py": ("test_refusals_name_the_argument",),
    "test_first_run.py": ("test_import_loads_neither_matplotlib_nor_scipy",),
    "test_gpu_run.py": ("test_whole_run_arguments_are_checked",),
    "test_gpu_network_run.py": ("test_kernel_arguments_are_checked",),
    "test_gpu_step.py": ("test_proxy_counts_a_loop_it_is_shown",),
    "test_gradient_mask.py": ("test_dense_layout_keeps_its_synapses_in_bits",),
    "test_layers.py": ("test_every_unit_of_the_package_has_a_layer",),
    "test_run_loop.py": ("test_spike_ids_are_refused_where_they_cannot_be_built",),
    "test_simulate_options.py": (
        "test_option_objects_check_their_fields",
        "test_a_value_given_both_ways_is_refused",
    ),
    "test_thread_determinism.py": ("test_coba",),
    "test_network_cpu_run.py": ("test_what_it_does_not_take_is_said",),
    "test_yinyang.py": (
        "test_ttfs_encode_and_latency_digits",
        "test_the_published_sets_load_with_their_layout_checked",
    ),
    "test_validation.py": ("test_public_helpers_are_the_ones_the_models_use",),
    "test_vogels.py": ("test_alpha_and_bad_parameters",),
}

# Test files without a fast test, and why (their modules are smoked by the files named).
NO_FAST_TESTS: dict[str, str] = {
    "test_benchmarks.py": "each test runs a benchmark script (tens of seconds); run_all's plan is"
    " in test_benchmarks_run_all.py",
    "test_stdp_examples.py": "each test runs an example script in a subprocess; STDP is in"
    " test_stdp.py",
    "test_brette_statistics.py": "slow only (COBA and CUBA against Brian2 over five seeds)",
    "test_eventprop_reference.py": "holds the float64 event-queue reference that"
    " test_eventprop.py compares against; no tests of its own",
}


# ------------------------------------------------------------------------------ markers

# Per-test time limits (pytest-timeout). The default of `[tool.pytest.ini_options] timeout`
# covers the tests of `make test`; a test marked slow gets this one unless it sets its own
# `@pytest.mark.timeout(...)`. Both are limits for a hung test on a loaded 2-core machine,
# not speed targets.
SLOW_TIMEOUT_S = 3600


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the fast loop's tests `fast` (from `FAST_TESTS`) and give slow tests their limit."""
    for item in items:
        chosen = FAST_TESTS.get(item.path.name, ())
        if item.name in chosen or getattr(item, "originalname", None) in chosen:
            item.add_marker(pytest.mark.fast)
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))


# Each worker of `make test` runs about 1 200 tests in one process; the programs JAX compiles
# for one module are kept (with their buffers) until the process ends, and a worker grew to
# 6 GB and more by the end of the suite, where one was killed without a signal or traceback
# (twice, in different tests; every test passes alone). Dropping JAX's caches after each
# module keeps a worker's memory to what its current module needs; a later module compiles
# its own programs anyway.
@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    yield
    import gc

    jax.clear_caches()
    gc.collect()


# Modules marked `cross_platform` (`pytestmark = pytest.mark.cross_platform`) check the GPU
# and TPU implementations of kernels (their lowering, their presence in traced programs) on
# this CPU machine: kernel calls there trace every platform's implementation, as
# `nj.kernels.cross_platform()` does for a user lowering for another platform. Elsewhere the
# default holds (only the default backend's implementation traced).
@pytest.fixture(autouse=True)
def _cross_platform_kernels(request: pytest.FixtureRequest):
    if request.node.get_closest_marker("cross_platform") is not None:
        import neurojax as nj

        with nj.kernels.cross_platform():
            yield
    else:
        yield
