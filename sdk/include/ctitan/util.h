/* ctitan/util.h: small helpers that plugins would otherwise each write again.
 *
 * Header-only: every function is static inline, so nothing here crosses the plugin boundary and the
 * header is no part of the ABI (no struct of its own, no symbol, no version). A plugin may include
 * it or not; a plugin built against a frozen SDK (sdk/frozen/) does without it. It depends on libc
 * and the other SDK headers only.
 *
 *   ct_util_now                  monotonic seconds, for timing a piece of work
 *   ct_util_splitmix64           splitmix64 of one value: a counter-based stream (value i of stream
 *                                key is ct_util_splitmix64(key ^ ct_util_splitmix64(i)), as the host
 *                                draws parameters and data order)
 *   ct_util_splitmix64_next      the sequential generator: the next value of the stream *state
 *   ct_util_unit_noop            a strategy's unit hook that does nothing (pre_forward, ...)
 *   ct_util_use_local_storage    setup() of a strategy whose model computes on local storage
 *   ct_util_report_clear         report(): no memory of its own, no collective yet
 *   ct_util_report_comm          report(): appends one collective, counted even past max_comms
 */
#ifndef CTITAN_UTIL_H
#define CTITAN_UTIL_H

#include "ctitan/abi.h"
#include "ctitan/strategy.h"

#include <stdint.h>
#include <string.h>
#include <time.h>

/* Monotonic seconds (clock_gettime(CLOCK_MONOTONIC)): only differences mean anything. Declared where
 * <time.h> declares CLOCK_MONOTONIC, which under -std=c11 needs POSIX: define _POSIX_C_SOURCE
 * 199309L (or later, or _GNU_SOURCE) before the first #include of the file. */
#if defined(CLOCK_MONOTONIC)
static inline double ct_util_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#endif

/* splitmix64 (Steele, Lea and Flood): x advanced by the golden-ratio increment, then mixed. Every
 * output bit depends on every input bit, so consecutive counters give independent-looking values. */
static inline uint64_t ct_util_splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The sequential splitmix64 generator: the next value of the stream whose state is *state (any
 * 64-bit seed), which it advances. */
static inline uint64_t ct_util_splitmix64_next(uint64_t *state) {
    uint64_t r = ct_util_splitmix64(*state);
    *state += 0x9E3779B97F4A7C15ull;
    return r;
}

/* ---- strategies (strategy.h) ---- */

/* A unit hook (pre_forward, post_forward, pre_backward) with nothing to do. */
static inline ct_status ct_util_unit_noop(ct_strategy *s, int unit) {
    (void)s;
    (void)unit;
    return CT_OK;
}

/* What setup() of a strategy that leaves each parameter whole on this rank, or a block of it, does:
 * the model computes on the slot's local storage, except where the host already pointed the
 * parameter at whole compute storage (ZeRO's, ABI 2.1). A data-parallel strategy placed after this
 * one may repoint them in its own setup. */
static inline void ct_util_use_local_storage(ct_param_slot *slots, int n) {
    int whole = n > 0 && CT_HAS_FIELD(slots, ct_param_slot, whole_grad);
    for (int i = 0; i < n; i++) {
        ct_param_slot *s = CT_SLOT_AT(slots, i);
        if (!whole || !s->whole_data) s->param->data = s->local_data;
        if (!whole || !s->whole_grad) s->param->grad = s->local_grad;
    }
}

/* The start of report(): no memory of the strategy's own and no collective counted yet. */
static inline void ct_util_report_clear(ct_strategy_report *r) {
    memset(r->mem_bytes, 0, sizeof r->mem_bytes);
    r->n_comms = 0;
}

/* Appends one collective to a report: written while there is room (stepping by the host's element
 * size, of which only the fields both sides know are written), counted in n_comms either way. */
static inline void ct_util_report_comm(ct_strategy_report *r, int axis, ct_collective kind, int unit,
                                       ct_step_phase phase, double bytes, double count, int overlapped) {
    if (r->comms && r->n_comms < r->max_comms) {
        ct_comm_cost *c = (ct_comm_cost *)((char *)r->comms + (size_t)r->n_comms * r->comms->struct_size);
        size_t size = r->comms->struct_size; /* the host's element size */
        ct_comm_cost v = {sizeof v, axis, kind, unit, phase, bytes, count, overlapped};
        memcpy(c, &v, size < sizeof v ? size : sizeof v);
    }
    r->n_comms++;
}

#endif
