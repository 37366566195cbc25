#!/usr/bin/env bash
# A sharded model's collection over several machines with torchrun's c10d rendezvous.
#
# Run this same script on every node (same RDZV_ENDPOINT and RDZV_ID everywhere); torchrun starts
# NPROC_PER_NODE ranks per node, they meet at the endpoint (host:port of any one node, reachable from
# all), and cbsite measures in lockstep across all of them. Rank 0 (on whichever node torchrun gives
# it) writes the one run, so RUNS must be on that node's disk or on a shared file system.
#
#   node A:  RDZV_ENDPOINT=nodeA:29500 NNODES=2 examples/torchrun-multinode.sh
#   node B:  RDZV_ENDPOINT=nodeA:29500 NNODES=2 examples/torchrun-multinode.sh
#
# One machine, two CPU ranks (a smoke test):
#   RDZV_ENDPOINT=localhost:29500 NNODES=1 NPROC_PER_NODE=2 DEVICE=cpu SIZE=tiny examples/torchrun-multinode.sh
set -euo pipefail

RDZV_ENDPOINT=${RDZV_ENDPOINT:?set RDZV_ENDPOINT=host:port of one node, the same on every node}
NNODES=${NNODES:-2}
NPROC_PER_NODE=${NPROC_PER_NODE:-8}          # one rank per GPU on CUDA
RDZV_ID=${RDZV_ID:-cbsite-$(date -u +%Y%m%d)}  # the same on every node of one job
DEVICE=${DEVICE:-cuda}                       # cuda: nccl backend, one device per local rank; cpu: gloo
SIZE=${SIZE:-medium}
SHARDING=${SHARDING:-row_wise}               # table_wise | row_wise | column_wise | table_row_wise | data_parallel | planner | [..per table..]
RUNS=${RUNS:-runs}
VERSION=${VERSION:-$SHARDING}
PYTHON=${PYTHON:-python}

exec "$PYTHON" -m torch.distributed.run \
  --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" \
  --rdzv-backend c10d --rdzv-endpoint "$RDZV_ENDPOINT" --rdzv-id "$RDZV_ID" \
  -m cbsite collect dlrm -o "size=$SIZE" -o "sharding=$SHARDING" \
  --distributed --device "$DEVICE" --model dlrm-sharded --version "$VERSION" --runs "$RUNS" \
  --dist-timeout 600 "$@"
