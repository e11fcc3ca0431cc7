# The user's commands. `make run` and `make test` each install what is
# missing (Debian packages), configure, build, and then run.
BUILD       ?= build
BUILD_ASAN  ?= build-asan
BUILD_FUZZ  ?= build-fuzz
JOBS        ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all setup configure build install run clients test test-unit test-sanitize test-fuzz fuzz format format-check bench clean

all: build

setup:
	@scripts/setup.sh

configure: setup
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# Installs the binary, dashboards, docs and examples under PREFIX (bin/, share/troupe/,
# share/doc/troupe/); DESTDIR stages the tree elsewhere for packaging.
PREFIX  ?= /usr/local
DESTDIR ?=
install: build
	DESTDIR=$(DESTDIR) cmake --install $(BUILD) --prefix $(PREFIX)

# Serves the OpenAI-compatible API on the built-in model (MODEL=path for another).
MODEL ?=
PORT  ?= 8000
run: build
	$(BUILD)/app/troupe serve --port $(PORT) $(if $(MODEL),--model $(MODEL))

test: build format-check test-unit test-sanitize test-fuzz

# The real OpenAI client and the browser driver (playwright-core, with Debian's chromium)
# the integration tests use: from the npm registry, pinned by the lock file.
clients: setup
	@[ -d tests/clients/node_modules/openai ] && [ -d tests/clients/node_modules/playwright-core ] || \
	  npm ci --prefix tests/clients --no-audit --no-fund --loglevel=error

# A test that hangs fails after TEST_TIMEOUT seconds instead of holding the run (and CI) up.
TEST_TIMEOUT ?= 600
test-unit: build clients
	ctest --test-dir $(BUILD) --output-on-failure --no-tests=error --timeout $(TEST_TIMEOUT) -j $(JOBS)

# The reader and tokenizer fuzz tests under AddressSanitizer + UndefinedBehaviorSanitizer.
test-sanitize: setup
	@cmake -S . -B $(BUILD_ASAN) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTROUPE_SANITIZE=ON >/dev/null
	@cmake --build $(BUILD_ASAN) -j $(JOBS) --target sanitized_tests
	ctest --test-dir $(BUILD_ASAN) --output-on-failure --no-tests=error --timeout $(TEST_TIMEOUT) -j $(JOBS) -L sanitize

# Every libFuzzer target (fuzz/) under ASan + UBSan for FUZZ_SECONDS each, one after
# another; `make test` runs each for TEST_FUZZ_SECONDS. Findings: $(BUILD_FUZZ)/artifacts/.
FUZZ_SECONDS      ?= 300
TEST_FUZZ_SECONDS ?= 20
fuzz: setup
	FUZZ_BUILD=$(BUILD_FUZZ) scripts/fuzz.sh $(FUZZ_SECONDS)

test-fuzz: setup
	FUZZ_BUILD=$(BUILD_FUZZ) scripts/fuzz.sh $(TEST_FUZZ_SECONDS)

format:
	@git ls-files '*.cpp' '*.hpp' '*.cu' | xargs clang-format -i

format-check: setup
	@git ls-files '*.cpp' '*.hpp' '*.cu' | xargs clang-format --dry-run -Werror

bench: build
	scripts/bench-forward.sh
	scripts/bench-throughput.sh

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_FUZZ)
