# The runner test loads the pp plugin by path from the build's plugin folder (CT_PP_PLUGIN=PATH: another build).
TEST_CFLAGS_test_pp_runner += -DCT_BUILD_PLUGIN_DIR='"$(abspath $(BUILD))/plugins"'
$(BUILD)/tests/test_pp_runner: $(BUILD)/plugins/ctitan-pp.so
