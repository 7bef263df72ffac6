"""Tools the benchmarks share (scripts, not timings of their own):

- `machine`: the machine's measured limits (matmul FLOP/s, copy bandwidth, exp rate) that
  benchmarks report their fraction of (`python -m benchmarks.tools.machine`);
- `report`: renders benchmark JSON lines as Markdown tables and checks the targets
  (`python -m benchmarks.tools.report FILE.jsonl`);
- `interleaved`: one benchmark run alternately from two source trees, for before/after
  figures of a change (`python -m benchmarks.tools.interleaved --before A --after B -- NAME`).
"""
