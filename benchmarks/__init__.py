"""Benchmarks of neurojax against peer simulators (scripts, not tests).

Run one benchmark with `python -m benchmarks.hh_batch` or `python -m benchmarks.lif_population`,
or all of them with `python -m benchmarks.run_all` (`make bench`). Every script prints one JSON
line per configuration on stdout and its progress on stderr; `--quick` runs a small smoke
configuration. `benchmarks/RESULTS.md` keeps the latest full run.
"""
