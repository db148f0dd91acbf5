# Pipeline schedules: one shared object per .c file here (each schedule is its own plugin, named
# by its file: gpipe.c -> ctitan-schedule-gpipe.so), instead of one .so for the whole folder.
SKIP_schedules := 1
SCHEDULE_NAMES := $(basename $(notdir $(wildcard plugins/schedules/*.c)))
EXTRA_SOS += $(SCHEDULE_NAMES:%=$(BUILD)/plugins/ctitan-schedule-%.so)

$(BUILD)/plugins/ctitan-schedule-%.so: plugins/schedules/%.c $(wildcard plugins/schedules/*.h) \
    plugins/schedules/plugin.mk $(wildcard sdk/include/ctitan/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(PLUGIN_CFLAGS) $(PLUGIN_LDFLAGS) -o $@ $< $(PLUGIN_LIBS)
