# Every target creates .venv and installs what it needs; nothing else is assumed but Python 3.11+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench bench-scale unit fuzz clean browser wrk docs docs-serve screenshot

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/commitline demo
	@echo "commitline is $(BIN)/commitline: 'source $(BIN)/activate' puts it on your PATH"

test: $(STAMP) browser wrk
	$(BIN)/python -m pytest -q --durations=25

# Headless Chromium and Tesseract OCR from the Debian packages, for the status page's browser test:
# installed when missing (as root, or with password-less sudo), with the time it took; a no-op after.
browser:
	@.ci/install-browser

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

bench: $(STAMP) wrk
	$(BIN)/python -m bench

# wrk, the native load generator of the HTTP benchmark, from the Debian package: installed when missing (as
# root, or with password-less sudo), saying so; a no-op after.
wrk:
	@.ci/install-wrk

# Cost as the log grows (not part of `make bench`): the same figures on an empty store and on one of
# COMMITLINE_BENCH_SCALE_EVENTS events (default 10,000,000: a long run, and several GiB of disk); docs/benchmarks.md.
bench-scale: $(STAMP)
	$(BIN)/python -m bench scale

# A longer fuzzing of a real `commitline serve` from its /openapi.json than `make test`'s, with a fresh seed.
fuzz: $(STAMP)
	COMMITLINE_FUZZ_EXAMPLES=$${COMMITLINE_FUZZ_EXAMPLES:-1000} COMMITLINE_FUZZ_SEED=random \
		$(BIN)/python -m pytest -q tests/integration/http/test_fuzzing.py

# The documentation site in site/ (open site/index.html): --strict, so a broken link or a missing page fails.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict

# The status page's screenshot in the docs, taken from a real `commitline serve` in headless Chromium.
screenshot: $(STAMP) browser
	$(BIN)/python -m tools.status_screenshot docs/assets/status-page.png

clean:
	rm -rf $(VENV) .commitline .pytest_cache .hypothesis site
