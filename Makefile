# ckptd — the two commands: `make run` and `make test`.
#   make run    install what is missing, build, start ckptd on ./state (unix socket state/ckptd.sock)
#   make test   install what is missing, then, cheapest first, the static tiers (make lint): the
#               format check (make format-check: clang-format-15), ruff on the Python (make
#               lint-python), the modules' layers (make check-layers), function length (make
#               check-function-length), clang-tidy (make tidy: clang-tidy-15 over build-tsa/'s
#               compile commands, which carry clang-15's -Wthread-safety) and the thread-safety
#               analysis of the sources tidy does not lint (make check-threads); then build with ASan +
#               UBSan (build-asan/) and run every C++ test there (with the plugin seam test, seam.plugins), the Python tier
#               against that sanitized daemon (the ckptd package, pytest), the ThreadSanitizer
#               tier (make test-tsan: service and dataplane tests, build-tsan/) and the fuzzing
#               smoke run (make test-fuzz: libFuzzer, build-fuzz/)
#   make format apply clang-format-15 to every C++ source of the project (make format-check checks)
#   make build  build only (build/, optimized, no sanitizers: what make run and make bench use)
#   make soak   64 clients for SOAK_SECONDS against the daemon (hidden from make test)
SHELL := /bin/bash
ROOT := $(CURDIR)
BUILD ?= $(ROOT)/build
BUILD_ASAN ?= $(ROOT)/build-asan
BUILD_FUZZ ?= $(ROOT)/build-fuzz
STATE ?= $(ROOT)/state
CMAKE ?= /usr/bin/cmake
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
# The sanitizer tiers (ASan + UBSan, TSan, fuzz) build at -O1 with line tables only (-g1, which
# clang reads as -gline-tables-only): enough for symbolized reports, and about 2.5x faster to compile than -O2 -g
# under the sanitizers (service/save.cc: 58 s against 154 s), which keeps a fresh clone's make test
# within CI's time.
SAN_CMAKE_FLAGS = -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  '-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG' '-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG'
PYTHON ?= python3

.PHONY: setup build build-asan build-fuzz run test test-cpp test-asan test-fuzz test-python \
	test-python-asan test-gpu build-tsan test-tsan python bench soak clean lint format format-check \
	lint-python check-threads tidy configure-tsa docs check-layers check-function-length mutants

setup:
	@bash deploy/setup.sh

build: setup
	@$(CMAKE) -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@$(CMAKE) --build $(BUILD) -j $(JOBS)

# The sanitizer tier: everything built with ASan + UBSan (build-asan/), and every C++ test run
# there — unit binaries of every module and the integration tests, whose daemon, ckptctl and
# test clients are then sanitized too. Any report fails the test that caused it.
# Built by clang-15 (ASAN_CXX): it compiles this tree under ASan + UBSan about 28% faster than GCC
# 12 (service/save.cc: 46 s against 63 s), and clang's UBSan adds checks GCC's lacks.
ASAN_CC ?= clang-15
ASAN_CXX ?= clang++-15
build-asan: setup
	@$(CMAKE) -S . -B $(BUILD_ASAN) $(SAN_CMAKE_FLAGS) -DCKPTD_SANITIZE=ON \
	  -DCMAKE_C_COMPILER=$(ASAN_CC) -DCMAKE_CXX_COMPILER=$(ASAN_CXX) >/dev/null
	@$(CMAKE) --build $(BUILD_ASAN) -j $(JOBS)

# The ThreadSanitizer tier: the service, tier, dataplane, metrics, options, common, client and peer
# unit tests (peer: the replicator, peer client and peer server over real gRPC and mutual TLS on
# loopback, tests/unit/peer/peer_channel_test.cc),
# the index module's committer tests and the io module's reader pool tests (the daemon's
# concurrent core, in-process, with its real flush pool, worker pools, reader pool, committer,
# arena and locks; the other index tests drive RocksDB, which is not instrumented; the other io
# tests drive io_uring, whose rings liburing maps with raw syscalls TSan cannot see, so they would
# report its memory as races) built with TSan against an abseil built from Debian's source with
# TSan (tests/tsan/build_absl.sh; once per build dir).
# Any report fails the tier.
BUILD_TSAN ?= $(ROOT)/build-tsan
TSAN_TARGETS ?= ckptd_unit_service ckptd_unit_tier ckptd_unit_dataplane ckptd_unit_common \
  ckptd_unit_io ckptd_unit_index ckptd_unit_metrics ckptd_unit_options ckptd_unit_client \
  ckptd_unit_peer
build-tsan: setup
	@bash tests/tsan/build_absl.sh $(BUILD_TSAN)/absl
	@$(CMAKE) -S . -B $(BUILD_TSAN) $(SAN_CMAKE_FLAGS) -DCKPTD_TSAN=ON \
	  -DCMAKE_PREFIX_PATH=$(BUILD_TSAN)/absl/install >/dev/null
	@$(CMAKE) --build $(BUILD_TSAN) -j $(JOBS) --target $(TSAN_TARGETS)

TSAN_LOG = $(BUILD_TSAN)/sanitizer/report
test-tsan: build-tsan
	@rm -rf $(BUILD_TSAN)/sanitizer && mkdir -p $(BUILD_TSAN)/sanitizer
	@cd $(BUILD_TSAN) && \
	  TSAN_OPTIONS=second_deadlock_stack=1:log_path=$(TSAN_LOG):suppressions=$(ROOT)/tests/tsan/tsan.supp \
	  ctest --output-on-failure -j 2 --timeout 1200 -R 'unit\.(service|tier|dataplane|common|metrics|options|client|peer):|unit\.io: ?reader pool|unit\.index: ?committer'
	@if compgen -G "$(TSAN_LOG).*" >/dev/null; then \
	  echo "ThreadSanitizer reports:"; cat $(TSAN_LOG).*; exit 1; fi

# The fuzzing tier (tests/fuzz): libFuzzer targets built by clang-15 with ASan + UBSan, against
# only what they need (proto, format, index). Each runs FUZZ_SECONDS from its committed corpus
# after replaying its regressions, two at a time; any crash fails the target.
FUZZ_SECONDS ?= 20
build-fuzz: setup
	@CC=clang-15 CXX=clang++-15 $(CMAKE) -S . -B $(BUILD_FUZZ) $(SAN_CMAKE_FLAGS) \
	  -DCMAKE_C_COMPILER=clang-15 -DCMAKE_CXX_COMPILER=clang++-15 -DCKPTD_FUZZ=ON >/dev/null
	@$(CMAKE) --build $(BUILD_FUZZ) -j $(JOBS)

test-fuzz: build-fuzz
	@bash tests/fuzz/run.sh $(BUILD_FUZZ) $(FUZZ_SECONDS) 2

# The deployable build (deploy/ckptd.service runs /usr/local/bin/ckptd): optimized, without tests
# and without test hooks (CKPTD_TEST_HOOKS=OFF: no crash points, --debug_crash_at refused).
BUILD_RELEASE ?= $(ROOT)/build-release
.PHONY: release
release: setup
	@$(CMAKE) -S . -B $(BUILD_RELEASE) -G Ninja -DCMAKE_BUILD_TYPE=Release -DCKPTD_TEST_HOOKS=OFF \
	  -DCKPTD_BUILD_TESTS=OFF >/dev/null
	@$(CMAKE) --build $(BUILD_RELEASE) -j $(JOBS) --target ckptd ckptctl
	@echo "release: $(BUILD_RELEASE)/ckptd and ckptctl (install them to /usr/local/bin)"

run: build
	@mkdir -p $(STATE)
	@echo "ckptd: state dir $(STATE); in another terminal: export CKPTD_SOCKET=$(STATE)/ckptd.sock"
	@exec $(BUILD)/ckptd --state_dir=$(STATE) --staging_bytes_max=$${CKPTD_STAGING_BYTES:-1073741824}

test-cpp: build
	@cd $(BUILD) && ctest --output-on-failure -j 2 --timeout 600

# Reports of every process (test binaries, and the daemons, ckptctl and clients they start) go
# to $(BUILD_ASAN)/sanitizer/: any file there fails the tier, even from a process whose test
# passed (a daemon's report at its clean exit).
SAN_LOG = $(BUILD_ASAN)/sanitizer/report
# Leaks inside third-party libraries (tests/lsan.supp says each and why) are matched, quietly,
# against stacks symbolized by LLVM 15's symbolizer (deploy/setup.sh installs it).
LSAN_OPTS = suppressions=$(ROOT)/tests/lsan.supp:print_suppressions=0
SYMBOLIZER = /usr/bin/llvm-symbolizer-15
# Fails on any sanitizer report. One line is not a finding: LeakSanitizer saying it could not
# suspend a thread that was exiting while it stopped the world ("False leaks are possible"); a
# leak it then found would still be reported below that line, and fail.
SAN_BENIGN = ^==[0-9]+==Running thread [0-9]+ was not suspended\. False leaks are possible\.$$
CHECK_SAN_REPORTS = if compgen -G "$(SAN_LOG).*" >/dev/null; then \
	  if cat $(SAN_LOG).* | grep -Ev '$(SAN_BENIGN)' | grep -q .; then \
	    echo "sanitizer reports:"; cat $(SAN_LOG).*; exit 1; fi; \
	  echo "sanitizer notes (not findings):"; cat $(SAN_LOG).*; fi
test-asan: build-asan
	@rm -rf $(BUILD_ASAN)/sanitizer && mkdir -p $(BUILD_ASAN)/sanitizer
	@cd $(BUILD_ASAN) && ASAN_OPTIONS=detect_leaks=1:log_path=$(SAN_LOG) \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$(SAN_LOG) \
	  LSAN_OPTIONS=$(LSAN_OPTS) ASAN_SYMBOLIZER_PATH=$(SYMBOLIZER) \
	  ctest --output-on-failure -j 2 --timeout 900
	@$(CHECK_SAN_REPORTS)

# The Python tier: builds the ckptd package (client/python, the extension compiled by this CMake
# project in client/python/build/) into the current Python, then runs tests/python against
# $(BUILD)/ckptd. Each test module starts its own daemon.
python: setup
	@CMAKE_EXECUTABLE=$(CMAKE) CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) \
	  $(PYTHON) -m pip install --no-build-isolation --no-deps -q ./client/python

test-python: build python
	@cd tests/python && CKPTD_BIN=$(BUILD)/ckptd $(PYTHON) -m pytest -p no:cacheprovider -q .

# The GPU tier, on a machine with an NVIDIA GPU and the build's packages: the [gpu] C++ cases and
# the Python GPU tests (elsewhere they show as not run / skipped). On a lent GPU machine without
# the packages: tests/gpu/bundle.sh here, tests/gpu/run.sh there.
test-gpu: build python
	@$(BUILD)/tests/ckptd_integration_tests "[gpu]"
	@cd tests/python && CKPTD_BIN=$(BUILD)/ckptd $(PYTHON) -m pytest -p no:cacheprovider -q test_gpu.py

# make test's Python tier: the same tests against the sanitized daemon and ckptctl of build-asan
# (the extension itself is the normal build: a sanitized one cannot load into this Python).
test-python-asan: build-asan python
	@mkdir -p $(BUILD_ASAN)/sanitizer
	@cd tests/python && CKPTD_BIN=$(BUILD_ASAN)/ckptd \
	  ASAN_OPTIONS=detect_leaks=1:log_path=$(SAN_LOG) \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$(SAN_LOG) \
	  LSAN_OPTIONS=$(LSAN_OPTS) ASAN_SYMBOLIZER_PATH=$(SYMBOLIZER) \
	  $(PYTHON) -m pytest -p no:cacheprovider -q .
	@$(CHECK_SAN_REPORTS)

# --- the static tiers (make lint; the first part of make test) ---------------------------------
# The project's C++ sources: every .cc/.h git knows or would add (tracked, or untracked and not
# ignored), so build dirs, generated protobuf code (build*/gen) and Python's build tree are out.
CXX_SOURCES = git ls-files -z --cached --others --exclude-standard -- '*.cc' '*.h' '*.cu' '*.cuh'

# clang-format-15 with .clang-format (Google, 100 columns): format-check fails on any file it
# would change (and names it); format rewrites them in place.
format-check: setup
	@$(CXX_SOURCES) | xargs -0 -r clang-format-15 --dry-run -Werror --style=file

format: setup
	@$(CXX_SOURCES) | xargs -0 -r clang-format-15 -i --style=file

# docs/CONFIGURATION.md regenerated from the options' declarations (ckptd --help-config); the
# ctest "docs: configuration reference" fails while they differ.
docs: build
	@bash tests/docs/config_reference_test.sh $(BUILD)/ckptd docs/CONFIGURATION.md --update

# ruff on the Python (client/python, tests/python, bench; ruff.toml).
lint-python: setup
	@$(PYTHON) -m ruff check .

# The thread-safety analysis: clang-15 with -Wthread-safety as an error (CKPTD_THREAD_SAFETY) over
# everything the project compiles with its warnings (the daemon, its modules and plugins, the
# client library and its Python binding, ckptctl, the benchmarks and the tests, whose rigs hold
# locks too): every ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED / ABSL_LOCKS_EXCLUDED checked.
# build-tsa/ is configured for it (its compile commands carry the flags) and never built whole:
# each source is parsed once by the static tier. tidy parses the sources it lints (TIDY_FILES)
# with those commands, so a lock finding there fails tidy (clang-diagnostic-thread-safety-*);
# check-threads parses every other source -fsyntax-only (tests/lint/check_threads.py). libstdc++'s
# std::mutex and friends carry no annotations, so a field guarded by one would be checked by
# nobody: the daemon, the client, the plugins and the tests use absl::Mutex / absl::CondVar only,
# and check-threads fails on a std:: lock in them first.
BUILD_TSA ?= $(ROOT)/build-tsa
STD_LOCKS = std::(recursive_|shared_|timed_|recursive_timed_|shared_timed_)?mutex\b|std::(lock_guard|unique_lock|scoped_lock|shared_lock|condition_variable)
TIDY_FILES = ^$(ROOT)/(daemon|client|plugins/storage)/.*\.cc$$
PYTHON_EXE = $(shell $(PYTHON) -c 'import sys; print(sys.executable)')

configure-tsa: setup
	@$(CMAKE) -S . -B $(BUILD_TSA) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 \
	  -DCMAKE_C_FLAGS_DEBUG=-O0 -DCMAKE_C_COMPILER=clang-15 -DCMAKE_CXX_COMPILER=clang++-15 \
	  -DCKPTD_THREAD_SAFETY=ON -DCKPTD_BUILD_PYTHON=ON -DPython_EXECUTABLE=$(PYTHON_EXE) >/dev/null
	@$(CMAKE) --build $(BUILD_TSA) --target ckptd_proto_headers >/dev/null

check-threads: configure-tsa
	@if git grep --untracked -nE '$(STD_LOCKS)' -- daemon client plugins tests ':!*.py' ':!*.md'; then \
	  echo "check-threads: std:: locks above are invisible to -Wthread-safety; use absl::Mutex"; \
	  exit 1; fi
	@$(PYTHON) tests/lint/check_threads.py $(BUILD_TSA) '$(TIDY_FILES)' $(JOBS)

# clang-tidy-15 (.clang-tidy; every finding is an error) over the daemon, the client (with the
# Python binding) and the storage plugins, with build-tsa/'s compile commands (clang's own flags
# and -Wthread-safety: see check-threads), TIDY_JOBS files at once.
TIDY_JOBS ?= $(JOBS)
tidy: configure-tsa
	@run-clang-tidy-15 -p $(BUILD_TSA) -j $(TIDY_JOBS) -quiet '$(TIDY_FILES)' \
	  >$(BUILD_TSA)/tidy.log 2>&1 || \
	  { grep -E -A3 '(error|warning): ' $(BUILD_TSA)/tidy.log; \
	    echo "tidy: findings above (full log: $(BUILD_TSA)/tidy.log)"; exit 1; }
	@echo "tidy: no findings"

# The modules' layers run one way: a module of daemon/src includes only modules of lower layers
# (tests/lint/check_layers.py defines the order); a finding names the file, the line and the
# include.
check-layers:
	@$(PYTHON) tests/lint/check_layers.py

# No function body over 70 lines in daemon/, client/ and plugins/storage/ (tests exempt), as
# TigerBeetle's tidy enforces; tests/lint/check_function_length.py names each exception and why.
check-function-length:
	@$(PYTHON) tests/lint/check_function_length.py

lint: format-check lint-python check-layers check-function-length tidy check-threads

# Every C++ test runs in the sanitized build only (the plain build is `make build` / `make run`
# / `make bench`; `make test-cpp` runs the C++ tests there too): one full build instead of two
# keeps a fresh clone's `make test` within CI's time.
test: lint test-asan test-python-asan test-tsan test-fuzz

bench: build python
	@bash bench/run.sh

# The soak: 64 clients against the real daemon for SOAK_SECONDS; no errors, no wrong bytes,
# daemon RSS and fds flat after warm-up (tests/integration/soak_test.cc, hidden from make test).
SOAK_SECONDS ?= 300
soak: build
	@cd $(BUILD) && CKPTD_SOAK_SECONDS=$(SOAK_SECONDS) ./tests/ckptd_integration_tests "[soak]" \
	  --durations yes

# Mutation testing (not in make test: run it when a critical path changes): plants, one at a time,
# the bugs that matter (a checksum never compared, the COMMITTED row before the manifest, a commit
# one rank short, a lease ignored, an owner check skipped, an upload durable before its manifest)
# in a copy of the tree (build-mutants/), rebuilds, runs the tests that should catch each, and
# fails naming any that survives. MUTANTS=name,name runs some (tests/mutants/run_mutants.py --list).
mutants: setup
	@$(PYTHON) tests/mutants/run_mutants.py --jobs $(JOBS) $(if $(MUTANTS),--only $(MUTANTS))

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_FUZZ) $(BUILD_RELEASE) $(BUILD_TSA) $(ROOT)/build-mutants
