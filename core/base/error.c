/* error.c: the last error of each thread, and the message a plugin's own thread leaves for another. */
#include "base/error.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[2048];

/* A plugin may set its error on a thread of its own (an async writer, a comm's progress thread, a
 * device's stream thread) and fail a later call on the main thread. The thread-local buffer would
 * lose that message, so every message a plugin sets is also kept here with the thread that set it;
 * a thread with no message of its own takes (and so consumes) one another thread left. */
static struct {
    pthread_mutex_t lock;
    int pending; /* msg holds a message no other thread has taken yet */
    pthread_t setter;
    char msg[sizeof last_error];
} kept = {.lock = PTHREAD_MUTEX_INITIALIZER};

void ct_error_keep(void) {
    pthread_mutex_lock(&kept.lock);
    snprintf(kept.msg, sizeof kept.msg, "%s", last_error);
    kept.setter = pthread_self();
    kept.pending = 1;
    pthread_mutex_unlock(&kept.lock);
}

/* Only another thread's message counts: one this thread set is in its own buffer, or was cleared. */
static void error_take(void) {
    pthread_mutex_lock(&kept.lock);
    if (kept.pending && !pthread_equal(kept.setter, pthread_self())) {
        snprintf(last_error, sizeof last_error, "%s", kept.msg);
        kept.pending = 0;
    }
    pthread_mutex_unlock(&kept.lock);
}

const char *ct_last_error(void) {
    if (!last_error[0]) error_take();
    return last_error;
}

void ct_clear_error(void) {
    last_error[0] = 0;
    /* a message this thread set was seen here (or dropped on purpose) */
    pthread_mutex_lock(&kept.lock);
    if (kept.pending && pthread_equal(kept.setter, pthread_self())) kept.pending = 0;
    pthread_mutex_unlock(&kept.lock);
}

/* Formatted into a buffer of its own first, so an argument may be ct_last_error() itself. An error
 * is one line: text quoted from untrusted input (a parser's excerpt) may hold newlines. */
static void set_v(const char *fmt, va_list ap) {
    char msg[sizeof last_error];
    vsnprintf(msg, sizeof msg, fmt, ap);
    for (char *c = msg; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = ' ';
    memcpy(last_error, msg, sizeof msg);
}

void ct_set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_v(fmt, ap);
    va_end(ap);
}

ct_status ct_fail(ct_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_v(fmt, ap);
    va_end(ap);
    return st;
}
