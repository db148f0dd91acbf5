/* liveness.h: the forward of a fully checkpointed unit, given back at each tensor's last use.
 *
 * Such a unit's forward runs twice a step, once to produce its output (recording nothing) and once
 * more, recorded, before its backward. Neither knows ahead which tensor is read last where, so each
 * would hold every tensor it makes until it ends. The recorded pass leaves a tape, and from it a
 * script: for every allocation of the pass (in order), its size, the op after which the forward no
 * longer reads it, and whether a backward does. Later passes over the same unit run the script: a
 * tensor goes back to its arena (in heap mode) right after its last reader, and in a recompute only
 * if no backward reads it. A pass whose allocations differ from the script's stops giving back and
 * the script is learned again; an op that reads a tensor the script gave back fails the step with a
 * message instead of computing from reused memory. The first step learns from the first forward
 * of each kind of unit (recorded): a unit with no script of its own runs the script of the last
 * unit with the same parameters, so only that first forward holds more; the arenas shrink to the
 * steady size two steps later (pool.c), and the planner learns in a first pass before the pass it
 * measures.
 */
#ifndef CT_LIVENESS_H
#define CT_LIVENESS_H

#include "engine/runtime.h"

typedef enum { LIVE_OFF, LIVE_FORWARD, LIVE_RECOMPUTE } live_mode;

/* Starts unit u's pass: numbers its allocations and ops, gives back per the unit's script (if it
 * has one). CT_OK, or CT_ERR_NOMEM. */
ct_status live_begin(runtime *rt, int u, live_mode mode);
/* Nonzero when the forward pass just begun has no script to run, neither its unit's nor that of
 * an earlier unit with the same parameters (live_begin lends it): the caller records it so that
 * live_end learns from it. So the first step's forwards give back as the later steps' do, but for
 * the first unit of each kind. */
int live_learning(const runtime *rt);
/* Ends the pass; a recompute (recorded), or a forward live_learning asked to record, learns the
 * unit's script from its tape (tail) unless the pass stopped early (bad). */
ct_status live_end(runtime *rt, int u, tape_entry *tail, rt_tensor *out, int bad);
/* The allocation of this pass t's data is (its owner's, or what a copy shares), or -1. */
int live_seq_of(const runtime *rt, const rt_tensor *t);
/* Hooks of the tape: a new activation of `bytes` bytes, and an op done (its inputs). */
void live_alloc(runtime *rt, rt_tensor *t, size_t bytes);
ct_status live_op(runtime *rt, rt_tensor *const *in, int n_in);
/* CT_OK unless one of in (n) was given back (then with a message). */
ct_status live_check(const runtime *rt, rt_tensor *const *in, int n);
/* The op counter (the tape entry of the op being recorded gets it), or -1 outside a pass. */
int live_op_index(const runtime *rt);
void live_free(runtime *rt);

#endif
