/* runlock.h: one run per dump folder (a flock on job.dump_folder/.lock, released when the process
 * ends, however it ends). */
#ifndef CT_RUNLOCK_H
#define CT_RUNLOCK_H

#include <stddef.h>

/* Takes the folder's lock and writes "pid P on HOST (started T, run ID)" into it. 0, or -1 with one
 * line in err: "DUMP is in use by pid P on HOST (...); ..." when a live run holds it. */
int runlock_acquire(const char *dump, const char *run_id, char *err, size_t errlen);
/* Drops the lock (the process's end does too). */
void runlock_release(void);

#endif
