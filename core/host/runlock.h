/* runlock.h: one run per dump folder (a flock on job.dump_folder/.lock, released when the process
 * ends, however it ends). */
#ifndef CT_RUNLOCK_H
#define CT_RUNLOCK_H

#include "ctitan/abi.h"

/* Takes the folder's lock and writes "pid P on HOST (started T, run ID)" into it. CT_OK, or a status with
 * one line set (ct_last_error): "DUMP is in use by pid P on HOST (...); ..." when a live run holds it. */
ct_status runlock_acquire(const char *dump, const char *run_id);

/* Drops the lock (the process's end does too). */
void runlock_release(void);

#endif
