# MPI comm plugin: OpenMPI's compile and link flags (libopenmpi-dev). When mpicc is absent the
# plugin is skipped rather than failing the whole build.
ifeq ($(shell command -v mpicc 2>/dev/null),)
SKIP_mpi := 1
else
CFLAGS_mpi += $(shell mpicc --showme:compile)
LIBS_mpi += $(shell mpicc --showme:link)
endif
# Never unmapped by dlclose: MPI_Init starts progress threads (PMIx, libevent) that outlive any
# call into the plugin, and unloading libmpi under them crashes the process at exit.
LIBS_mpi += -Wl,-z,nodelete
# Export ctitan_plugin_entry and nothing else.
LIBS_mpi += -Wl,--version-script=plugins/mpi/exports.map
