# Two commands do everything on a fresh machine with Python 3.11:
#   make demo   -- set up, then run the main job end to end on the embedded defaults
#   make test   -- set up, then run the test suite
# `make demo` reuses what an earlier run built; `make demo FRESH=1` rebuilds everything.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= demo-out
DATA := $(OUT)/data
MODELS := $(OUT)/models
REPORT := $(OUT)/report
# SICK relatedness runs when the file is found beside the checkout or given: make demo SICK=/path/SICK.txt
SICK ?= $(wildcard ../shared/data/sick/SICK.txt)
SEN_ENCODER := $(MODELS)/triplets-sen/encoder/saved_model.pb
TITLES_ENCODER := $(MODELS)/triplets-titles/encoder/saved_model.pb

.PHONY: demo demo-build test setup clean

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[gcp,demo,dev]'
	touch $@

setup: $(VENV)/.installed

demo: $(VENV)/.installed
	$(if $(FRESH),rm -rf $(OUT))
	@$(MAKE) --no-print-directory demo-build
	@cat $(REPORT)/report.md
	@echo
	@echo "report:   $(REPORT)/report.md (+ PNG plots beside it)"
	@echo "encoders: $(dir $(SEN_ENCODER)) $(dir $(TITLES_ENCODER))"
	@echo "data:     $(DATA) (counters in $(DATA)/stats.json)"

demo-build: $(REPORT)/report.md

$(DATA)/stats.json:
	$(PY) -m pipeline.run --output $(DATA)

# Training budget on 2 CPU cores: the sentence model with its defaults, the titles model for one pass
# over its (much smaller) training split per epoch.
$(SEN_ENCODER): $(DATA)/stats.json
	$(PY) -m model.train --data $(DATA) --model-dir $(MODELS)/triplets-sen --dataset triplets-sen

$(TITLES_ENCODER): $(DATA)/stats.json
	$(PY) -m model.train --data $(DATA) --model-dir $(MODELS)/triplets-titles --dataset triplets-titles --steps none

$(REPORT)/report.md: $(SEN_ENCODER) $(TITLES_ENCODER)
	$(PY) -m eval.all --data $(DATA) --output $(REPORT) \
	  --model-dir triplets-sen=$(MODELS)/triplets-sen \
	  --model-dir triplets-titles=$(MODELS)/triplets-titles \
	  $(if $(SICK),--sick $(SICK))

test: $(VENV)/.installed
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) $(OUT)
