# The CUDA plugin on the CPU emulator (tests/cuda_emu, run by tests/cli/cuda_emulated.sh), built by
# `make test` with the rest of what the suite runs (-j applies, and an unchanged file is not
# rebuilt), so the test's time is the runs' alone. Under ASan and UBSan, like the test's runs: the
# emulator is the sanitized build of the plugin's kernels and host code.
#
# The .cu files are compiled by g++ after two rewrites (launches become emu_launch calls, dynamic
# shared memory a pointer to the block's); the plugin's C files are compiled as they are, against the
# stand-in headers. Not under SANITIZE=1: the emulated plugin is sanitized already, and the
# sanitizer suite skips the test.
CUDA_EMU := tests/cuda_emu
CUDA_EMU_OUT := $(BUILD)/cuda-emu
CUDA_EMU_OPENBLAS_INC := /usr/include/x86_64-linux-gnu/openblas-openmp
CUDA_EMU_SAN := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
CUDA_EMU_CXXFLAGS := -std=c++17 -O1 -g -fPIC -Wall -Wextra -Werror $(CUDA_EMU_SAN) -I$(CUDA_EMU) \
  -I$(CUDA_EMU)/include -Iplugins/cuda -Isdk/include
CUDA_EMU_CFLAGS := -std=c11 -O1 -g -fPIC -Wall -Wextra -Werror -fno-strict-aliasing -D_GNU_SOURCE \
  $(CUDA_EMU_SAN) -Isdk/include -I$(CUDA_EMU)/include
CUDA_EMU_DEPS := $(wildcard plugins/cuda/*.h plugins/cuda/*.cuh $(CUDA_EMU)/*.h $(CUDA_EMU)/include/*.h \
  $(CUDA_EMU)/include/*/*/*.cuh sdk/include/ctitan/*.h) $(CUDA_EMU)/emu.mk
CUDA_EMU_KERNEL_OBJ := $(patsubst plugins/cuda/%.cu,$(CUDA_EMU_OUT)/%.cu.o,$(wildcard plugins/cuda/*.cu))
CUDA_EMU_HOST_OBJ := $(patsubst plugins/cuda/%.c,$(CUDA_EMU_OUT)/%.c.o,$(wildcard plugins/cuda/*.c))
CUDA_EMU_RT_OBJ := $(CUDA_EMU_OUT)/emu_runtime.o $(CUDA_EMU_OUT)/emu_streams.o $(CUDA_EMU_OUT)/emu_graphs.o
CUDA_EMU_LIBS := -L$(OPENBLAS_DIR) -Wl,-rpath,$(OPENBLAS_DIR) -lopenblas -lpthread
# what cuda_emulated.sh runs
CUDA_EMU_TESTED := $(CUDA_EMU_OUT)/ctitan-cuda-emu.so $(CUDA_EMU_OUT)/test_device_conformance \
  $(CUDA_EMU_OUT)/cross_check $(CUDA_EMU_OUT)/emu_graph_check

$(CUDA_EMU_OUT)/src/%.cpp: plugins/cuda/%.cu
	@mkdir -p $(dir $@)
	perl -0p -e 's/(\w+(?:<\w+>)?)<<<(.*?)>>>\(/emu_launch(EMU_CFG($$2), $$1, /gs;' \
	  -e 's/extern __shared__ (\w+) (\w+)\[\];/$$1 *$$2 = ($$1 *)emu_dynamic_smem();/g' $< >$@.tmp
	@if grep -q '<<<' $@.tmp; then echo "$<: a launch the rewrite did not catch"; rm -f $@.tmp; exit 1; fi
	@mv $@.tmp $@
$(CUDA_EMU_OUT)/%.cu.o: $(CUDA_EMU_OUT)/src/%.cpp $(CUDA_EMU_DEPS)
	$(CXX) $(CUDA_EMU_CXXFLAGS) -include $(CUDA_EMU)/cuda_emu.h -c -o $@ $<
$(CUDA_EMU_OUT)/%.c.o: plugins/cuda/%.c $(CUDA_EMU_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CUDA_EMU_CFLAGS) -c -o $@ $<
$(CUDA_EMU_OUT)/emu_%.o: $(CUDA_EMU)/emu_%.cpp $(CUDA_EMU_DEPS)
	@mkdir -p $(dir $@)
	$(CXX) $(CUDA_EMU_CXXFLAGS) -I$(CUDA_EMU_OPENBLAS_INC) -c -o $@ $<
$(CUDA_EMU_OUT)/ctitan-cuda-emu.so: $(CUDA_EMU_KERNEL_OBJ) $(CUDA_EMU_HOST_OBJ) $(CUDA_EMU_RT_OBJ) plugins/cuda/exports.map
	$(CXX) -shared $(CUDA_EMU_SAN) -o $@ $(CUDA_EMU_KERNEL_OBJ) $(CUDA_EMU_HOST_OBJ) $(CUDA_EMU_RT_OBJ) \
	  $(CUDA_EMU_LIBS) -Wl,-z,nodelete -Wl,--version-script=plugins/cuda/exports.map
$(CUDA_EMU_OUT)/test_device_conformance: tests/unit/test_device_conformance.c core/host/devcheck.c \
  core/host/devcheck.h $(CUDA_EMU_DEPS)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -g -Wall -Wextra -Werror -D_GNU_SOURCE $(CUDA_EMU_SAN) -Isdk/include -Icore -o $@ \
	  tests/unit/test_device_conformance.c core/host/devcheck.c -lcmocka -ldl -lm
$(CUDA_EMU_OUT)/cross_check: $(CUDA_EMU)/cross_check.c $(CUDA_EMU_DEPS)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -g -Wall -Wextra -Werror -D_GNU_SOURCE $(CUDA_EMU_SAN) -Isdk/include -o $@ $< -ldl -lm
$(CUDA_EMU_OUT)/emu_graph_check: $(CUDA_EMU)/emu_graph_check.cpp $(CUDA_EMU_RT_OBJ) $(CUDA_EMU_DEPS)
	$(CXX) $(CUDA_EMU_CXXFLAGS) -I$(CUDA_EMU_OPENBLAS_INC) -o $@ $< $(CUDA_EMU_RT_OBJ) $(CUDA_EMU_LIBS)
.PHONY: cuda-emu
cuda-emu: $(CUDA_EMU_TESTED)
.PRECIOUS: $(CUDA_EMU_OUT)/src/%.cpp
