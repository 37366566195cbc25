#!/usr/bin/env bash
# The device-lease variant of `make gpu-check`, for a session lent a CUDA machine through the workplace's
# device tool: that machine has no network and no venv, so nothing is installed from an index. The wheels the
# image lacks (polars, argcomplete) come from .whl/ (carried, never committed) into $SITE, cbsite is read from
# the working tree (PYTHONPATH=$SITE:repo root) and its entry points (the plugins) from a dist-info written here.
# Steps: versions; an independent CUDA-event timing of nanogpt's largest Linear (lm_head); a CUDA collection of
# nanogpt (GPT-2 small's shapes, 4 layers, bfloat16) with trace, ops and memory, shown and dumped; the
# `gpu`-marked tests; a float32 collection with numerics under bf16 autocast. Every step has its own timeout
# (at most about 7 minutes in all, 3 to 4 expected). What comes back is under $OUT (at most 8 files); the runs
# stay in gpu-runs/ (ignored by git).
#
#   OUT=/tmp/gpuout bash benchmarks/gpu_check_device.sh                    # on the device machine
#   PY=.venv/bin/python SITE=/tmp/gpusite OUT=/tmp/gpuout bash benchmarks/gpu_check_device.sh   # dry run on CPU
#   ... DEVICE=cpu NANOGPT_OPTS='-o size=tiny' ...   # the same steps collecting on CPU: every path and copy
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
OUT=${OUT:?set OUT to the folder that comes back}
RUNS=${RUNS:-gpu-runs}
DEVICE=${DEVICE:-cuda}
# nanogpt at GPT-2 small's shapes (size=medium: batch 8 x 512 tokens, 768 dims, vocab 50304), 4 layers of 12.
read -r -a MODEL_OPTS <<< "${NANOGPT_OPTS:--o size=medium -o n_layer=4}"
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
LOG=$OUT/gpu-check.log
exec > >(tee -a "$LOG") 2>&1
declare -A STATUS
step() { echo; echo "=== $1 ($(date -u +%H:%M:%S))"; }
note() { STATUS[$1]=$2; echo "--- $1: exit $2"; }

step "install wheels from .whl into $SITE"
ls -la .whl/ || { echo "no .whl/: carry it"; exit 1; }
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || exit 1
# cbsite's plugins and providers are entry points: without an installed distribution there are none. A dist-info
# in $SITE, written from pyproject.toml, declares them for the working tree's cbsite.
"$PY" - "$SITE" <<'EOF' || exit 1
import pathlib, sys, tomllib
site = pathlib.Path(sys.argv[1])
project = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]
info = site / f"{project['name']}-{project['version']}.dist-info"
info.mkdir(parents=True, exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
groups = {**project.get("entry-points", {}), "console_scripts": project.get("scripts", {})}
text = "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for g, eps in groups.items())
(info / "entry_points.txt").write_text(text)
print("wrote", info)
EOF
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1

step "machine and versions"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv,noheader \
  || echo "nvidia-smi: none"
timeout 30 "$PY" - <<'EOF'
import torch, polars, pyarrow, cbsite
from cbsite.collector.plugins import registry
print("python", __import__("sys").version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| available", torch.cuda.is_available(), "|", torch.cuda.is_available() and torch.cuda.get_device_name(0))
print("polars", polars.__version__, "| pyarrow", pyarrow.__version__, "| cbsite", cbsite.__file__)
print("profilers", sorted(registry.available("profilers")), "| providers", sorted(registry.available("providers")))
print("tf32 matmul allowed:", torch.backends.cuda.matmul.allow_tf32, "| cudnn tf32:", torch.backends.cudnn.allow_tf32)
EOF

step "cross-check: lm_head (4096 x 768 -> 50304) and mlp.c_fc (4096 x 768 -> 3072) timed with CUDA events"
timeout 40 "$PY" - <<'EOF'
import torch
if not torch.cuda.is_available():
    raise SystemExit("no CUDA device: cross-check skipped")
import torch.nn.functional as F
dev = torch.device("cuda")
tokens = 8 * 512

def median_ms(fn, warmup=5, reps=30):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]

for name, k, n in (("lm_head", 768, 50304), ("mlp.c_fc", 768, 3072)):
    for dtype in (torch.bfloat16, torch.float32):
        torch.manual_seed(0)
        x = torch.randn(tokens, k, device=dev, dtype=dtype)
        w = (torch.randn(n, k, device=dev, dtype=dtype) * 0.02)
        b = None if name == "lm_head" else torch.zeros(n, device=dev, dtype=dtype)  # c_fc has a bias: addmm
        g = torch.randn(tokens, n, device=dev, dtype=dtype)
        flops = 2 * tokens * k * n
        size = torch.finfo(dtype).bits // 8
        fwd = median_ms(lambda: F.linear(x, w, b))
        bwd = median_ms(lambda: (g @ w, g.t() @ x))  # dgrad + wgrad (the bias grad, a column sum, left out)
        torch.cuda.synchronize(); torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        y = F.linear(x, w, b); torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        moved = (x.numel() + w.numel() + y.numel()) * size
        print(f"{name:9s} {str(dtype)[6:]:9s} forward {fwd:8.4f} ms {flops / fwd / 1e9:7.1f} TFLOP/s "
              f"{moved / fwd / 1e6:7.1f} GB/s | backward (dgrad+wgrad) {bwd:8.4f} ms "
              f"{2 * flops / bwd / 1e9:7.1f} TFLOP/s "
              f"| forward peak {peak - base} B over {base} B allocated (output {y.numel() * size} B), "
              f"max_memory_allocated {peak} B")
        del x, w, b, g, y
EOF
note cross-check $?

step "collect nanogpt on $DEVICE, bfloat16, trace + ops + memory"
rm -rf "$RUNS"
timeout 140 "$PY" -m cbsite collect nanogpt "${MODEL_OPTS[@]}" --device "$DEVICE" --dtype bfloat16 --version gpu-bf16 \
  --runs "$RUNS" --no-progress --plugin trace --plugin ops --plugin memory --tag device-lease
note collect-bf16 $?
timeout 20 "$PY" -m cbsite show nanogpt@gpu-bf16 --runs "$RUNS" --top 30
note show-bf16 $?

dump() {  # $1 run folder, $2 CSV path: the components table (also printed), then lm_head's and c_fc's op rows
  timeout 25 "$PY" - "$1" "$2" <<'EOF'
import pathlib, sys
import polars as pl
run = pathlib.Path(sys.argv[1])
cols = ["path", "phase", "status", "latency_ms", "device_time_ms", "flops", "tflops_per_s", "mfu", "peak_memory_bytes",
        "bytes_moved", "bandwidth_gbps", "bandwidth_util", "numerics_max_rel_err", "numerics_ok", "notes",
        "plugin_errors", "error"]
df = pl.read_parquet(run / "components.parquet")
df = df.select([c for c in cols if c in df.columns])
listy = [c for c, t in df.schema.items() if isinstance(t, pl.List)]
df = df.with_columns([pl.col(c).list.join(" | ") for c in listy])
df.write_csv(sys.argv[2])
words = ["path", "phase", "status", "numerics_max_rel_err", "numerics_ok", "plugin_errors", "error", "notes"]
with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=400, fmt_str_lengths=100):
    print(df.drop([c for c in words[3:] if c in df.columns]))
    print(df.select([c for c in words if c in df.columns]))
    ops = run / "ops.parquet"
    if ops.exists():
        o = pl.read_parquet(ops).filter(pl.col("path").is_in(["lm_head", "blocks.0.mlp.c_fc"]))
        print(o.select([c for c in ("path", "phase", "op", "kind", "calls", "cpu_time_ms", "device_time_ms", "flops",
                                    "share") if c in o.columns]))
EOF
}

RUN=$(ls -d "$RUNS"/nanogpt/gpu-bf16/*/ 2>/dev/null | tail -1)
if [ -n "$RUN" ]; then
  step "components of $RUN"
  dump "$RUN" "$OUT/components.csv"; note dump-bf16 $?
  cp "$RUN/run.json" "$OUT/run.json"; cp "$RUN/components.parquet" "$OUT/components.parquet"
  (cd "$RUN" && find artifacts -name '*.trace.json.gz' -o -name '*.memory.json' | sort | tar czf "$OUT/traces.tgz" -T -)
  size=$(stat -c %s "$OUT/traces.tgz")
  if [ "$size" -ge 16000000 ]; then
    echo "traces.tgz is $size bytes: over 16 MB, keeping lm_head's forward trace alone"
    rm "$OUT/traces.tgz"
    (cd "$RUN" && tar czf "$OUT/traces.tgz" artifacts/lm_head/forward.trace.json.gz 2>/dev/null) \
      || rm -f "$OUT/traces.tgz"
  fi
  ls -la "$OUT"
else
  echo "no run under $RUNS/nanogpt/gpu-bf16"
fi

step "gpu-marked tests"
TESTS=(tests/test_gpu.py tests/test_plugins.py tests/test_synthetic.py)
# tests/test_reliability_site_model.py imports cbsite.generator, whose charts import altair and vl_convert (the
# site extra; vl-convert's wheel is too large to carry beside polars): that module runs only where both import.
if "$PY" -c "import altair, vl_convert" 2>/dev/null; then
  TESTS+=(tests/test_reliability_site_model.py)
else
  echo "altair/vl_convert not importable: tests/test_reliability_site_model.py left out" \
       "(its gpu test: test_a_cuda_collection_leaves_the_model_on_the_cpu)"
fi
DESELECT=()
if ! "$PY" -c "import torchrec, fbgemm_gpu" 2>/dev/null; then
  echo "torchrec/fbgemm_gpu not importable: deselecting the dlrm-synthetic placement tests (tests/test_synthetic.py)"
  DESELECT=(--deselect tests/test_synthetic.py::test_placement_puts_the_tables_where_asked_on_cuda)
fi
PER_TEST=()
"$PY" -c "import pytest_timeout" 2>/dev/null && PER_TEST=(--timeout 60)
timeout 70 "$PY" -m pytest -q -m gpu -rs -p no:cacheprovider "${PER_TEST[@]}" --junitxml "$OUT/pytest-gpu.xml" \
  "${DESELECT[@]}" "${TESTS[@]}"
note gpu-tests $?

step "collect nanogpt on $DEVICE, float32, numerics under bfloat16 autocast (forward)"
timeout 60 "$PY" -m cbsite collect nanogpt "${MODEL_OPTS[@]}" -o n_layer=2 --device "$DEVICE" \
  --version gpu-fp32-numerics --runs "$RUNS" --no-progress --phases forward --no-step \
  --plugin numerics --plugin-option numerics.mode=autocast
note collect-numerics $?
RUN2=$(ls -d "$RUNS"/nanogpt/gpu-fp32-numerics/*/ 2>/dev/null | tail -1)
if [ -n "$RUN2" ]; then
  dump "$RUN2" "$OUT/numerics-components.csv"; note dump-numerics $?
  cp "$RUN2/run.json" "$OUT/numerics-run.json"
fi

step "summary"
for k in "${!STATUS[@]}"; do echo "$k: exit ${STATUS[$k]}"; done | sort
ls -la "$OUT"
