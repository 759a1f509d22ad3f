# The ways a person runs TScale. `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
# torch comes first, then the package is built against it (--no-build-isolation). The
# extension is compiled with the system gcc/g++ unless CC/CXX say otherwise: a Python built
# with a compiler that links libstdc++ statically would otherwise give the extension its own
# copy, and any error message with a number in it would crash.
# On a GPU machine pick the torch build that matches its CUDA, e.g. TORCH_SPEC="torch==2.11.0".
TORCH_SPEC ?= torch==2.13.0
DEMO := .cache/demo
RUN ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)

.PHONY: install test demo bench e2e clean-demo

install:
	@$(PYTHON) -c "import torch, sys; sys.exit(0 if tuple(map(int, torch.__version__.split('+')[0].split('.')[:2])) >= (2, 11) else 1)" 2>/dev/null \
		|| $(PIP) install "$(TORCH_SPEC)"
	$(PIP) install "setuptools>=64" wheel pybind11 ninja numpy click rich "pydantic>=2" "tokenizers>=0.19" safetensors matplotlib
	CC=$${CC:-gcc} CXX=$${CXX:-g++} $(PIP) install --no-build-isolation -e .

test: install
	$(PIP) install pytest pyflakes
	$(PYTHON) -m pytest -q tests

$(DEMO)/data/shakespeare.jsonl.xz:
	$(PYTHON) scripts/fetch_demo_corpus.py $(DEMO)

$(DEMO)/tokens/manifest.json: $(DEMO)/data/shakespeare.jsonl.xz
	rm -rf $(DEMO)/tokens
	tscale tokenize $(DEMO)/data/shakespeare.jsonl.xz --vocab-size 4096 -o $(DEMO)/tokens

demo: install $(DEMO)/tokens/manifest.json
	tscale train configs/tiny-cpu.toml --tokens $(DEMO)/tokens -o $(RUN)
	tscale eval $(RUN) --tokens $(DEMO)/tokens --plot $(RUN)/loss.png
	tscale infer $(RUN) --prompt "ROMEO:" --max-new-tokens 200 --temperature 0.8 --top-k 50 --seed 1

bench: install
	$(PYTHON) scripts/bench/train_throughput.py
	$(PYTHON) scripts/bench/bitpack_throughput.py
	$(PYTHON) scripts/bench/attention_kernel.py
	$(PYTHON) scripts/bench/head_loss_speed.py
	$(PYTHON) scripts/bench/lowprec_gemm.py
	$(PYTHON) scripts/bench/lowprec_train.py speed
	$(PYTHON) scripts/bench/compile_time.py

e2e: install
	bash scripts/e2e.sh

clean-demo:
	rm -rf $(DEMO) runs/demo-*
