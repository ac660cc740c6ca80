# Two commands do everything on a fresh machine with Python 3.11:
#   make demo   -- set up, then run the main job end to end on the embedded defaults
#   make test   -- set up, then run the test suite
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= demo-out

.PHONY: demo test setup clean

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[gcp,demo,dev]'
	touch $@

setup: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m pipeline.run --output $(OUT)/data

test: $(VENV)/.installed
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) $(OUT)
