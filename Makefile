# attnviz: two commands. `make run` starts the app; `make test` runs lint and every test.
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8501

.PHONY: run test test-fast test-docker install dev lint format typecheck pytest bench warmup dist clean gpu-check

# Installs the pinned dependencies, then the project the way users do (`pip install -e ".[app]"`).
$(VENV)/.installed: requirements.txt scripts/install.sh pyproject.toml
	VENV=$(VENV) bash scripts/install.sh
	touch $@

$(VENV)/.dev-installed: $(VENV)/.installed requirements-dev.txt
	VENV=$(VENV) bash scripts/install.sh --dev
	touch $@

install: $(VENV)/.installed
dev: $(VENV)/.dev-installed

run: install
	$(PY) -m streamlit run app.py --server.port $(PORT) --server.address 0.0.0.0

test: dev lint typecheck pytest test-docker

lint: dev
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/hadolint Dockerfile

format: dev
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

typecheck: dev
	$(PY) -m mypy

pytest: dev
	$(PY) -m pytest -m "not docker"

# The Docker image built, started and used as a user would (README "Docker"): the tests marked
# docker. As root, installs docker.io/debootstrap/docker-compose and starts dockerd when missing.
test-docker: dev
	bash scripts/docker-test.sh $(PY)

# The tier to run on every change (under 3 minutes on 2 cores): engine, figures, AppTest pages.
# No browser, no soak, nothing marked slow, nothing that needs a GPU (markers: pyproject.toml).
FAST := not slow and not browser and not gpu
test-fast: dev
	$(PY) -m pytest -m "$(FAST)"

bench: install
	$(PY) -m attnviz bench

# On a machine with one CUDA GPU (within 9 minutes): the GPU suite, then the Llama-3.2-3B-shaped
# benchmark rows into one report (docs/benchmarks.md "GPU check"). Without a GPU: one line, nothing run.
gpu-check:
	VENV=$(VENV) bash scripts/gpu_check.sh

warmup: install
	$(PY) -m attnviz warmup

# The wheel and sdist users install (`pip install dist/attnviz-*.whl`).
dist: dev
	$(PY) -m build --outdir dist .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache test-output dist build
