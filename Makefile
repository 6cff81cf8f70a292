# Two commands for a fresh machine: `make run` (the chat app) and `make test` (each sets up .venv
# on first use). `make ask PROMPT=...` answers one prompt in the terminal.
VENV := .venv
PROMPT ?= What is the capital of France?

.PHONY: setup run ask test test-fast
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $@

run: setup
	$(VENV)/bin/minisgl-chat

ask: setup
	$(VENV)/bin/minisgl-chat generate "$(PROMPT)"

# The demo model is pulled once (cached under the user cache dir) before the tests use it.
test: setup
	$(VENV)/bin/minisgl-chat pull
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

# The unit layer (tests/unit: no server, no browser), about a minute: run it after every change.
# The other layers: tests/server, tests/browser, tests/gpu, tests/soak (`make test` runs them all).
test-fast: setup
	$(VENV)/bin/minisgl-chat pull
	$(VENV)/bin/python -m pytest tests/unit -q $(PYTEST_ARGS)
