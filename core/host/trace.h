/* trace.h: the profiler's Chrome trace (host ranges, device ops, collectives, memory counters),
 * recorded only while a profiling window is open, and the memory ledger behind memory snapshots. */
#ifndef CT_TRACE_H
#define CT_TRACE_H

#include "ctitan/host.h"

#include <stddef.h>
#include <stdint.h>

/* Sets the clock and whether recording is allowed at all (profiling.enable_profiling). */
void trace_enable(int on);
/* Opens or closes recording (a profiling window) without restarting the clock; returns whether it
 * was open (the planner pauses it: its units' names die with its model). */
int trace_set_on(int on);
int trace_active(void); /* recording now: callers skip building an event's arguments otherwise */
double trace_now_us(void);
void trace_begin(const char *name);
void trace_end(const char *name);
/* A complete event from t0_us to now; args is a JSON object's text (or NULL). Names and args are
 * copied: a caller's buffer may be reused at once. */
void trace_complete(const char *name, const char *cat, double t0_us, const char *args);
/* The memory counters by category (a "C" event), when they changed since the last sample. */
void trace_mem_sample(void);
/* Writes this rank's events (pid = rank, with its process_name) and forgets them. CT_OK, or a status
 * with the error set (as trace_merge and memsnap_write). */
ct_status trace_write_rank(const char *path, int rank);
/* Joins the per-rank files dir/rank<R>_trace.json (R < world) into `path`, one process each. */
ct_status trace_merge(const char *path, const char *dir, int world);
void trace_discard(void);

/* ---- the memory ledger: live bytes by (category, owner), always equal to g_mem's counters ---- */
/* Charges delta bytes of cat to owner (NULL: the core's name for the category: "parameters",
 * "gradients", "activations", ...). */
void memledger_note(ct_mem_category cat, const char *owner, int64_t delta);
/* Stops (1) or resumes (0) the ledger, as the planner sets g_mem back after its trial runs; returns
 * whether it was paused. */
int memledger_pause(int paused);
/* Arms the peak capture: from now on, each new peak total copies the ledger, until memsnap_freeze. */
void memsnap_arm(void);
void memsnap_freeze(void);
/* Writes the ledger at the peak between memsnap_arm and memsnap_freeze as JSON. Entries owned by "parameters"
 * or "gradients" are split by tensor with names[i] / bytes[i] (n of them). */
ct_status memsnap_write(const char *path, int rank, int64_t step, const char *const *names, const int64_t *bytes,
                        int n);

#endif
