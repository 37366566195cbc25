"""The stages of one collection, in the order `profiler._profile` calls them:

census and plan (capture_plan.py) -> capture, count and measure every component (components.py) -> rows
(rows.py) -> re-measure inverted pairs (remeasure.py) -> rounds in fresh processes (fresh_rounds.py) -> peak
check (collector/peaks.py) -> step (collector/step.py) -> the run record (record.py). progress.py says where a
collection is and where its time went; failures.py turns an exception into a row's error.
"""
