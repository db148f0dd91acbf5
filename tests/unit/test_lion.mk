# test_lion runs the SDK template's Lion (sdk/template/lion.c), built here as a plugin the way
# `make` builds the in-tree ones, through the build's CPU device plugin.
$(BUILD)/tests/lion/ctitan-lion.so: sdk/template/lion.c $(wildcard sdk/include/ctitan/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(PLUGIN_CFLAGS) $(PLUGIN_LDFLAGS) -o $@ $< $(PLUGIN_LIBS)
$(BUILD)/tests/test_lion: $(BUILD)/tests/lion/ctitan-lion.so
TEST_CFLAGS_test_lion += -DCT_LION_SO='"$(abspath $(BUILD))/tests/lion/ctitan-lion.so"' \
  -DCT_CPU_SO='"$(abspath $(BUILD))/plugins/ctitan-cpu.so"'
