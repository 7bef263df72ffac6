"""Benchmark: one network sharded along the neuron axis (`shard_network`) over host devices.

The CUBA network of Brette et al. (2007) (`nj.models.cuba`: LIF, exponential current
synapses, 80 % excitatory) is split over 1, 2, 4 and 8 devices forced on the host
(`XLA_FLAGS=--xla_force_host_platform_device_count=N`, one child process per device count,
set before JAX starts):

- strong scaling: 4000 neurons, p = 0.02 (fan-in 80), whatever the device count;
- weak scaling: 4000 neurons per device (4000 to 32000), p = 80 / N so that every neuron
  keeps a fan-in of 80 and the per-device work stays fixed.

Host "devices" share the machine's cores (one by default, `--threads 2` for two), so this
measures the cost of partitioning and of the per-step exchange, not a speed-up. Reported per
configuration (one JSON line), each a median of `--repeats` timed runs of `--steps` steps of
0.1 ms (default 10000 for strong and 2000 for weak scaling) after a warm-up that compiles
(each `*_us` also comes as `*_min_us`, the fastest repeat, steadier on a shared machine):

- `step_us`: time per step of `ShardedNetwork.run` (all-gather of the bit-packed spikes);
- `step_no_exchange_us`: the same program with the all-gather replaced by a local copy
  (same packing and unpacking, no communication; its spikes are wrong);
  `exchange_us_per_step` = `step_us - step_no_exchange_us`;
- `allgather_only_us`: a scan of nothing but the all-gather of the same packed words;
- `step_bool_us`: the exchange as a boolean vector (1 byte per neuron) instead of bits;
- `unsharded_step_us`: `nj.simulate(network, ...)` on one device, the reference;
- `bytes_gathered_per_step` (what each device holds after the all-gather, `4 n_dev
  ceil(local neurons / 32)`), `bytes_sent_per_device_per_step`, `bytes_moved_per_step` (every
  device receiving every other device's words) and `bool_bytes_gathered_per_step`;
- the spike-count lower bound: `spikes_per_step` at the observed rate,
  `spike_id_bytes_per_step` (int32 ids) and `spike_id_min_bytes_per_step`
  (`ceil(log2 N)` bits per id), which is what a sparse exchange of spike ids would move;
- `identical_to_unsharded`: the sharded spikes equal the unsharded run's, bit for bit.

Run: `python -m benchmarks.parallel_scaling [--quick] [--devices 1,2,4,8] [--steps S]
[--mode strong,weak] [--threads 1|2] [--repeats R]`. `--quick`: 2000-neuron strong scaling
and 500 neurons per device, 1000 steps. There are no peers (`--no-peers` is ignored).
"""

import argparse
import json
import math
import subprocess
import sys

from . import _harness

DEVICES = (1, 2, 4, 8)
DT = 0.1  # ms
N_STEPS = 10000
WEAK_STEPS = 2000  # up to 32000 neurons on the host's cores: a shorter run
FAN_IN = 80  # p = 0.02 at the benchmark's 4000 neurons
STRONG_N = 4000
WEAK_PER_DEVICE = 4000
QUICK_STRONG_N = 2000
QUICK_WEAK_PER_DEVICE = 500
SEED = 0


def _extra(parser) -> None:
    parser.add_argument("--devices", default="1,2,4,8", help="comma-separated device counts")
    parser.add_argument("--steps", type=int, default=None, help="steps of 0.1 ms per run")
    parser.add_argument("--mode", default="strong,weak", help="strong, weak or both")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)


def _time(call, args):
    timing, out = _harness.time_call(call, repeats=args.repeats, budget_s=args.budget)
    return timing, out


def _child(args, spec: dict) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    import neurojax as nj
    from neurojax.parallel import _shard

    n_dev, n, steps = spec["n_devices"], spec["n"], spec["steps"]
    if jax.device_count() != n_dev:
        raise RuntimeError(f"expected {n_dev} host devices, got {jax.device_count()}")
    n_exc = n * 4 // 5
    p = min(1.0, FAN_IN / n)
    net, state = nj.models.cuba(jax.random.key(SEED), n_exc=n_exc, n_inh=n - n_exc, p=p)
    mesh = jax.make_mesh((n_dev,), ("neurons",))
    sharded = _shard.shard_network(net, mesh)
    s0 = sharded.shard_state(state)
    record = {
        "bench": "parallel_scaling",
        "impl": "neurojax",
        "mode": spec["mode"],
        "n_devices": n_dev,
        "n": n,
        "neurons_per_device": sum(sharded.blocks),
        "n_synapses": net.n_synapses,
        "p": p,
        "steps": steps,
        "dt": DT,
        "threads": args.threads,
        "cpu_kernel": _harness.neurojax_cpu_kernel(),
    }

    def sharded_run(exchange):
        return lambda: jax.block_until_ready(
            _shard._run_jit(sharded, s0, None, dt=DT, n_steps=steps, exchange=exchange)
        )

    def per_step(name, timing):
        # The median, and the minimum, which is steadier when other work shares the cores.
        record[f"{name}_us"] = timing.run_s / steps * 1e6
        record[f"{name}_min_us"] = timing.run_min_s / steps * 1e6

    timing, (_, spikes) = _time(sharded_run("bits"), args)
    record.update(timing.as_dict())
    per_step("step", timing)
    per_step("step_no_exchange", _time(sharded_run("none"), args)[0])
    record["exchange_us_per_step"] = record["step_us"] - record["step_no_exchange_us"]
    record["exchange_min_us_per_step"] = record["step_min_us"] - record["step_no_exchange_min_us"]
    per_step("step_bool", _time(sharded_run("bool"), args)[0])

    # The collective alone: a scan of all-gathers of the same number of packed words.
    words = sharded.exchange_nbytes // (4 * n_dev)

    def gather_body(x):
        def one(c, _):
            g = jax.lax.all_gather(c, "neurons", tiled=False)
            return c ^ g[-1], None  # depends on the gathered words: not optimised away

        return jax.lax.scan(one, x, None, length=steps)[0]

    gather_only = jax.jit(
        jax.shard_map(
            gather_body, mesh=mesh, in_specs=P("neurons"), out_specs=P("neurons"), check_vma=False
        )
    )
    words0 = jax.device_put(
        jnp.zeros((n_dev * words,), jnp.uint32), jax.sharding.NamedSharding(mesh, P("neurons"))
    )
    per_step("allgather_only", _time(lambda: jax.block_until_ready(gather_only(words0)), args)[0])

    def unsharded():
        return jax.block_until_ready(nj.simulate(net, state, dt=DT, n_steps=steps)[1].spikes)

    t_ref, ref = _time(unsharded, args)
    per_step("unsharded_step", t_ref)
    got = sharded.to_host(spikes)
    record["identical_to_unsharded"] = all(np.array_equal(got[k], np.asarray(ref[k])) for k in ref)

    n_spikes = int(sum(int(got[k].sum()) for k in got))
    per_step = n_spikes / steps
    record.update(
        rate_hz=n_spikes / (n * steps * DT * 1e-3),
        spikes_per_step=per_step,
        bytes_gathered_per_step=sharded.exchange_nbytes,
        bytes_sent_per_device_per_step=sharded.exchange_nbytes // n_dev,
        bytes_moved_per_step=(n_dev - 1) * sharded.exchange_nbytes,
        bool_bytes_gathered_per_step=n_dev * sum(sharded.blocks),
        spike_id_bytes_per_step=4 * per_step,
        spike_id_min_bytes_per_step=per_step * math.ceil(math.log2(n)) / 8,
    )
    record["bits_over_ids"] = record["bytes_gathered_per_step"] / max(
        record["spike_id_bytes_per_step"], 1e-12
    )
    return record


def main(argv: list[str] | None = None) -> int:
    args = _harness.parse_args(
        __doc__.splitlines()[0], sizes=DEVICES, quick_sizes=DEVICES, argv=argv, extra=_extra
    )
    if args.child is not None:
        _harness.emit(_child(args, json.loads(args.child)))
        return 0
    devices = [int(d) for d in args.devices.split(",") if d.strip()]
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    if any(m not in ("strong", "weak") for m in modes) or not modes:
        raise SystemExit(f"--mode must list strong and/or weak, got {args.mode!r}")
    default_steps = {
        "strong": 1000 if args.quick else N_STEPS,
        "weak": 1000 if args.quick else WEAK_STEPS,
    }
    strong_n = QUICK_STRONG_N if args.quick else STRONG_N
    per_device = QUICK_WEAK_PER_DEVICE if args.quick else WEAK_PER_DEVICE
    failed = 0
    for mode in modes:
        for n_dev in devices:
            n = strong_n if mode == "strong" else per_device * n_dev
            spec = {"mode": mode, "n_devices": n_dev, "n": n}
            spec["steps"] = args.steps or default_steps[mode]
            _harness.log(f"parallel_scaling: {spec}")
            env = _harness.thread_env(args.threads)
            flags = env.get("XLA_FLAGS", "")
            env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n_dev}".strip()
            cmd = [sys.executable, "-m", "benchmarks.parallel_scaling", "--child", json.dumps(spec)]
            cmd += ["--threads", str(args.threads), "--repeats", str(args.repeats)]
            cmd += ["--budget", str(args.budget)]
            proc = subprocess.run(
                cmd, cwd=_harness.REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True
            )
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                failed += 1
                _harness.emit(
                    {
                        "bench": "parallel_scaling",
                        "impl": "neurojax",
                        **spec,
                        "error": f"child exited with {proc.returncode} (its stderr is above)",
                    }
                )
                continue
            print(lines[-1], flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
