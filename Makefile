# Quick start: `make demo` and `make test` work on a fresh machine (Python 3.11 required).
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
DEMO   := outputs/demo

.PHONY: demo test lint bench bench-serve chromium onnxruntime-web label-studio clean train-default \
	train-sam3-default train-sam2-default

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# runtime install (no torch)
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

# test install: the runtime plus torch, segment-anything, sam3, sam2, samexporter (references
# only), pytest, ruff; sam2 is a source distribution: SAM2_BUILD_CUDA=0 builds it without its
# CUDA extension; samexporter (its SAM 3 ONNX Runtime client, the peer our samexporter export is
# tested with) comes without its dependencies: it pins torch 2.10 and onnx 1.20.1 against our
# pins, and the client needs only numpy, opencv, onnxruntime, ftfy and regex, all in the test
# install
$(VENV)/.installed-test: pyproject.toml constraints-test.txt | $(BIN)/python
	SAM2_BUILD_CUDA=0 $(BIN)/pip install --quiet -c constraints-test.txt -e '.[test]'
	$(BIN)/pip install --quiet --no-deps samexporter==0.5.0
	touch $@ $(VENV)/.installed

# training install: the runtime plus pyyaml and matplotlib
$(VENV)/.installed-train: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[train]'
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	@echo "NOTE: the default model (paddle_sam/assets/sam_tiny_synthetic.pdparams) is a small SAM"
	@echo "      trained only on generated shapes (configs/sam_tiny_synthetic.yaml). Real images"
	@echo "      need official weights: paddle-sam download vit_b (verified, converted)"
	$(BIN)/paddle-sam segment paddle_sam/assets/example.png --point 520,110 \
		-o $(DEMO)/segment --overwrite
	$(BIN)/python -m paddle_sam.train.example iou $(DEMO)/segment/mask.png --point 520,110
	@# with the bundled model, everything lowers SAM's filters by itself (and says so)
	$(BIN)/paddle-sam everything paddle_sam/assets/example.png -o $(DEMO)/everything --overwrite
	@echo "NOTE: the default SAM 3 (paddle_sam/assets/sam3_tiny_concepts.pdparams) knows only the"
	@echo "      synthetic vocabulary (4 colours x 6 shapes: 'red star', 'ring', ...); real images"
	@echo "      need sam3.pt: paddle-sam download sam3, then segment IMAGE --text 'a dog' \\"
	@echo "      --checkpoint sam3.pdparams"
	$(BIN)/paddle-sam segment paddle_sam/assets/example.png --text star -o $(DEMO)/text --overwrite
	$(BIN)/python -m paddle_sam.train.example concept $(DEMO)/text --text star
	@echo "NOTE: the default video model (paddle_sam/assets/sam2_tiny_clips.pdparams) is a small"
	@echo "      SAM 2.1 trained only on generated clips of moving shapes, and weak even there"
	@echo "      (held-out mean IoU 0.33); real videos need official weights: paddle-sam download"
	@echo "      sam2.1_hiera_tiny"
	$(BIN)/paddle-sam track paddle_sam/assets/example_clip.mp4 --point 0,115,222 \
		-o $(DEMO)/track --overwrite --quiet
	$(BIN)/python -m paddle_sam.train.example track $(DEMO)/track --min 0.7
	@echo "demo outputs: $(DEMO)/segment/{mask,overlay}.png, result.json; $(DEMO)/everything/;"
	@echo "              $(DEMO)/text/{masks/,overlay.png,annotations.json};"
	@echo "              $(DEMO)/track/{overlay.mp4,results.json,masks/}"

# the default model's recipe, three stages (each continues the previous one's model): about
# 2.5 hours on this 2-core CPU; writes runs/sam_tiny_synthetic{,_stage2,_stage3}/
train-default: $(VENV)/.installed-train
	$(BIN)/paddle-sam train configs/sam_tiny_synthetic.yaml
	$(BIN)/paddle-sam train configs/sam_tiny_synthetic_stage2.yaml
	$(BIN)/paddle-sam train configs/sam_tiny_synthetic_stage3.yaml

# the default SAM 3's recipe: the vision backbone pretrained (about 20 min), the detector from
# scratch at 256 px (stage 1, about an hour on one core), then at 384 px (stage 2, two to three
# hours), then on scenes of four drawing styles with the backbone unfrozen (stage 3, about an
# hour), then on 4000 new scenes of those styles in two data-parallel processes (stage 4, about
# an hour on two cores); a stopped stage continues with: paddle-sam train CONFIG --resume;
# writes runs/sam3_tiny_concepts{,_stage2,_stage3,_stage4}/ (model.pdparams with its sidecar,
# metrics.csv, curves.png) and the held-out evaluations the bundled model is judged by, in the
# styles it was trained on and in two it never saw (runs/sam3_tiny_concepts_stage4/heldout_*.json)
train-sam3-default: $(VENV)/.installed-train
	test -f runs/sam3_tiny_concepts_backbone.pdparams || $(BIN)/python -m paddle_sam.train.sam3.pretrain \
		configs/sam3_tiny_concepts.yaml -o runs/sam3_tiny_concepts_backbone.pdparams --steps 1200
	$(BIN)/paddle-sam train configs/sam3_tiny_concepts.yaml
	$(BIN)/paddle-sam train configs/sam3_tiny_concepts_stage2.yaml
	$(BIN)/paddle-sam train configs/sam3_tiny_concepts_stage3.yaml
	$(BIN)/paddle-sam train configs/sam3_tiny_concepts_stage4.yaml --nproc 2
	$(BIN)/paddle-sam eval --model-type sam3 --checkpoint runs/sam3_tiny_concepts_stage4/model.pdparams \
		--format concepts --seed 2000 --num-images 30 --styles flat,textured,outlined,clutter \
		--json runs/sam3_tiny_concepts_stage4/heldout_in_style.json --overwrite
	$(BIN)/paddle-sam eval --model-type sam3 --checkpoint runs/sam3_tiny_concepts_stage4/model.pdparams \
		--format concepts --seed 2000 --num-images 30 --styles shaded,photo \
		--json runs/sam3_tiny_concepts_stage4/heldout_out_of_style.json --overwrite

# the default video model's recipe: a small SAM 2.1 on generated scenes and clips, two
# data-parallel processes each stage: its image encoder distilled from the bundled SAM v1 (whose
# heads it starts with; stage 1, about 21 minutes on this 2-core CPU), then tracking clips
# (stage 2, about 70 minutes), then its held-out mean IoU on 30 generated clips of 12 frames it
# never saw (runs/sam2_tiny_clips_stage2/heldout.json)
train-sam2-default: $(VENV)/.installed-train
	$(BIN)/paddle-sam train configs/sam2_tiny_clips.yaml --nproc 2
	$(BIN)/paddle-sam train configs/sam2_tiny_clips_stage2.yaml --nproc 2
	$(BIN)/paddle-sam eval --model-type sam2 --checkpoint runs/sam2_tiny_clips_stage2/model.pdparams \
		--format clips --seed 1000 --num-images 30 --frames 12 \
		--json runs/sam2_tiny_clips_stage2/heldout.json --overwrite

test: $(VENV)/.installed-test chromium onnxruntime-web label-studio
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

# the ONNX web demo test runs the exported decoder in onnxruntime-web (the official demo's
# runtime) in chromium: its npm package, pinned, in an ignored folder. Quick when present; without
# npm the test skips (sudo apt-get install -y npm).
ORT_WEB_VERSION := 1.30.0
ORT_WEB_DIR     := .cache/onnxruntime-web
onnxruntime-web:
	@if [ ! -f $(ORT_WEB_DIR)/.installed-$(ORT_WEB_VERSION) ]; then \
	  if command -v npm >/dev/null 2>&1; then \
	    echo "installing onnxruntime-web $(ORT_WEB_VERSION) for the web demo test (npm)"; \
	    rm -rf $(ORT_WEB_DIR) && mkdir -p $(ORT_WEB_DIR) && \
	    npm install --prefix $(ORT_WEB_DIR) --ignore-scripts --no-audit --no-fund \
	      --loglevel=error onnxruntime-web@$(ORT_WEB_VERSION) >/dev/null && \
	    touch $(ORT_WEB_DIR)/.installed-$(ORT_WEB_VERSION); \
	  else \
	    echo "NOTE: npm missing: the onnxruntime-web test will skip (sudo apt-get install -y npm)"; \
	  fi; \
	fi

# the Label Studio backend test starts a real Label Studio server: its pinned release in a venv
# of its own (its pins clash with the test venv's OpenCV and pyarrow), about 1 GB and 3 minutes
# once. Quick when present.
LS_VERSION := 1.23.2
LS_VENV    := .venv-label-studio
label-studio: $(LS_VENV)/.installed-$(LS_VERSION)

$(LS_VENV)/.installed-$(LS_VERSION): constraints-label-studio.txt
	@echo "installing label-studio $(LS_VERSION) for the Label Studio backend test ($(LS_VENV))"
	rm -rf $(LS_VENV)
	$(PYTHON) -m venv $(LS_VENV)
	$(LS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LS_VENV)/bin/pip install --quiet -c constraints-label-studio.txt label-studio==$(LS_VERSION)
	touch $@

lint: $(VENV)/.installed-test
	$(BIN)/ruff check paddle_sam tests benchmarks
	$(BIN)/ruff format --check paddle_sam tests benchmarks

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/bench_sam_v1.py --model-type vit_b

bench-serve: $(VENV)/.installed-test
	$(BIN)/python benchmarks/bench_serve.py

clean:
	rm -rf $(VENV) $(LS_VENV) outputs test-artifacts .pytest_cache runs
