# Two commands for a fresh machine: `make run` (the chat app) and `make test` (each sets up .venv
# on first use). `make ask PROMPT=...` answers one prompt in the terminal.
VENV := .venv
PROMPT ?= What is the capital of France?

.PHONY: setup run ask test test-fast lint lint-python lint-static
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

# The page's JavaScript and CSS (app/static) through ESLint and Stylelint, at the versions pinned in
# tools/lint/package-lock.json (npm ci puts them in tools/lint/node_modules; needs node and npm).
LINT := tools/lint
lint-static: $(LINT)/node_modules/.installed
	$(LINT)/node_modules/.bin/eslint --max-warnings 0 --config $(LINT)/eslint.config.mjs app/static
	$(LINT)/node_modules/.bin/stylelint --max-warnings 0 --config $(LINT)/stylelint.config.mjs "app/static/*.css"

$(LINT)/node_modules/.installed: $(LINT)/package.json $(LINT)/package-lock.json
	cd $(LINT) && npm ci --no-audit --no-fund --ignore-scripts
	touch $@

# The Python through Ruff (pyproject.toml: lint rules, import order, format at 100 columns).
lint-python: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

lint: lint-python lint-static
