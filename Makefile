# servediag: the single entry point. `make help` lists the targets.
VENV ?= .venv
PY := $(VENV)/bin/python
SCENARIO ?= retrieval-launch
export VENV

.PHONY: help setup test lint generate check-generated goldens bench bench-sglang demo clean

help:
	@echo "make demo      simulate an incident, load it into a local Prometheus, diagnose it"
	@echo "make test      run the test suite"
	@echo "make setup     install promtool/prometheus/alertmanager (root) and the Python packages"
	@echo "make generate  write rules/, runbooks/, dashboards/ and the playbook schema"
	@echo "make lint      ruff, mypy and promtool check rules"
	@echo "make bench     benchmarks, printing figures"
	@echo "make bench-sglang   the accuracy on the SGLang scenarios and their variants only"
	@echo "make goldens   rewrite the golden reports and recorded answers (review the diff)"

setup:
	@scripts/install-deps

test: setup
	$(PY) -m pytest

lint: setup
	$(VENV)/bin/ruff check diagnoser tests dashboards scripts scripts/extract-reference
	$(VENV)/bin/ruff format --check diagnoser tests dashboards scripts scripts/extract-reference
	$(VENV)/bin/mypy
	promtool check rules --lint=all --lint-fatal rules/recording.rules.yaml rules/alerts.rules.yaml

generate: setup
	$(VENV)/bin/servediag generate
	$(VENV)/bin/servediag catalog schema > diagnoser/catalog/playbook.schema.json
	$(PY) -m diagnoser.outputs.engines README.md

check-generated: setup
	$(VENV)/bin/servediag generate --check

goldens: setup
	UPDATE_GOLDENS=1 $(PY) -m pytest -q tests/test_golden.py tests/test_replay.py

bench: setup
	$(PY) -m diagnoser.lab.bench

bench-sglang: setup
	$(PY) -m diagnoser.lab.bench sglang

demo: setup
	$(PY) -m diagnoser.lab.demo --scenario $(SCENARIO)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info
