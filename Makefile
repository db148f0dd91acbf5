# ctitan build. `make help` lists the targets.
#
# Layout of the output:
#   build/ctitan                 the binary (core/)
#   build/plugins/ctitan-*.so    one shared object per folder under plugins/ and models/
#   build/tests/test_*           cmocka unit tests (tests/unit/test_*.c)

CC        ?= cc
CXX       ?= g++
BUILD     ?= build
SANITIZE  ?= 0
OPT       ?= -O2

OPENBLAS_DIR := /usr/lib/x86_64-linux-gnu/openblas-openmp
CPPFLAGS  += -Isdk/include -Icore -D_GNU_SOURCE
CFLAGS    += -std=c11 -Wall -Wextra -Werror -g $(OPT) -fno-strict-aliasing
CXXFLAGS  += -std=c++17 -Wall -Wextra -Werror -g $(OPT)
LDLIBS    += -lyaml -lpcre2-8 -ljansson -lz -lzstd -lcairo -lfontconfig -ldl -lm -lpthread -lstdc++

ifeq ($(SANITIZE),1)
  BUILD   := build-san
  CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  CXXFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  LDFLAGS += -fsanitize=address,undefined
endif

# Plugins include only sdk/ headers, hide every symbol but their entry function.
PLUGIN_CFLAGS  := $(CFLAGS) -fPIC -fvisibility=hidden -Isdk/include
PLUGIN_LDFLAGS := -shared $(LDFLAGS)
# Every plugin links what it calls itself (libm) rather than counting on the program that loads it.
PLUGIN_LIBS    := -lm

CORE_SRC   := $(wildcard core/*.c core/*/*.c)
# torchtitan's TOML configs are read by toml++ (C++17, header-only) behind one C++ file
CORE_CXX_SRC := core/config/toml_shim.cpp
CORE_OBJ   := $(CORE_SRC:%.c=$(BUILD)/%.o) $(CORE_CXX_SRC:%.cpp=$(BUILD)/%.o)
CORE_LIB_OBJ := $(filter-out $(BUILD)/core/main.o,$(CORE_OBJ))
# The core as a static library: ctitan (main.o and all of it: plugins resolve nothing against the
# program, but a command's code is reached only through main's table), the unit tests and the
# fuzz targets link it, so no source list is kept by hand.
CORE_LIB := $(BUILD)/libctitan-core.a

# Per-plugin flags: plugins/<name>/plugin.mk may append to CFLAGS_<name> / LIBS_<name>, or set
# SKIP_<name> := 1 when what it needs is absent (e.g. the CUDA toolkit). A folder that builds
# differently (CUDA sources, one .so per file) sets SKIP_<name> := 1, writes its own rules and
# appends its outputs to EXTRA_SOS.
.DEFAULT_GOAL := all
EXTRA_SOS :=
-include $(wildcard plugins/*/plugin.mk) $(wildcard models/*/plugin.mk)
PLUGIN_DIRS := $(wildcard plugins/*/) $(wildcard models/*/)
PLUGIN_NAMES := $(foreach d,$(PLUGIN_DIRS),$(notdir $(patsubst %/,%,$(d))))
PLUGIN_NAMES := $(foreach n,$(PLUGIN_NAMES),$(if $(SKIP_$(n)),,$(n)))
PLUGIN_SOS := $(foreach n,$(PLUGIN_NAMES),$(BUILD)/plugins/ctitan-$(n).so)

TEST_SRC  := $(wildcard tests/unit/test_*.c)
TEST_BIN  := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)

# Extra link flags per plugin (plugins/<name>/plugin.mk may append to these).
LIBS_cpu  += -L$(OPENBLAS_DIR) -Wl,-rpath,$(OPENBLAS_DIR) -lopenblas -fopenmp -lm
CFLAGS_cpu += -fopenmp

# Programs that run under mpirun (tests/mpi/*.c -> $(BUILD)/tests/mpi/*), driven by tests/cli scripts.
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null)
MPI_TEST_SRC := $(wildcard tests/mpi/*.c)
MPI_TEST_BIN := $(MPI_TEST_SRC:tests/mpi/%.c=$(BUILD)/tests/mpi/%)

.PHONY: all help check test bench demo deps clean fuzz
all: $(BUILD)/ctitan $(PLUGIN_SOS) $(EXTRA_SOS) $(BUILD)/ctitan-sdk.pc

help:
	@echo "make            build build/ctitan and every plugin under build/plugins/"
	@echo "make demo       install what is missing, build, prepare the demo data, train debugmodel, sample text"
	@echo "make check      build, run the fast tiers (tests/tiers.txt: unit, contract): no MPI, no training (seconds)"
	@echo "make test       install what is missing, build, run the whole test suite"
	@echo "make test SANITIZE=1   the same under AddressSanitizer + UndefinedBehaviorSanitizer"
	@echo "make bench      sgemm peak, then tokens/s, GFLOP/s and the ratio to that peak; the MoE grouped GEMM against one sgemm; qwen3 MoE training (one rank, EP 2, forced balance) against PyTorch; the planner's searches and their time (BENCH_ONLY=\"moe cp\": those sections)"
	@echo "make deps       install missing Debian packages (apt-get; a no-op when all are present)"
	@echo "make fuzz       build the libFuzzer targets (clang) under build/fuzz/"
	@echo "make clean      remove build outputs"

deps:
	@scripts/deps.sh

$(CORE_LIB): $(CORE_LIB_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

$(BUILD)/ctitan: $(BUILD)/core/main.o $(CORE_LIB)
	$(CC) $(LDFLAGS) -rdynamic -o $@ $(BUILD)/core/main.o -Wl,--whole-archive $(CORE_LIB) -Wl,--no-whole-archive $(LDLIBS)

$(BUILD)/core/%.o: core/%.c $(wildcard core/*/*.h) $(wildcard sdk/include/ctitan/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -DCT_BUILD_PLUGIN_DIR='"$(abspath $(BUILD))/plugins"' -c -o $@ $<

$(BUILD)/core/%.o: core/%.cpp core/config/toml_shim.h
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) -c -o $@ $<

# One shared object per plugin folder: every .c in it.
define plugin_rule
$(BUILD)/plugins/ctitan-$(1).so: $(wildcard $(2)*.c) $(wildcard $(2)*.h) $(wildcard $(2)*.mk) $(wildcard $(2)*.map) $(wildcard sdk/include/ctitan/*.h)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(PLUGIN_CFLAGS) $$(CFLAGS_$(1)) $$(PLUGIN_LDFLAGS) -o $$@ $(wildcard $(2)*.c) $$(LIBS_$(1)) $$(PLUGIN_LIBS)
endef
$(foreach n,$(PLUGIN_NAMES),$(eval $(call plugin_rule,$(n),$(firstword $(filter %/$(n)/,$(PLUGIN_DIRS))))))

# Test plugins (tests/plugins/NAME.c -> $(BUILD)/tests/plugins/ctitan-NAME.so), loaded by path by
# tests/cli scripts; built like the shipped ones, so the sanitizer build has sanitized ones.
TEST_PLUGIN_SRC := $(wildcard tests/plugins/*.c)
TEST_PLUGIN_SOS := $(TEST_PLUGIN_SRC:tests/plugins/%.c=$(BUILD)/tests/plugins/ctitan-%.so)
$(BUILD)/tests/plugins/ctitan-%.so: tests/plugins/%.c $(wildcard sdk/include/ctitan/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(PLUGIN_CFLAGS) $(PLUGIN_LDFLAGS) -o $@ $< $(PLUGIN_LIBS)
$(BUILD)/tests/plugins/ctitan-axisprobe_cp.so: tests/plugins/axisprobe.c # it builds axisprobe.c for another axis

$(BUILD)/tests/%: tests/unit/%.c $(CORE_LIB) $(wildcard tests/unit/*.h sdk/include/ctitan/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(TEST_CFLAGS_$*) -Itests/unit -o $@ $< $(TEST_EXTRA_$*) $(CORE_LIB) $(LDFLAGS) $(LDLIBS) $(TEST_LIBS_$*) -lcmocka

$(BUILD)/tests/mpi/%: tests/mpi/%.c $(wildcard tests/mpi/*.h) $(wildcard sdk/include/ctitan/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(MPI_CFLAGS) -o $@ $< $(LDFLAGS) -ldl -lm $(MPI_LIBS)

# The ABI version is written once, in abi.h; the pkg-config file's Version is MAJOR.MINOR.0 from it.
ABI_VERSION = $(shell sed -n 's/^\#define CT_ABI_MAJOR \([0-9]*\).*/\1/p' sdk/include/ctitan/abi.h).$(shell sed -n 's/^\#define CT_ABI_MINOR \([0-9]*\).*/\1/p' sdk/include/ctitan/abi.h)
$(BUILD)/ctitan-sdk.pc: sdk/ctitan-sdk.pc.in sdk/include/ctitan/abi.h
	@mkdir -p $(dir $@)
	sed -e 's|@PREFIX@|$(abspath sdk)|' -e 's|@VERSION@|$(ABI_VERSION).0|' $< > $@

-include $(wildcard tests/unit/*.mk)
include tests/cuda_emu/emu.mk

# The fast tiers for the edit-compile loop (tests/tiers.txt): unit (cmocka tests of one part) and
# contract (the command line, files and plugin ABI from outside), none launching MPI ranks or a
# training run. `make test` runs these and every other tier.
CHECK_TIERS := unit,contract
CHECK_UNIT := $(shell awk '$$1 ~ /^test_/ && index(",$(CHECK_TIERS),", "," $$2 ",") { print $$1 }' tests/tiers.txt)
check: all $(CHECK_UNIT:%=$(BUILD)/tests/%)
	BUILD=$(BUILD) tests/run.sh --tier $(CHECK_TIERS)

# two tests at a time by default (tests/run.sh: the longest first); CT_TEST_JOBS=1 runs them one by one
CT_TEST_JOBS ?= 2
# The libFuzzer targets the suite runs (fuzz_safetensors.sh, fuzz_tensorfile.sh) are built here with
# the rest where clang is (-j applies): built by the first of those tests, the instrumented core took
# a job slot for 75 s of compiling, one file at a time. Where clang cannot build them the tests say
# so and skip their libFuzzer runs, as before.
FUZZ_TESTED := build/fuzz/fuzz_safetensors build/fuzz/fuzz_tensorfile
test: deps
	$(MAKE) all $(TEST_BIN) $(MPI_TEST_BIN) $(TEST_PLUGIN_SOS)
	@if command -v clang >/dev/null 2>&1; then $(MAKE) $(FUZZ_TESTED) || \
	  echo "make test: the libFuzzer targets did not build: the fuzz tests skip their libFuzzer runs"; fi
	@if [ "$(SANITIZE)" != 1 ] && command -v $(CXX) >/dev/null 2>&1 && command -v perl >/dev/null 2>&1 && \
	  [ "$$(uname -m)" = x86_64 ]; then $(MAKE) cuda-emu; fi
	BUILD=$(BUILD) CT_TEST_JOBS=$(CT_TEST_JOBS) tests/run.sh

bench: deps all
	BUILD=$(BUILD) scripts/bench.sh

demo: deps all
	BUILD=$(BUILD) scripts/demo.sh

# libFuzzer targets (clang): run e.g. build/fuzz/fuzz_manifest -max_total_time=60 NEW_DIR tests/fuzz/corpus/manifest
# (the first folder collects new inputs; keep the committed seeds read-only)
# Every target links the core built with the fuzzer's instrumentation as one library (the linker
# takes the objects a target reaches), so no target keeps a list of core sources.
FUZZ_FLAGS := -g -O1 -fsanitize=fuzzer-no-link,address,undefined -Isdk/include -Icore -D_GNU_SOURCE
FUZZ_LINK  := -fsanitize=fuzzer,address,undefined
FUZZ_TARGETS := $(patsubst tests/fuzz/%.c,build/fuzz/%,$(filter-out tests/fuzz/replay_main.c,$(wildcard tests/fuzz/fuzz_*.c)))
FUZZ_CORE_OBJ := $(patsubst core/%.c,build/fuzz/core/%.o,$(filter-out core/main.c,$(CORE_SRC))) build/fuzz/core/config/toml_shim.o
build/fuzz/core/%.o: core/%.c $(wildcard core/*/*.h) $(wildcard sdk/include/ctitan/*.h)
	@mkdir -p $(dir $@)
	clang -std=c11 $(FUZZ_FLAGS) -c -o $@ $<
build/fuzz/core/%.o: core/%.cpp core/config/toml_shim.h
	@mkdir -p $(dir $@)
	clang++ -std=c++17 $(FUZZ_FLAGS) -c -o $@ $<
build/fuzz/libctitan-core.a: $(FUZZ_CORE_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^
build/fuzz/fuzz_%: tests/fuzz/fuzz_%.c build/fuzz/libctitan-core.a
	clang++ $(FUZZ_FLAGS) $(FUZZ_LINK) -o $@ -x c $< -x none build/fuzz/libctitan-core.a $(LDLIBS)
fuzz: $(FUZZ_TARGETS)

clean:
	rm -rf build build-san
