# test_qwen2_hf runs sdk/examples/qwen2's pack, built here like the tree's plugins (SDK headers only).
$(BUILD)/examples/qwen2.so: sdk/examples/qwen2/qwen2.c $(wildcard sdk/include/ctitan/*.h)
	@mkdir -p $(@D)
	$(CC) $(PLUGIN_CFLAGS) $(PLUGIN_LDFLAGS) -o $@ $< -lm
$(BUILD)/tests/test_qwen2_hf: $(BUILD)/examples/qwen2.so
TEST_CFLAGS_test_qwen2_hf += -DQWEN2_SO='"$(abspath $(BUILD))/examples/qwen2.so"'
