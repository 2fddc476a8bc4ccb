# `make run`: set up (if needed) and run the main job on the embedded defaults.
# `make test`: set up (if needed) and run the test suite (what CI runs).
# `make docs`: build the documentation site offline into site/, in strict mode (tests/test_docs_site.py too).
.PHONY: setup run test test-fast docs clean-services
SHELL := /bin/bash
# when make started (epoch seconds): `rao run`'s end-of-run table counts the set-up check from here
MAKE_STARTED_AT := $(shell date +%s.%N)

setup:
	@bash scripts/setup.sh

run: setup
	@RAO_MAKE_STARTED_AT=$(MAKE_STARTED_AT) .venv/bin/rao run

test: setup
	@.venv/bin/python -m pytest -q -p no:cacheprovider --timeout=1800 --durations=25 tests

test-fast: setup
	@.venv/bin/python -m pytest -q -p no:cacheprovider -m "not vllm and not slow" tests

docs: setup
	@NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir site

clean-services:
	@.venv/bin/rao services down || true
