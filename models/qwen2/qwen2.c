/* qwen2.c: the Qwen2 pack of sdk/examples/qwen2, built in-tree as build/plugins/ctitan-qwen2.so so that
 * `ctitan convert` and model.flavor: from_checkpoint find the pack a Qwen2 folder's model_type names on
 * the plugin search path. The source is the example's: a third party builds the same file out of tree
 * with nothing but the SDK (tests/cli/qwen2.sh). */
#include "../../sdk/examples/qwen2/qwen2.c"
