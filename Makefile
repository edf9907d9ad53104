# TokenSpeed: the README's two commands (`make serve`, `make test`) and a few helpers.
# Every target sets up what it needs from nothing, and is fast when it is already done.

SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# CPU machines take the pinned CPU build (it lies on local disk); a machine whose Python
# already has a CUDA torch keeps it.
TORCH_SPEC ?= torch==2.13.0
CPP_BUILD := build/cpp
CPP_ASAN_BUILD := build/cpp-asan
SERVE_ARGS ?=
PYTEST_ARGS ?=
# pip warns about every missing local index folder; keep the rest of what it says.
QUIET_PIP := { grep -v "is ignored: it is neither a file nor a directory" || true; }

CPP_SOURCES := $(shell find scheduler/csrc -type f 2>/dev/null) CMakeLists.txt
# The editable install maps packages when it is made: a new package needs a re-install.
PY_PACKAGES := $(shell find runtime scheduler kernels mla tokenspeed_cli -name __init__.py 2>/dev/null)
STAMP_APT := $(VENV)/.stamp-apt
STAMP_DEPS := $(VENV)/.stamp-deps
STAMP_INSTALL := $(VENV)/.stamp-install

.PHONY: serve test test-cpp test-py test-asan lint format setup clean

serve: setup
	$(VENV)/bin/tokenspeed serve $(SERVE_ARGS)

test: setup test-cpp test-asan test-py

setup: $(STAMP_INSTALL)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# Debian packages: GoogleTest for the C++ tests.
$(STAMP_APT): | $(VENV)/bin/python
	@if ! dpkg -s libgtest-dev >/dev/null 2>&1; then \
	  echo "installing libgtest-dev"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev >/dev/null; \
	fi
	@touch $@

# Python dependencies: torch first (so nothing pulls a CUDA build), then the build tools.
$(STAMP_DEPS): pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q --upgrade pip 2>&1 | $(QUIET_PIP)
	@if $(PY) -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null; then \
	  echo "keeping the CUDA torch already installed"; \
	else $(PIP) install -q "$(TORCH_SPEC)" 2>&1 | $(QUIET_PIP); fi
	$(PIP) install -q "scikit-build-core>=0.10" "pybind11>=2.12" cmake ninja 2>&1 | $(QUIET_PIP)
	$(PY) tools/list_deps.py pyproject.toml --extra dev > $(VENV)/requirements.txt
	$(PIP) install -q -r $(VENV)/requirements.txt 2>&1 | $(QUIET_PIP)
	@touch $@

# The package itself, editable; rebuilt when the C++ sources, the build files or the set of
# Python packages change.
$(STAMP_INSTALL): $(STAMP_APT) $(STAMP_DEPS) $(CPP_SOURCES) $(PY_PACKAGES)
	$(PIP) install -q --no-deps --no-build-isolation -e . 2>&1 | $(QUIET_PIP)
	@touch $@

test-cpp: $(STAMP_APT) $(STAMP_DEPS)
	@$(VENV)/bin/cmake -S . -B $(CPP_BUILD) -G Ninja -DTOKENSPEED_BUILD_TESTS=ON \
	  -Dpybind11_DIR=$$($(PY) -m pybind11 --cmakedir) -DPython_EXECUTABLE=$(abspath $(PY)) >/dev/null
	@$(VENV)/bin/cmake --build $(CPP_BUILD) --parallel
	cd $(CPP_BUILD) && $(abspath $(VENV))/bin/ctest --output-on-failure

test-asan: $(STAMP_APT) $(STAMP_DEPS)
	@$(VENV)/bin/cmake -S . -B $(CPP_ASAN_BUILD) -G Ninja -DTOKENSPEED_BUILD_TESTS=ON \
	  -DTOKENSPEED_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug \
	  -Dpybind11_DIR=$$($(PY) -m pybind11 --cmakedir) -DPython_EXECUTABLE=$(abspath $(PY)) >/dev/null
	@$(VENV)/bin/cmake --build $(CPP_ASAN_BUILD) --parallel
	cd $(CPP_ASAN_BUILD) && $(abspath $(VENV))/bin/ctest --output-on-failure

# PYTHONSAFEPATH: the repository root holds the source folders that install as tokenspeed.*,
# and its kernels/ would shadow Hugging Face's `kernels` package, which transformers (5.25+)
# imports, if `python -m` put the working directory on sys.path.
test-py: setup
	PYTHONSAFEPATH=1 $(PY) -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@if ! command -v clang-format >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-format >/dev/null; fi
	clang-format --dry-run --Werror $$(find scheduler/csrc -name '*.cpp' -o -name '*.h')

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .
	clang-format -i $$(find scheduler/csrc -name '*.cpp' -o -name '*.h')

clean:
	rm -rf build $(VENV)
