# Two commands do everything on a fresh Debian 12 machine (as root):
#   make demo   set up, then run the 8-node namespace fabric with known pathologies + live view
#   make test   set up, then run every test tier (unit, kernel, integration)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.skewscope-setup-done

.PHONY: setup test demo bench clean unit kernel integration

# The AOT kernel module (skewscope/_aot*.so): rebuilt only when a kernel's source, or a module
# it imports, changed (tools/aotbuild.py).
# Without it everything still runs, under numba's JIT (a slower first result): docs/startup.md.
setup: $(STAMP)
	$(PY) tools/aotbuild.py build --if-stale || \
	  echo "setup: warning: the AOT kernel module did not build; kernels run under numba's JIT" >&2

$(STAMP): pyproject.toml tools/setup.sh
	bash tools/setup.sh
	touch $(STAMP)

test: setup
	$(PY) -m pytest -ra $(PYTEST_ARGS)

unit: setup
	$(PY) -m pytest -ra tests/unit $(PYTEST_ARGS)

kernel: setup
	$(PY) -m pytest -ra tests/kernel $(PYTEST_ARGS)

integration: setup
	$(PY) -m pytest -ra tests/integration $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/skewscope demo

bench: setup
	for b in tools/bench/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
