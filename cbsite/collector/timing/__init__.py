"""How a statement is timed: blocks of calls of about budget/20, taken until the budget is held (`blocks.time_fn`),
each with this process's wait for a CPU read around it (`contention`); and what the timed statements run on: fresh
copies of inputs a call changes (`replay`) and backward graphs (`graphs`). `collector.measure` builds the statements of
one component from these."""
