# Every target creates .venv and installs what it needs; nothing else is assumed but Python 3.11+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench unit clean browser

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/commitline demo

test: $(STAMP) browser
	$(BIN)/python -m pytest -q

# Headless Chromium and Tesseract OCR from the Debian packages, for the status page's browser test:
# installed when missing (as root, or with password-less sudo), with the time it took; a no-op after.
browser:
	@.ci/install-browser

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .commitline .pytest_cache .hypothesis
