# CPU plugin flags. The Makefile already links OpenBLAS (OpenMP build) and -fopenmp.
# CPU_KERNEL_CFLAGS is also what tests/unit/test_cpu_gradcheck.mk compiles kernels_impl.h with.
#   -I...openblas-openmp   cblas.h of the OpenBLAS build we link
#   -fno-trapping-math     lets GCC if-convert the clamps in cpu_expf, so the exp loops
#                          (softmax, cross-entropy, SiLU, GELU) vectorise
#   -fvect-cost-model=dynamic  vectorises those loops at -O2 as well
CPU_OPENBLAS_INC := /usr/include/x86_64-linux-gnu/openblas-openmp
CPU_KERNEL_CFLAGS := -I$(CPU_OPENBLAS_INC) -fopenmp -fno-trapping-math -fvect-cost-model=dynamic
CPU_KERNEL_LIBS := -L$(OPENBLAS_DIR) -Wl,-rpath,$(OPENBLAS_DIR) -lopenblas -fopenmp -lm
CFLAGS_cpu += $(CPU_KERNEL_CFLAGS)
# Never unmapped by dlclose: libgomp's and OpenBLAS's worker threads outlive any call into the
# plugin, and unloading the libraries under them crashes the process at exit.
LIBS_cpu += -Wl,-z,nodelete
# Export ctitan_plugin_entry and nothing else (the ifunc dispatchers of the multiversioned kernels
# would otherwise leak out; see exports.map).
LIBS_cpu += -Wl,--version-script=plugins/cpu/exports.map
