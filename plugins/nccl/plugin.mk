# NCCL comm plugin: NCCL and the CUDA runtime (C APIs, plain cc), MPI for the bootstrap. Skipped
# (not a build failure) on a machine without the CUDA toolkit's nccl.h.
ifeq ($(wildcard /usr/local/cuda/include/nccl.h),)
SKIP_nccl := 1
else
CFLAGS_nccl += -I/usr/local/cuda/include $(shell mpicc --showme:compile)
LIBS_nccl += -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lnccl -lcudart $(shell mpicc --showme:link)
# Never unmapped by dlclose: NCCL, the CUDA runtime and MPI start threads that outlive any call
# into the plugin, and unloading their libraries under them crashes the process at exit.
LIBS_nccl += -Wl,-z,nodelete
# Export ctitan_plugin_entry and nothing else.
LIBS_nccl += -Wl,--version-script=plugins/nccl/exports.map
endif
