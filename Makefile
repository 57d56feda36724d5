# servediag: the single entry point. `make help` lists the targets.
VENV ?= .venv
PY := $(VENV)/bin/python
SCENARIO ?= retrieval-launch
DEMO_ARGS ?=
DOCS_PORT ?= 8000
export VENV

.PHONY: help setup test test-fast lint generate check-generated goldens bench bench-alerts bench-fleet bench-sglang bench-real demo real real-record real-what-if docs docs-build clean

help:
	@echo "make demo      simulate an incident, load it into a local Prometheus, diagnose it"
	@echo "                (DEMO_ARGS=--watch: then serve the finding with servediag watch)"
	@echo "make test      run the test suite"
	@echo "make test-fast the tests that need no server and take no more than seconds (about 2 min)"
	@echo "make setup     install promtool/prometheus/alertmanager (root) and the Python packages"
	@echo "make generate  write rules/, runbooks/, dashboards/, the playbook schema and the engine support page"
	@echo "make lint      ruff, mypy and promtool check rules"
	@echo "make bench     benchmarks, printing figures"
	@echo "make bench-alerts   the alerts on healthy services (pages per day) and incidents"
	@echo "make bench-fleet    diagnose on a fleet of 512 targets, Prometheus and VictoriaMetrics"
	@echo "make bench-sglang   the accuracy on the SGLang scenarios and their variants only"
	@echo "make goldens   rewrite the golden reports and recorded answers (review the diff)"
	@echo "make real      a real vLLM (CPU build) through one incident, diagnosed (INCIDENT=name)"
	@echo "make bench-real     every real incident, live (about 2 h), and AC@1"
	@echo "make real-record    every real incident, recorded into tests/data/real (about 2 h)"
	@echo "make real-what-if   what-if against a real vLLM run at each lever (EXPERIMENT=name)"
	@echo "make docs      serve the documentation site at http://127.0.0.1:$(DOCS_PORT) (DOCS_PORT=N)"
	@echo "make docs-build     build the documentation site into site/, strictly (as CI does)"

setup:
	@scripts/install-deps

# One worker per core and one more: the live end-to-end tests (a simulator, Prometheus,
# Alertmanager and servediag in real time) mostly wait, and the extra worker computes
# meanwhile (on 2 cores: 614 s with 3 workers, 688 s with 2, 630 s with 4). A module that
# shares a fixture keeps to one worker (tests/conftest.py).
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
test: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup

# The inner loop: no promtool, Prometheus, Alertmanager or VictoriaMetrics, nothing marked slow.
# Those binaries are stood in for by ones that fail, so a test that needs one unmarked fails.
# Twice as many workers as cores: most of these tests wait (on deadlines, drains, slow
# clients), and the waits overlap.
FAST_WORKERS ?= $(shell echo $$(( $$(nproc) * 2 )))
test-fast:
	@test -x $(PY) || $(MAKE) setup
	$(PY) -m pytest -m "not prometheus and not slow" --without-servers -n $(FAST_WORKERS) --dist loadgroup

lint: setup
	$(VENV)/bin/ruff check diagnoser lab tests dashboards examples scripts scripts/extract-reference
	$(VENV)/bin/ruff format --check diagnoser lab tests dashboards examples scripts scripts/extract-reference
	$(VENV)/bin/mypy
	promtool check rules --lint=all --lint-fatal rules/recording.rules.yaml rules/alerts.rules.yaml

generate: setup
	$(VENV)/bin/servediag generate
	$(VENV)/bin/servediag catalog schema > diagnoser/catalog/playbook.schema.json
	$(PY) -m diagnoser.outputs.engines docs/engines/support.md

check-generated: setup
	$(VENV)/bin/servediag generate --check

goldens: setup
	UPDATE_GOLDENS=1 $(PY) -m pytest -q tests/test_golden.py tests/test_replay.py tests/test_html.py \
		tests/test_real_what_if.py

bench: setup
	$(PY) -m lab.bench

bench-alerts: setup
	$(PY) -m lab.bench alerts

bench-fleet: setup
	$(PY) -m lab.bench fleet

bench-sglang: setup
	$(PY) -m lab.bench sglang

# A real vLLM: its CPU build in .venv-vllm (installed on first use), a tiny model with random
# weights, a real Prometheus; see fixtures/real/ and docs/lab/real.md.
INCIDENT ?= prompt-length-shift
real: setup
	$(PY) -m lab.real $(INCIDENT)

bench-real: setup
	$(PY) -m lab.real --bench
	$(PY) -m lab.real --all

real-record: setup
	$(PY) -m lab.real --all --record

# What-if's predictions against the real server run at each lever (about 35 minutes each, on a
# quiet machine); the recordings are replayed by make bench and the tests.
EXPERIMENT ?= kv-room
real-what-if: setup
	$(PY) -m lab.real.whatif $(EXPERIMENT)

demo: setup
	$(PY) -m lab.demo --scenario $(SCENARIO) $(DEMO_ARGS)

# The documentation site (mkdocs.yml, docs/): served with live reload, or built strictly (a
# broken link or anchor fails), as CI does.
docs: setup
	$(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:$(DOCS_PORT)

docs-build: setup
	$(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) .venv-vllm .venv-vllm-install.log .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info site
