"""How late the published Yin-Yang recipe's networks fire (benchmarks/results/eventprop_yinyang.md,
"The authors' runs have no end"): each network run on the test samples for 40, 100 and 1000
ms, with the test accuracy, the samples whose label output stays silent, the latest spike
and the most events of a run; then whether 100 and 1000 ms give the same spikes and how many
label outputs fire only after 40 ms.

    PYTHONPATH=. python benchmarks/examples/yinyang_horizon.py              # untrained, seeds 0-2
    PYTHONPATH=. python benchmarks/examples/yinyang_horizon.py --data publication_data \\
        --net 0:k0.eqx --net 1:k1.eqx    # networks saved by train_yinyang.py --save

Without `--data` the samples are `nj.training.yin_yang(200, seed=1)`; without `--net` the
untrained networks `build(seed, 200, (0.93, 0.1))` of seeds 0, 1 and 2.
"""

import argparse
import importlib.util
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from neurojax import training as nt

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_yinyang.py"
HORIZONS = (40.0, 100.0, 1000.0)


def _example():
    spec = importlib.util.spec_from_file_location("_example_train_yinyang", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", help="a folder of Kriener et al.'s sets (its test set is used)")
    ap.add_argument(
        "--net", action="append", default=[], help="SEED:FILE, a network saved by --save"
    )
    args = ap.parse_args()
    ex = _example()
    rc = ex.RECIPES["published"]
    if args.data:
        _, (x, y) = ex.load_data(args.data)
    else:
        x, y = nt.yin_yang(200, seed=1)
    times = jnp.asarray(ex.encode(x, rc["t_early"], rc["t_late"]))
    nets = []
    for item in args.net:
        seed, _, path = item.partition(":")
        if not seed.isdigit() or not Path(path).is_file():
            raise SystemExit(f"--net must be SEED:FILE with an existing FILE, got {item!r}")
        like = ex.build(int(seed), rc["n_hidden"], rc["w_out"])
        nets.append((f"seed {seed}, {path}", eqx.tree_deserialise_leaves(path, like)))
    if not nets:
        nets = [
            (f"seed {s}, untrained", ex.build(s, rc["n_hidden"], rc["w_out"])) for s in (0, 1, 2)
        ]
    rows = np.arange(len(y))
    for name, net in nets:
        runs = {}
        for t_max in HORIZONS:
            rec = jax.jit(
                jax.vmap(
                    lambda t, net=net, t_max=t_max: nt.eventprop_run(
                        net, {"in": t}, t_max=t_max, max_spikes=96, max_events=4096
                    )
                )
            )(times)
            first = np.asarray(nt.first_spike_times(rec.spike_times["out"], t_max=t_max))
            acc = float(nt.first_spike_accuracy(jnp.asarray(first), jnp.asarray(y), t_max=t_max))
            spikes = np.concatenate(
                [np.asarray(s).reshape(len(y), -1) for s in rec.spike_times.values()], axis=1
            )
            latest = float(np.max(np.where(np.isfinite(spikes), spikes, -np.inf)))
            silent = int((first[rows, y] >= t_max).sum())
            runs[t_max] = (rec, first)
            print(
                f"{name}: {t_max:6.0f} ms  accuracy {acc:.4f}  silent label outputs {silent}  "
                f"latest spike {latest:.3f} ms  most events {int(rec.n_events.max())}"
            )
        same = all(
            np.array_equal(np.asarray(runs[100.0][0].spike_times[k]), np.asarray(v))
            for k, v in runs[1000.0][0].spike_times.items()
        )
        late = int(((runs[40.0][1][rows, y] >= 40.0) & (runs[100.0][1][rows, y] < 100.0)).sum())
        print(
            f"{name}: 100 and 1000 ms give the same spikes: {same}; label outputs that fire "
            f"only after 40 ms: {late}"
        )


if __name__ == "__main__":
    main()
