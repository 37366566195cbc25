"""Measurement sessions: (component, phase, arm, round) tasks timed in fresh worker processes.

spec.py       arms, tasks, the job of one worker process (plain data, pickled to the worker)
worker.py     one worker: rebuild the arms, capture, time every task in random A/B block pairs
scheduler.py  the one scheduler: jobs one after another in fresh spawned processes; ABBA or interleaved
rounds.py     a run's latency from its rounds (fresh processes) and its samples table
compare.py    `cbsite compare`: two arms, one session, verdicts, a comparison record
"""
