# The planner's questions to the shipped plugins: loads them by path from the build's plugin folder
# (and the SDK template's Lion, built by test_lion.mk) and runs them on the CPU device.
TEST_CFLAGS_test_plan_plugins += -DCT_BUILD_PLUGIN_DIR='"$(abspath $(BUILD))/plugins"' \
  -DCT_LION_SO='"$(abspath $(BUILD))/tests/lion/ctitan-lion.so"'
TEST_LIBS_test_plan_plugins += -lm
$(BUILD)/tests/test_plan_plugins: $(addprefix $(BUILD)/plugins/ctitan-,$(addsuffix .so,cpu tp fsdp ddp zero1 zero2 \
  float8 adamw muon)) $(BUILD)/tests/lion/ctitan-lion.so
