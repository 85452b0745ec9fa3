# Two commands for a new user: `make demo` (the main job, on the twin: no GPU needed) and
# `make test` (lint, types, the import contract and the test suite). Each creates the virtual
# environment with the pinned dependencies of requirements.lock on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
OUT ?= out

.PHONY: demo test lint install native clean bench system-deps image

$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

install: $(STAMP) native

# The twin's hot core compiled with mypyc (tools/build_native.py; about a minute, and again
# whenever one of its sources changed; until then chatfleet runs those modules as Python).
native: $(STAMP)
	@$(BIN)/python tools/build_native.py --if-stale

demo: install
	$(BIN)/chatfleet demo --out $(OUT)/demo

# Debian packages the tests use: chromium (the report's rendering test), redis-server (the
# gateways' shared state), prometheus (its promtool checks the deploy files), and for the image
# (tests/deploy/test_image.py) mmdebstrap and umoci to build it, podman and runc to run it.
# Installed when missing and when we may (root); otherwise the tests that need them skip and
# say why.
system-deps:
	@missing=""; command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	  command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	  command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	  for t in mmdebstrap umoci podman runc; do \
	    command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	  [ -z "$$missing" ] || { [ "$$(id -u)" = 0 ] && \
	  (apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing) \
	  || echo "missing:$$missing: the tests that need them will skip"; }

# The gateway's image as an OCI archive, $(OUT)/image/chatfleet-VERSION-COMMIT.oci.tar, built
# with no container daemon (as root: mmdebstrap, umoci; docs/deploy.md#the-image). Minutes the
# first time, with its progress; then cached by its inputs.
image: $(STAMP)
	$(BIN)/python tools/build_image.py --out $(OUT)/image

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# Two pytest-xdist workers (tests/conftest.py keeps the reliability suite on one of them).
test: lint system-deps native
	$(BIN)/pytest -n 2 --dist loadgroup

# The twin's speed, compiled: a stale build is rebuilt first (a benchmark of the sources after
# an edit would time the interpreted core).
bench: native
	$(BIN)/python benchmarks/twin_speed.py

clean:
	[ ! -x $(BIN)/python ] || $(BIN)/python tools/build_native.py --clean
	rm -rf $(VENV) $(OUT) build
