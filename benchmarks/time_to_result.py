"""Time to a result: the COBA network from the command to the prompt (issue 24, point 0).

What a user waits for is the whole command, not the simulation loop. Every run here is a
fresh process started from the shell's point of view, pinned to one core (`taskset`), with
its wall time from start to exit, measured in interleaved rounds:

- `neurojax run coba --duration MS --json` (the command line pins itself to one core and
  turns on the persistent compilation cache): **first**, with an empty compilation-cache
  folder (the C++ kernels, built once per machine, are already built), and **repeated**,
  the same command again;
- `import neurojax; nj.models.coba(key)` in a fresh Python process (the compilation cache on):
  the import and the network build as a script or notebook pays them;
- Brian2 (`benchmarks.peers.brian2_coba`) in **C++ standalone** mode: first, into a new
  project folder (code generation and a full compilation), and repeated, into the same folder;
  and in **cython** mode (Brian2 keeps compiled code objects in its own on-disk cache, so
  every run after the first on a machine is a repeated one);
- NEST 3 (`benchmarks.peers.nest_coba`, `iaf_cond_exp`), whose runs need no compilation.

Inside each process the peers also report their own build and loop times, printed beside.

- `import neurojax` alone in a fresh Python process (what every script pays first).

Every process runs with Python's default bytecode caching: `PYTHONDONTWRITEBYTECODE` is
removed from the children's environment (a development container may set it, and then every
start recompiles neurojax's ~100 modules from source, about 0.5 s, which no user pays);
`--keep-env` keeps the environment as it is.

The neurojax cases run `python -m neurojax` (and `import neurojax`) from a checkout's root, so
that checkout's package is the one imported: `--trees A B` times several checkouts (a branch
against an untouched main) in the same interleaved rounds, each with its own compilation-cache
folder; the default is this checkout. Rows then carry the checkout's folder name.

    python -m benchmarks.time_to_result [--rounds 3] [--duration 1000] [--keep-env]
        [--trees DIR ...] [--no-peers]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _core() -> str:
    return str(max(os.sched_getaffinity(0)))


_KEEP_ENV = [False]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    if not _KEEP_ENV[0]:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _timed(cmd: list[str], env: dict[str, str], cwd: Path = ROOT) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(
        ["taskset", "-c", _core(), *cmd],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=1800,
        check=True,
    )
    return time.perf_counter() - t0, out.stdout


def _last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    return {}


def neurojax_run(cache_dir: str, duration: float, tree: Path = ROOT) -> dict:
    env = _env(NEUROJAX_COMPILATION_CACHE_DIR=cache_dir)
    cmd = [sys.executable, "-m", "neurojax", "run", "coba", "--duration", str(duration), "--json"]
    wall, out = _timed(cmd, env, tree)
    info = _last_json(out)
    timing = info.get("timing", info)
    keep = ("build_s", "kernel_build_s", "compile_s", "run_s")
    return {"wall_s": wall, **{k: timing[k] for k in keep if k in timing}}


_IMPORT = """
import json, sys, time
t0 = time.perf_counter()
import neurojax
t1 = time.perf_counter()
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"matplotlib", "scipy"})
print(json.dumps({"import_s": t1 - t0, "loaded": heavy}))
"""


def python_import(tree: Path = ROOT) -> dict:
    """`import neurojax` alone in a fresh Python process, timed inside it and from outside."""
    wall, out = _timed([sys.executable, "-c", _IMPORT], _env(), tree)
    return {"wall_s": wall, **_last_json(out)}


_PYTHON_BUILD = """
import json, time
t0 = time.perf_counter()
import jax, neurojax as nj
t1 = time.perf_counter()
nj.enable_compilation_cache()
net, state = nj.models.coba(jax.random.key(0))
jax.block_until_ready(state)
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "build_s": t2 - t1}))
"""


def python_build(cache_dir: str, tree: Path = ROOT) -> dict:
    """`import neurojax` and `nj.models.coba(key)` in a fresh Python process, timed inside
    it (the compilation cache on, in `cache_dir`)."""
    env = _env(NEUROJAX_COMPILATION_CACHE_DIR=cache_dir)
    wall, out = _timed([sys.executable, "-c", _PYTHON_BUILD], env, tree)
    return {"wall_s": wall, **_last_json(out)}


def peer(module: str, spec: dict) -> dict:
    wall, out = _timed([sys.executable, "-m", module, json.dumps(spec)], _env())
    info = _last_json(out)
    keep = ("build_s", "compile_s", "first_call_s", "import_s", "times_s")
    return {"wall_s": wall, **{k: info[k] for k in keep if k in info}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=1000.0, help="simulated ms")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument(
        "--cython-only",
        action="store_true",
        help="of the peers, run only Brian2's cython mode (the bar of issue 41)",
    )
    ap.add_argument(
        "--keep-env",
        action="store_true",
        help="keep PYTHONDONTWRITEBYTECODE if set (default: Python's bytecode caching)",
    )
    ap.add_argument(
        "--trees",
        nargs="+",
        type=Path,
        default=[ROOT],
        help="checkouts whose neurojax to time, interleaved (default: this one)",
    )
    args = ap.parse_args(argv)
    _KEEP_ENV[0] = args.keep_env
    for tree in args.trees:
        if not (tree / "neurojax" / "__init__.py").is_file():
            ap.error(f"--trees: {str(tree)!r} is not a neurojax checkout (no neurojax/__init__.py)")
    trees = [t.resolve() for t in args.trees]
    if args.rounds < 1 or not args.duration > 0:
        ap.error("--rounds must be >= 1 and --duration > 0")
    rows: dict[str, list[dict]] = {}

    def record(name: str, res: dict) -> None:
        rows.setdefault(name, []).append(res)
        print(json.dumps({"case": name, **res}), flush=True)

    b2_spec = {
        "model": "coba",
        "threads": 1,
        "seed": 1,
        "duration_ms": args.duration,
        "repeats": 0,
        "budget_s": 0.0,
    }
    for _ in range(args.rounds):
        for tree in trees:
            tag = f" [{tree.name}]" if len(trees) > 1 else ""
            cache = tempfile.mkdtemp(prefix="nj_cc_")
            try:
                record(
                    f"neurojax run coba, first (empty compilation cache){tag}",
                    neurojax_run(cache, args.duration, tree),
                )
                record(
                    f"neurojax run coba, repeated{tag}", neurojax_run(cache, args.duration, tree)
                )
                # The command line's programs are compiled with its own flags (one thread),
                # so the first Python process compiles its own; the second finds them cached.
                record(
                    f"python: import neurojax; nj.models.coba(key), first{tag}",
                    python_build(cache, tree),
                )
                record(
                    f"python: import neurojax; nj.models.coba(key), repeated{tag}",
                    python_build(cache, tree),
                )
                record(f"python: import neurojax{tag}", python_import(tree))
            finally:
                shutil.rmtree(cache, ignore_errors=True)
        if args.no_peers:
            continue
        if args.cython_only:
            spec = dict(b2_spec, mode="cython", repeats=1, budget_s=1e9)
            record(
                "brian2 cython (code objects cached)", peer("benchmarks.peers.brian2_coba", spec)
            )
            continue
        project = tempfile.mkdtemp(prefix="nj_b2_")
        try:
            spec = dict(b2_spec, mode="standalone", directory=project)
            record(
                "brian2 C++ standalone, first (new project folder)",
                peer("benchmarks.peers.brian2_coba", spec),
            )
            record("brian2 C++ standalone, repeated", peer("benchmarks.peers.brian2_coba", spec))
        finally:
            shutil.rmtree(project, ignore_errors=True)
        spec = dict(b2_spec, mode="cython", repeats=1, budget_s=1e9)
        record("brian2 cython (code objects cached)", peer("benchmarks.peers.brian2_coba", spec))
        nest_spec = {"threads": 1, "seed": 1, "duration_ms": args.duration, "repeats": 1}
        record("nest 3 iaf_cond_exp", peer("benchmarks.peers.nest_coba", nest_spec))
    bytecode = "as set" if args.keep_env else "Python's default bytecode caching"
    print(
        f"\ncommand to prompt, COBA {args.duration:g} ms, one core, {args.rounds} rounds, "
        f"{bytecode} (PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE')!r})"
    )
    print("case | best wall (s) | median wall (s)")
    for name, rs in rows.items():
        walls = [r["wall_s"] for r in rs]
        print(f"{name} | {min(walls):.2f} | {statistics.median(walls):.2f}")
    # Issue 41's bar: a repeated command against Brian2's cython runtime, round by round
    # (each pair ran back to back, under the same load).
    b2 = rows.get("brian2 cython (code objects cached)")
    for tree in trees if b2 else ():
        tag = f" [{tree.name}]" if len(trees) > 1 else ""
        ours = rows[f"neurojax run coba, repeated{tag}"]
        ratios = [a["wall_s"] / b["wall_s"] for a, b in zip(ours, b2, strict=True)]
        print(
            f"neurojax run coba, repeated{tag} / brian2 cython, per round: "
            + ", ".join(f"{r:.2f}" for r in ratios)
            + f" (median {statistics.median(ratios):.2f}x)"
        )


if __name__ == "__main__":
    main()
