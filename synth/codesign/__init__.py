"""Co-design sweeps: the planner run over a grid of systems, models and planner choices
(`synth codesign`, docs/codesign.md). grid.py reads the grid, points.py expands it lazily,
run.py plans one point (sharing priced collectives across points), executors.py fans points
out (a local process pool, Ray or Dask), results.py keeps the append-only results file,
estimate.py counts the work before it starts, report.py draws the plots."""
