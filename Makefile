# The README's two commands, each doing its own set-up on a fresh machine (Python and pip):
#
#   make train    install, build the Shakespeare data, train configs/small.yml + local.yml
#   make test     install with the test tools, run the test suite
#
# Both install into the active virtual environment (VIRTUAL_ENV), else into .venv, which they
# create. An install runs again only when a requirements file or setup.py is newer than its
# stamp in the environment, so a second `make train` starts training at once.
#
#   make train ARGS="--set train_iters=20"    # ARGS go to deepy.py (or to pytest for `test`)
#   make test ARGS="tests/unit -x"
#
#   make docs          build the documentation site into site/ (mkdocs build --strict)
#   make docs-serve    serve it on http://127.0.0.1:8000, rebuilding on every change

PYTHON ?= python3
VENV ?= .venv
ENV := $(or $(VIRTUAL_ENV),$(abspath $(VENV)))
PY := $(ENV)/bin/python
PIP := $(PY) -m pip
ARGS ?=

# torch alone and first, at the pin of requirements/pins.txt: pip then takes the machine's
# local CPU wheel on a CPU machine and the CUDA build on a GPU machine; left to the resolver of
# another package, a torch range would pull a multi-GB CUDA build onto a CPU machine.
TORCH := $(shell grep -E "^torch==" requirements/pins.txt)

REQ := requirements
TRAIN_REQS := $(REQ)/requirements.txt $(REQ)/pins.txt $(REQ)/requirements-build.txt \
	$(REQ)/requirements-data.txt setup.py tools/build_deepspeed_ops.py
TEST_REQS := $(TRAIN_REQS) $(REQ)/requirements-dev.txt $(REQ)/requirements-tensorboard.txt \
	$(REQ)/requirements-wandb.txt $(REQ)/requirements-comet.txt $(REQ)/requirements-eval.txt \
	$(REQ)/requirements-hf.txt \
	$(REQ)/requirements-mup.txt

.PHONY: train test data install install-test wheelhouse install-offline docs docs-serve

# The quick start keeps its checkpoints apart (checkpoints/small): local.yml's `checkpoints` is
# then free for the next model a user trains with it (configs/160M.yml local.yml, say).
train: install data
	$(PY) deepy.py train.py configs/small.yml local.yml \
		--set save=checkpoints/small --set load=checkpoints/small $(ARGS)

test: install-test
	$(PY) -m pytest -q --durations=20 $(ARGS)

# Builds data/shakespeare/ once; says so and does nothing when it is there.
data: install
	$(PY) prepare_data.py shakespeare

# The documentation site (mkdocs.yml): --strict turns every warning (a broken link or anchor,
# a page left out of the navigation) into a failed build. MkDocs comes with the test tools.
# NO_MKDOCS_2_WARNING: Material's end-of-life notice, printed on every build, says nothing
# about these pages.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs

docs: install-test
	$(MKDOCS) build --strict --site-dir site

docs-serve: install-test
	$(MKDOCS) serve --strict

install: $(ENV)/.megatron-neox-train
install-test: $(ENV)/.megatron-neox-test

$(PY):
	$(PYTHON) -m venv $(ENV)

# $(1): the requirements file of the target (the runtime, or the runtime with the test tools);
# $(2): more requirement files to install without their dependencies.
define install_into_env
	$(PIP) install $(TORCH)
	$(PIP) install -c $(REQ)/pins.txt -r $(REQ)/requirements-build.txt -r $(1)
	$(PIP) install --no-deps -r $(REQ)/requirements-data.txt $(2)
	$(PIP) install --no-build-isolation -e .
	$(PY) tools/build_deepspeed_ops.py
	touch $@
endef

$(ENV)/.megatron-neox-train: $(TRAIN_REQS) | $(PY)
	$(call install_into_env,$(REQ)/requirements.txt)

$(ENV)/.megatron-neox-test: $(TEST_REQS) | $(PY)
	$(call install_into_env,$(REQ)/requirements-dev.txt,-r $(REQ)/requirements-mup.txt)

# A GPU machine with its own PyTorch and no network: on a machine with network,
#   make wheelhouse [WHEELHOUSE=wheelhouse] [WHEEL_PYTHON=3.12] [WHEEL_MACHINE=x86_64]
# gathers every runtime wheel but torch's for that Python; copy the folder over, then
#   make install-offline WHEELHOUSE=wheelhouse
# installs into the active Python (PYTHON), keeping its torch (tools/install_offline.py).
WHEELHOUSE ?= wheelhouse
WHEEL_PYTHON ?= 3.12
WHEEL_MACHINE ?= x86_64

wheelhouse:
	$(PYTHON) tools/wheelhouse.py --out $(WHEELHOUSE) --python $(WHEEL_PYTHON) --machine $(WHEEL_MACHINE)

install-offline:
	$(PYTHON) tools/install_offline.py --wheelhouse $(WHEELHOUSE)
