/* commstats.h: counts the bytes each rank hands to the comm plugin, per collective, by giving
 * strategies a copy of the plugin's table whose functions count and forward. */
#ifndef CT_COMMSTATS_H
#define CT_COMMSTATS_H

#include "ctitan/comm.h"

enum { CS_ALL_REDUCE, CS_ALL_GATHER, CS_REDUCE_SCATTER, CS_BROADCAST, CS_ALL_TO_ALL, CS_SEND, CS_N };
extern int64_t g_comm_bytes[CS_N]; /* bytes this rank contributed (count x dtype size), since start */
extern const char *const commstats_names[CS_N];

/* Names a mesh group, so that traced collectives over it say their axis (others say "world"). */
void commstats_name_group(const ct_comm_group *g, const char *name);

/* The counting table wrapping `real` (one per process); while a trace window is open, each call is
 * also a trace event with args {kind, axis, bytes, async}. */
const ct_comm_api *commstats_wrap(const ct_comm_api *real);

#endif
