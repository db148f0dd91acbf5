# The schedule test loads plugins of another kind by path from the build's plugin folder.
TEST_CFLAGS_test_schedules += -DCT_BUILD_PLUGIN_DIR='"$(abspath $(BUILD))/plugins"'
