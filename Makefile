# Makefile: the two commands a new user needs (`make demo`, `make test`) and a few more.
# A thin wrapper over CMake; `make deps` installs the Debian packages the build needs.

BUILD      ?= build
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
GENERATOR  := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")
CMAKE_ARGS ?=
FUZZ_SECONDS ?= 30
DIST       := $(BUILD)/bin/dist

# Debian / Ubuntu packages (see ../shared/DEPS.md for what each one is for).
PACKAGES := antlr4 libantlr4-runtime-dev libcaf-dev libucx-dev ucx-utils libtomlplusplus-dev \
	libopenblas-dev libgloo-dev libopenmpi-dev openmpi-bin libedit-dev libcli11-dev \
	nlohmann-json3-dev libfmt-dev libssl-dev pkg-config fortunes \
	cmake ninja-build g++ libgtest-dev libgmock-dev libbenchmark-dev clang clang-format

.PHONY: all deps build test demo format format-check fuzz fuzz-build sanitize tsan clean

all: build

deps:
	@scripts/install-deps.sh $(PACKAGES)

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: deps build format-check
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$(FUZZ_SECONDS)

demo: deps build
	@scripts/demo.sh $(DIST)

# Canonical formatting of the hand-written C++ and of the shipped .dist scripts.
CXX_SOURCES = $(shell git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' 2>/dev/null)
DIST_SOURCES = $(shell git ls-files 'examples/*.dist' 'stdlib/*.dist' 'bench/*.dist' 'docs/*.dist' 2>/dev/null)

format:
	clang-format -i $(CXX_SOURCES)
	@for f in $(DIST_SOURCES); do $(DIST) fmt --write $$f; done

format-check: build
	clang-format --dry-run -Werror $(CXX_SOURCES)
	@for f in $(DIST_SOURCES); do $(DIST) fmt --check $$f || exit 1; done
	@echo "format-check: ok"

# The libFuzzer targets (the whole front end; the checkpoint readers), built with clang and
# sanitizers in their own folder; a short run by default, `make fuzz FUZZ_SECONDS=600` for a long one.
fuzz-build:
	cmake -S . -B build-fuzz $(GENERATOR) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_COMPILER=clang++ -DDIST_FUZZ=ON -DDIST_TESTS=OFF -DDIST_CUDA=OFF
	cmake --build build-fuzz -j $(JOBS) --target frontend_fuzzer checkpoint_fuzzer

fuzz: fuzz-build
	@scripts/fuzz.sh build-fuzz/bin/frontend_fuzzer $(FUZZ_SECONDS)
	@scripts/fuzz.sh build-fuzz/bin/checkpoint_fuzzer $(FUZZ_SECONDS)

# The test suite under AddressSanitizer and UndefinedBehaviorSanitizer.
sanitize:
	cmake -S . -B build-asan $(GENERATOR) -DCMAKE_BUILD_TYPE=Debug -DDIST_SANITIZE=address,undefined \
	  -DDIST_CUDA=OFF
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure -j $(JOBS)

# The transports and the runtime's executors (on plain threads) under ThreadSanitizer. CAF's
# scheduler is an uninstrumented library whose hand-overs TSan cannot see, so the actor tests
# themselves are not run here. OpenMP regions run one thread (libgomp is not instrumented).
# UCX's memory hooks (libucm) intercept what TSan intercepts and crash it: they are turned off.
TSAN_ENV := OMP_NUM_THREADS=1 UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_EVENTS=no \
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp"
tsan:
	cmake -S . -B build-tsan $(GENERATOR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDIST_SANITIZE=thread \
	  -DDIST_CUDA=OFF -DDIST_FUZZ=OFF -DDIST_BENCH=OFF
	cmake --build build-tsan -j $(JOBS) --target transport_tests runtime_tests
	$(TSAN_ENV) build-tsan/bin/transport_tests
	$(TSAN_ENV) build-tsan/bin/runtime_tests --gtest_filter='Executors.*:Meshes/DevicePath.*'

clean:
	rm -rf $(BUILD) build-fuzz build-asan build-tsan

.PHONY: tutorial
# Runs every command of docs/tutorial, writes its output into its chapter, redraws the pictures.
tutorial: build
	DIST_TUTORIAL_REWRITE=1 $(BUILD)/bin/tutorial_tests --gtest_filter='Tutorial.*'

# The pictures of docs/schedules.md: every schedule on 4 pipeline ranks, 8 microbatches, at the
# unit costs of the zero-bubble paper.
SCHEDULES := gpipe 1f1b interleaved_1f1b looped_bfs zb_h1 zb_h2 zbv dualpipev
.PHONY: schedule-svgs
schedule-svgs: build
	@mkdir -p docs/schedules
	@for k in $(SCHEDULES); do \
	  case $$k in interleaved_1f1b|looped_bfs|zbv|dualpipev) v=2;; *) v=1;; esac; \
	  $(DIST) sim examples/gpt_tiny.dist --cost unit --set model.layers=8 --set mesh.pp=4 \
	    --set schedule.kind=$$k --set schedule.virtual_stages=$$v \
	    --set schedule.microbatches=8 --set train.batch=32 \
	    --svg docs/schedules/$$k.svg >/dev/null || exit 1; \
	done
	@echo "schedule-svgs: docs/schedules/*.svg"
