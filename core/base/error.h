/* error.h: the core's one error convention. A function that can fail returns a ct_status (or NULL
 * for a pointer) and leaves its one-line message here with ct_set_error; the caller that reports it
 * reads ct_last_error(), and a caller that adds context wraps it (ct_set_error("%s: %s", path,
 * ct_last_error()) is allowed: the message is formatted before it is stored). Messages are per
 * thread; one a plugin sets on a thread of its own reaches the thread whose call fails
 * (ct_error_keep). */
#ifndef CT_BASE_ERROR_H
#define CT_BASE_ERROR_H

#include "ctitan/abi.h"

/* The detail of the last failure on this thread (a plugin's through its host table, or the core's). */
const char *ct_last_error(void);
/* Sets this thread's message: one line (control bytes become spaces). */
void ct_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* ct_set_error, then returns st: `return ct_fail(CT_ERR_IO, "%s: %s", path, strerror(errno));` */
ct_status ct_fail(ct_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ct_clear_error(void);
/* Keeps this thread's message for another thread too: a plugin may set its error on a thread of its
 * own and fail a later call on the main thread. */
void ct_error_keep(void);

#endif
