/* axisprobe_cp.c: axisprobe.c's strategy for the cp axis (tests/cli/strategy_list.sh loads both, so that
 * the list's order decides which wraps the other). */
#define AXISPROBE_AXIS CT_AXIS_CP
#define AXISPROBE_NAME "axisprobe_cp"
#include "axisprobe.c"
