# Two entry points for a fresh machine: `make demo` and `make test` (both create .venv).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO := demo-data

.PHONY: venv demo test test-slow test-gpu check lint mutate bench bench-general bench-gram bench-model calibrate bench-gpu bench-feed gpu-session fuzz fuzz-tree fuzz-planter fuzz-crash clean

$(VENV)/.installed: pyproject.toml requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements/constraints.txt -e '.[test]'
	# An editable install is not byte-compiled (a wheel is): without this, every CLI start
	# compiles our ~100 modules again where PYTHONDONTWRITEBYTECODE is set (~0.15 s).
	$(PY) -m compileall -q pipeline kernels cluster tilegemm benchmarks > /dev/null
	touch $@

venv: $(VENV)/.installed

demo: venv
	rm -rf $(DEMO)
	$(PY) -m pipeline random $(DEMO)/a.zarr --shape 3000x2000 --chunks 1000x700 --seed 1
	$(PY) -m pipeline random $(DEMO)/b.zarr --shape 2000x2500 --chunks 600x1000 --seed 2
	$(PY) -m pipeline multiply $(DEMO)/a.zarr $(DEMO)/b.zarr $(DEMO)/c.zarr --verify
	$(PY) -m pipeline verify $(DEMO)/a.zarr $(DEMO)/b.zarr $(DEMO)/c.zarr

test: venv
	$(PY) -m pytest

test-slow: venv
	$(PY) -m pytest -m slow

# On a machine with a CUDA GPU: real kernels, no simulator. The cublas tests also need CuPy:
# .venv/bin/pip install -c requirements/constraints.txt -e '.[test,cublas]' first.
test-gpu: venv
	TILEGEMM_TEST_GPU=1 $(PY) -m pytest -m gpu

# Mutation score of the modules users feel (issue 23): mutmut 3 in scratch copies of HEAD, each
# module against its own tests (benchmarks/mutate.py). Not in CI: ~2 min (launch math) to tens
# of minutes (cluster tests) per module on 2 cores; MUTATE=launch cpu ... picks targets.
MUTATE ?=
mutate: venv
	$(PY) -m pip install --quiet mutmut==3.8.1
	nice -n 19 $(PY) -m benchmarks.mutate $(if $(MUTATE),--only $(MUTATE)) --out benchmarks/results/mutation.md

lint: venv
	$(PY) -m ruff check pipeline kernels cluster tilegemm tests benchmarks docs
	$(PY) -m ruff format --check pipeline kernels cluster tilegemm tests benchmarks docs
	$(PY) -m mypy
	$(VENV)/bin/lint-imports --no-logo --no-cache  # the import contracts in pyproject.toml

check: lint test

# CPU peers on the same Zarr data (float32 and float64); about an hour on 2 cores.
BENCH_SIZES_F32 ?= 4096,8192,12288,16384
BENCH_SIZES_F64 ?= 8192,12288
bench: venv
	$(PY) -m pip install --quiet -c requirements/constraints.txt -e '.[bench]'
	$(PY) -m benchmarks.cpu_peers --sizes $(BENCH_SIZES_F32) --dtype float32 --repeats 3
	$(PY) -m benchmarks.cpu_peers --sizes $(BENCH_SIZES_F64) --dtype float64 --repeats 3
	$(MAKE) bench-general
	$(MAKE) bench-model

# The dry run's seconds against the clock on 7 fixed cases (2048², 1024², 256² and 64² chunks,
# tall-skinny, short-fat, prime chunkings); ~15 minutes on 2 cores. `make calibrate` first
# on a new machine: it rewrites pipeline/plan/fitted_costs.py.
bench-model: venv
	$(PY) -m benchmarks.model_check --repeats 3 --data $(FEED_DATA)/model

calibrate: venv
	$(PY) -m benchmarks.calibrate

# Gram and Xᵀ Y (X, Y = 32768x4096 float32, 2048² zstd chunks) against our general product and
# dask threads; a few minutes on 2 cores.
bench-general: venv
	$(PY) -m benchmarks.general_products --shape 32768x4096 --chunk 2048 --repeats 3

# Integer Grams (int8 -> int32, int16 -> int64) against their float32 twins and dask threads,
# --center/--scale against plain gram and np.cov/np.corrcoef, and their accuracy (X 16384x1536
# in 2048x512 chunks); data in GRAM_DATA. Dask's int8 product is killed past 300 s.
GRAM_DATA ?= bench-data/gram
bench-gram: venv
	$(PY) -m benchmarks.gram_products --shape 16384x1536 --chunk 2048x512 --repeats 3 --data $(GRAM_DATA)

# How well the host feeds a GPU, on an EMULATED device (no GPU needed): compute-bound and
# balanced, 8192² float32 in 2048² zstd chunks.
FEED_DATA ?= bench-data
bench-feed: venv  # each case: a cold job, then two warm ones (staging memory kept)
	$(PY) -m pipeline random $(FEED_DATA)/feed-a.zarr --shape 8192x8192 --chunks 2048x2048 --seed 1 --overwrite
	$(PY) -m pipeline random $(FEED_DATA)/feed-b.zarr --shape 8192x8192 --chunks 2048x2048 --seed 2 --overwrite
	$(PY) -m benchmarks.gpu_feed $(FEED_DATA)/feed-a.zarr $(FEED_DATA)/feed-b.zarr --device-tflops 0.25 --h2d-gbps 25 --runs 3
	$(PY) -m benchmarks.gpu_feed $(FEED_DATA)/feed-a.zarr $(FEED_DATA)/feed-b.zarr --device-tflops 2.5 --h2d-gbps 25 --runs 3
	$(PY) -m benchmarks.gpu_feed $(FEED_DATA)/feed-a.zarr $(FEED_DATA)/feed-b.zarr --device-tflops 2.5 --h2d-gbps 25 --no-overlap --runs 3
	$(PY) -m benchmarks.gpu_feed $(FEED_DATA)/feed-a.zarr $(FEED_DATA)/feed-b.zarr --device-tflops 2.5 --h2d-gbps 25 --gpu-decode --runs 3

# On a machine with a CUDA GPU: the same path, real kernels, busy time from CUDA events.
bench-gpu: venv
	$(PY) -m pipeline random $(FEED_DATA)/feed-a.zarr --shape 8192x8192 --chunks 2048x2048 --seed 1 --overwrite
	$(PY) -m pipeline random $(FEED_DATA)/feed-b.zarr --shape 8192x8192 --chunks 2048x2048 --seed 2 --overwrite
	$(PY) -m benchmarks.gpu_feed $(FEED_DATA)/feed-a.zarr $(FEED_DATA)/feed-b.zarr --real
	$(PY) -m benchmarks.gpu_kernels

# A GPU machine's first-contact table in one command, under 9½ minutes: summary.md and logs in
# GPU_OUT (benchmarks/gpu_session.py). No venv is built: without one, python3 with the carried
# wheels on PYTHONPATH (README.md, "On a GPU machine without a package index").
GPU_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_OUT ?= gpu-results
gpu-session:
	$(GPU_PY) -m benchmarks.gpu_session --out $(GPU_OUT)

# Hostile-tree fuzzing (tests/pipeline/fuzz_tree.py): random seeds for FUZZ_MINUTES, each a
# sandbox of links, FIFOs, devices, sparse files and look-alike names under random CLI commands;
# as root, every other seed is a second user's (tests/pipeline/fuzz_planter.py: uid 65534 plants
# links, folders and archives in shared 1777/2775 folders before and during root's jobs).
# Prints failures with their seeds (rerun one: python -m benchmarks.fuzz --fuzzer tree|planter
# --seeds SEED), max RSS and seconds, the planter's attack kinds; exit 1 on any broken invariant.
# FUZZ_JOBS=2 runs two cases at once; FUZZER=tree|planter runs one fuzzer only.
FUZZ_MINUTES ?= 30
FUZZ_JOBS ?= 1
FUZZER ?= both
fuzz: fuzz-tree fuzz-crash

fuzz-tree: venv
	$(PY) -m benchmarks.fuzz --minutes $(FUZZ_MINUTES) --jobs $(FUZZ_JOBS) --fuzzer $(FUZZER)

fuzz-planter: venv
	$(PY) -m benchmarks.fuzz --minutes $(FUZZ_MINUTES) --jobs $(FUZZ_JOBS) --fuzzer planter

# The crash schedule of --accumulate (tests/pipeline/crash_schedule.py): seeded random stops
# (SIGKILL, SIGINT, SIGTERM at a named step of the protocol) for FUZZ_MINUTES, each followed by
# verify, a new --accumulate and --resume; exit 1 on any C that is not the old, the new or a
# resumable one. Rerun a case: python -m benchmarks.fuzz_crash --cases SCENARIO:STEP:N:SIGNAL
FUZZ_SEED ?= 1
fuzz-crash: venv
	$(PY) -m benchmarks.fuzz_crash --minutes $(FUZZ_MINUTES) --seed $(FUZZ_SEED)

clean:
	rm -rf $(VENV) $(DEMO)
