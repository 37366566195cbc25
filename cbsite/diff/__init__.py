"""The diff of two runs, as data (core: no torch, no jinja2).

`rundiff` aligns two runs and attributes each change to submodules (`diff_runs`, `RunDiff`); `sides` reads one run's
phase, `alignment` computes the per-forward numbers, `record` is the vocabulary (metrics, kinds, records),
`clauses` the summary as structured facts and `summary` those facts in words; `comparison` is the latency evidence
between two runs and `traffic` the communication traffic of sharded runs. The gate (cbsite/gate.py) judges a diff;
cbsite/review.py and the generator render it.
"""
