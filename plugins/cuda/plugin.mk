# CUDA device plugin (ctitan-cuda.so): kernels in plugins/cuda/*.cu (nvcc), host code in
# plugins/cuda/*.c (cc, C11), linked with cuBLASLt, cuBLAS and the shared CUDA runtime. Built
# by its own rules (SKIP_cuda keeps the generic .c rule off it) into $(BUILD)/plugins/, objects
# under $(BUILD)/plugins/cuda-obj/. No sanitizer flags: under SANITIZE=1 the .so is the plain
# build (it loads into a sanitized host all the same).
#
# One architecture plus PTX keeps the build short on 2 cores: sm_90 code (H100/H200) and
# compute_90 PTX, which the driver compiles for newer GPUs at load. Override NVCC_ARCH for
# another GPU, e.g. NVCC_ARCH=-gencode=arch=compute_80,code=sm_80 for an A100.
NVCC ?= /usr/local/cuda/bin/nvcc
SKIP_cuda := 1
ifeq ($(wildcard $(NVCC)),)
$(info cuda: nvcc not found at $(NVCC); skipping the CUDA plugin)
else
CUDA_PLUGIN_HOME := $(patsubst %/bin/,%,$(dir $(NVCC)))
CUDA_PLUGIN_SO := $(BUILD)/plugins/ctitan-cuda.so
CUDA_PLUGIN_OBJDIR := $(BUILD)/plugins/cuda-obj
CUDA_PLUGIN_CU := $(wildcard plugins/cuda/*.cu)
CUDA_PLUGIN_C := $(wildcard plugins/cuda/*.c)
CUDA_PLUGIN_CU_OBJ := $(CUDA_PLUGIN_CU:plugins/cuda/%.cu=$(CUDA_PLUGIN_OBJDIR)/%.cu.o)
CUDA_PLUGIN_C_OBJ := $(CUDA_PLUGIN_C:plugins/cuda/%.c=$(CUDA_PLUGIN_OBJDIR)/%.c.o)
CUDA_PLUGIN_DEPS := $(wildcard plugins/cuda/*.h plugins/cuda/*.cuh sdk/include/ctitan/*.h) plugins/cuda/plugin.mk
NVCC_ARCH ?= -gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90,code=compute_90
# -Werror all-warnings: nvcc's own warnings (deprecations, unused) fail the build like gcc's.
CUDA_PLUGIN_NVCCFLAGS := -O2 -std=c++17 $(NVCC_ARCH) -Werror all-warnings \
  -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Werror -Isdk/include
CUDA_PLUGIN_CFLAGS := -std=c11 -Wall -Wextra -Werror -g -O2 -fno-strict-aliasing -fPIC -fvisibility=hidden \
  -D_GNU_SOURCE -Isdk/include -I$(CUDA_PLUGIN_HOME)/include
# nodelete: the CUDA runtime starts threads that outlive any call into the plugin.
CUDA_PLUGIN_LDFLAGS := -shared --cudart shared -L$(CUDA_PLUGIN_HOME)/lib64 \
  -Xlinker -rpath,$(CUDA_PLUGIN_HOME)/lib64 -Xlinker -z,nodelete \
  -Xlinker --version-script=plugins/cuda/exports.map
CUDA_PLUGIN_LIBS := -lcublasLt -lcublas -lcudart -lpthread -lm
EXTRA_SOS += $(CUDA_PLUGIN_SO)

$(CUDA_PLUGIN_CU_OBJ): $(CUDA_PLUGIN_OBJDIR)/%.cu.o: plugins/cuda/%.cu $(CUDA_PLUGIN_DEPS)
	@mkdir -p $(dir $@)
	$(NVCC) $(CUDA_PLUGIN_NVCCFLAGS) -c -o $@ $<

$(CUDA_PLUGIN_C_OBJ): $(CUDA_PLUGIN_OBJDIR)/%.c.o: plugins/cuda/%.c $(CUDA_PLUGIN_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CUDA_PLUGIN_CFLAGS) -c -o $@ $<

$(CUDA_PLUGIN_SO): $(CUDA_PLUGIN_CU_OBJ) $(CUDA_PLUGIN_C_OBJ) plugins/cuda/exports.map
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_ARCH) $(CUDA_PLUGIN_LDFLAGS) -o $@ $(CUDA_PLUGIN_CU_OBJ) $(CUDA_PLUGIN_C_OBJ) $(CUDA_PLUGIN_LIBS)
endif
