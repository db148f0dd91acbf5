# test_hf_pack_tables opens sdk/examples/qwen2's pack and tests/plugins/tied_head (a pack without a
# Hugging Face table) besides the tree's llama3.
$(BUILD)/tests/test_hf_pack_tables: $(BUILD)/examples/qwen2.so $(BUILD)/tests/plugins/ctitan-tied_head.so
TEST_CFLAGS_test_hf_pack_tables += -DQWEN2_SO='"$(abspath $(BUILD))/examples/qwen2.so"' \
  -DTIED_HEAD_SO='"$(abspath $(BUILD))/tests/plugins/ctitan-tied_head.so"'
