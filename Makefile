# The front door: `make demo` and `make test` work on a fresh machine from a clean clone.
# Every install step lives here; nothing installed by hand exists in CI.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
# Python's bytecode caches on, whatever the shell says: with PYTHONDONTWRITEBYTECODE set, every process that imports
# cbsite (each CLI call and spawned worker) compiles it again, and every pytest worker rewrites every test module.
unexport PYTHONDONTWRITEBYTECODE
# torch is pinned to the CPU wheel this machine kind ships; a range would pull a multi-GB CUDA build.
TORCH_VERSION    ?= 2.13.0
TORCHREC_VERSION ?= 1.8.0
FBGEMM_VERSION   ?= 1.8.0
# On a CUDA machine the same target installs the CUDA fbgemm build instead of the CPU one.
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 1 || echo 0)
ifeq ($(HAS_CUDA),1)
FBGEMM_PKG := fbgemm-gpu==$(FBGEMM_VERSION)
else
FBGEMM_PKG := fbgemm-gpu-cpu==$(FBGEMM_VERSION)
endif
CHROMIUM ?= /usr/bin/chromium

.PHONY: install demo demo-full collect-demo site test test-fast lint clean-venv clean browser gpu-check docs golden

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==$(TORCH_VERSION)
	# fbgemm first, then torchrec without its deps (its metadata names the CUDA fbgemm-gpu),
	# then torchrec's remaining requirements by hand.
	$(PIP) install --quiet $(FBGEMM_PKG)
	$(PIP) install --quiet --no-deps torchrec==$(TORCHREC_VERSION)
	$(PIP) install --quiet tensordict torchmetrics==1.0.3 tqdm pyre-extensions iopath
	# The collect extra's other dependency (torch is pinned above, as is torchrec, the torchrec extra's): submitit.
	$(PIP) install --quiet 'submitit>=1.5'
	$(PIP) install --quiet -e '.[dev,site]'
	touch $(STAMP)

# Debian's chromium drives the real-browser tests; never a downloaded browser build.
browser:
	@test -x $(CHROMIUM) || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || echo "chromium could not be installed: browser tests will be skipped"

# `make demo` is the quick first look (about 2 minutes on 2 cores, README); `make demo-full` recollects every demo
# model with every plugin (about 9 minutes). DEMO_ARGS passes options, e.g. DEMO_ARGS="--runs /tmp/r --out /tmp/s".
DEMO_ARGS ?=

collect-demo: install
	$(VENV)/bin/cbsite demo --full --collect-only $(DEMO_ARGS)

demo: install
	$(VENV)/bin/cbsite demo $(DEMO_ARGS)

demo-full: install
	$(VENV)/bin/cbsite demo --full $(DEMO_ARGS)

# Two parts: every test but those marked serial on one worker per core (pytest-xdist), then the serial ones alone
# (paired verdicts on real timings must not run beside another test). Both parts list their slowest tests.
# Whole modules go to a worker (loadscope), so a module's fixtures are made once; longest modules first, in the
# order tests/conftest.py sorts them (no reordering by test count). A worker more than the cores was slower.
TEST_WORKERS ?= $(shell python3 -c "import os; print(min(4, len(os.sched_getaffinity(0))))")
XDIST := -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder
# The serial part collects only the files that hold serial tests (tests/conftest.py SERIAL_FILES, which fails the
# collection of a serial test elsewhere); read when the recipe runs, after `install`.
SERIAL_FILES = $(shell $(PY) -c "from tests.conftest import SERIAL_FILES; print(*SERIAL_FILES)")
test: install browser lint
	$(PY) -m pytest -q $(XDIST) -m "not serial" --durations=15
	$(PY) -m pytest -q -m serial --durations=10 $(SERIAL_FILES)

# The linter and the type checker, configured in pyproject.toml ([tool.ruff], [tool.mypy]); `make test` runs them first.
lint: install
	$(VENV)/bin/ruff check cbsite tests benchmarks docs
	$(VENV)/bin/mypy

# The inner loop: everything but the tests marked slow (over ~20 s each) and the real-browser ones.
test-fast: install
	$(PY) -m pytest -q $(XDIST) -m "not slow and not browser and not serial"

# Every golden file regenerated (the generator's pages, the review summary, the collector's records without timings);
# review the result with `git diff tests/golden/`.
golden: install
	CBSITE_REGEN_GOLDEN=1 $(PY) -m pytest -q tests/test_generator_golden.py tests/test_review.py tests/test_pr_comment.py tests/test_golden_collect.py

# The manual (docs/, mkdocs.manual.yml) into build/manual, strictly: a broken link, a missing page or an
# undocumented column fails the build. It includes the demo archive's reports through cbsite's MkDocs plugin.
docs: install
	$(VENV)/bin/mkdocs build --strict -f mkdocs.manual.yml

# Every GPU check in one command, for a session lent a CUDA machine: the `gpu`-marked tests, then a
# CUDA collection of the demo DLRM with trace, ops and memory (CUDA events, allocator peaks, kernel
# rows, allocator snapshots) and numerics under bf16 autocast; the site is built from it. Prints
# what a closing note should report.
gpu-check: install
	nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
	$(PY) -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0))"
	$(PY) -m pytest -q -m gpu -rs
	$(VENV)/bin/cbsite collect dlrm --device cuda --version gpu-check --runs gpu-runs --no-progress \
	  --plugin trace --plugin ops --plugin memory --plugin numerics \
	  --plugin-option numerics.mode=autocast
	$(VENV)/bin/cbsite show dlrm@gpu-check --runs gpu-runs
	$(VENV)/bin/cbsite build --runs gpu-runs --out gpu-site

clean-venv:
	rm -rf $(VENV)
