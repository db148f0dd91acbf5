# ZeRO: one source, two plugins (ctitan-zero1.so, ctitan-zero2.so) picked by
# parallelism.dp_strategy: zero1 | zero2; ZERO_STAGE selects the stage at compile time.
SKIP_zero := 1
EXTRA_SOS += $(BUILD)/plugins/ctitan-zero1.so $(BUILD)/plugins/ctitan-zero2.so

$(BUILD)/plugins/ctitan-zero%.so: plugins/zero/zero.c plugins/zero/plugin.mk $(wildcard sdk/include/ctitan/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(PLUGIN_CFLAGS) -DZERO_STAGE=$* $(PLUGIN_LDFLAGS) -o $@ $< $(PLUGIN_LIBS)
