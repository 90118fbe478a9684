# Quick start: `make demo` and `make test` work on a fresh machine (Python 3.11 required).
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
DEMO   := outputs/demo

.PHONY: demo test lint bench bench-serve chromium clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# runtime install (no torch)
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

# test install: the runtime plus torch, segment-anything (reference only), pytest, ruff
$(VENV)/.installed-test: pyproject.toml constraints-test.txt | $(BIN)/python
	$(BIN)/pip install --quiet -c constraints-test.txt -e '.[test]'
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	@echo "NOTE: no trained default model ships yet, so this demo runs SAM ViT-B with RANDOM"
	@echo "      weights written in the official checkpoint layout: it exercises conversion and"
	@echo "      the whole pipeline, but the masks are meaningless. Real images need official"
	@echo "      weights: paddle-sam convert sam_vit_b_01ec64.pth sam_vit_b.pdparams"
	$(BIN)/paddle-sam random-checkpoint --model-type vit_b -o $(DEMO)/sam_vit_b_random.safetensors --overwrite
	$(BIN)/paddle-sam convert $(DEMO)/sam_vit_b_random.safetensors $(DEMO)/sam_vit_b_random.pdparams --overwrite --quiet
	$(BIN)/paddle-sam segment paddle_sam/assets/example.png --point 170,180 \
		--checkpoint $(DEMO)/sam_vit_b_random.pdparams -o $(DEMO)/segment --overwrite
	$(BIN)/paddle-sam everything paddle_sam/assets/example.png --points-per-side 8 \
		--checkpoint $(DEMO)/sam_vit_b_random.pdparams -o $(DEMO)/everything --overwrite
	@echo "demo outputs: $(DEMO)/segment/{mask,overlay}.png, result.json; $(DEMO)/everything/"

test: $(VENV)/.installed-test chromium
	$(BIN)/python -m pytest -q

# the browser test drives Debian's chromium (playwright never downloads one): install it once
# as root (CI); elsewhere say why the browser test will skip. Quick when already installed.
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing chromium for the browser test (apt-get)"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -qq chromium >/dev/null 2>&1 || \
	      (apt-get update -qq && apt-get install -y -qq chromium >/dev/null); \
	    test -x /usr/bin/chromium; \
	  else \
	    echo "NOTE: /usr/bin/chromium missing and not root: the browser test will skip" \
	         "(sudo apt-get install -y chromium)"; \
	  fi; \
	fi

lint: $(VENV)/.installed-test
	$(BIN)/ruff check paddle_sam tests benchmarks

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/bench_sam_v1.py --model-type vit_b

bench-serve: $(VENV)/.installed-test
	$(BIN)/python benchmarks/bench_serve.py

clean:
	rm -rf $(VENV) outputs test-artifacts .pytest_cache
