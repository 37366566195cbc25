"""What timing a backward repeatedly costs in memory, against a training step's backward (issue 13).

cbsite times a component's backward by differentiating the same graph again and again
(`torch.autograd.grad(..., retain_graph=True)`, measure.py), so every activation the forward saved stays
alive through each backward. A training step's backward frees each saved tensor as soon as it has used it.
This script measures, each in a fresh process (peaks are the process's own ru_maxrss above what it held
after building the model and one warm forward):

- **plain step**: forward, `output.mean().backward()`, as a user's training loop;
- **retained**: the graph built once from the model's output, then one `autograd.grad` with
  `retain_graph=True` over the inputs and parameters with a random output gradient (cbsite's statement);
- **freeing**: the same with `retain_graph=False` (what timing on a fresh graph per call would hold).

    PYTHONPATH=. .venv/bin/python benchmarks/backward_memory.py [--batch 4] [--seq 256]

It prints the three peaks and the ratios; nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, torch
from cbsite.collector.providers import provide
torch.set_num_threads(1)
mode, bs, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
p = provide("nanogpt", {"size": "medium", "batch_size": bs, "seq_len": seq}, batches=1)
model, inputs = p.model.train(), p.inputs[0]
params = [q for q in model.parameters() if q.requires_grad]
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
def outputs(out):
    return [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, torch.Tensor) and o.requires_grad]
with torch.no_grad():
    model(*inputs.args, **inputs.kwargs)  # warm: lazy initialisations are not the backward's
base = peak()
out = outputs(model(*inputs.args, **inputs.kwargs))
if mode == "plain":
    sum(o.float().mean() for o in out).backward()
else:
    grads = [torch.randn_like(o) for o in out]
    torch.autograd.grad(out, params, grads, retain_graph=(mode == "retained"), allow_unused=True)
print(json.dumps({"added_bytes": peak() - base}))
"""


def run(mode: str, batch: int, seq: int) -> int:
    done = subprocess.run([sys.executable, "-c", CHILD, mode, str(batch), str(seq)], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["added_bytes"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    args = ap.parse_args()
    got = {mode: run(mode, args.batch, args.seq) for mode in ("plain", "retained", "freeing")}
    gib = 2**30
    print(f"GPT-2 small (nanogpt size=medium), batch {args.batch} x {args.seq}, one thread; peak above the warm model:")
    for mode, added in got.items():
        print(f"  {mode:9s} {added / gib:6.2f} GiB   x{added / got['plain']:.2f} of the plain step")


if __name__ == "__main__":
    main()
