# the source is the SDK example's (qwen2.c includes it)
$(BUILD)/plugins/ctitan-qwen2.so: sdk/examples/qwen2/qwen2.c
