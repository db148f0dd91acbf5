# The placement test loads the tp strategy by path from the build's plugin folder.
TEST_CFLAGS_test_tp_place += -DCT_BUILD_PLUGIN_DIR='"$(abspath $(BUILD))/plugins"'
$(BUILD)/tests/test_tp_place: $(BUILD)/plugins/ctitan-tp.so
