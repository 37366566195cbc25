"""Sharded models on torchrun: discovery of the sharded pieces, lockstep replay, one run from every rank.

Modules: `group` (the process group from torchrun's environment), `sharding` (the providers' sharding
plan option, DMP), `discovery` (sharded pieces as components; who communicates), `collectives` (c10d
ops and bytes from the dispatcher), `lockstep` (timing what communicates on all ranks at once),
`ranks` (per-rank rows, rank 0's merged run), `collect` (the driver on each rank). The launcher's entry
point, `cbsite collect ... --distributed` as a function, is `cbsite.cli.entrypoint`.
"""
