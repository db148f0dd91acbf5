# The gradient check compiles plugins/cpu/kernels_impl.h itself (in double and in float).
TEST_CFLAGS_test_cpu_gradcheck += -Iplugins/cpu $(CPU_KERNEL_CFLAGS)
TEST_LIBS_test_cpu_gradcheck += $(CPU_KERNEL_LIBS)
# It includes the kernel templates: rebuild when they change.
$(BUILD)/tests/test_cpu_gradcheck: $(wildcard plugins/cpu/*.h)
