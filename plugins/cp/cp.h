/* cp.h: the context-parallel strategy's state, shared by its files.
 *
 *   cp.c         the plugin: options, start-up checks, hooks, the gradient sum over cp, report
 *   ops.c        the builder it wraps: token rows, positions, RoPE, loss and output by sequence chunk
 *   attention.c  attention across the cp ranks: all-gather of K and V, or the ring (alltoall)
 *   ulysses.c    attention by heads instead (ulysses): q, k, v all-to-all'd to H/cp heads of the whole
 *                sequence, the next builder's causal attention, the output all-to-all'd back
 *
 * Block-causal attention (ABI 2.13, the builder's doc_ids): the document ids travel with the rows as
 * the positions do (attention.c); Ulysses needs nothing, its attention is the next builder's.
 *
 * Load-balanced causal sharding (torchtitan's): a sequence of T tokens is cut into 2 x cp chunks of
 * c = T / (2 cp) rows; cp rank i holds chunks i and 2cp-1-i, in that order, so every rank holds
 * T / cp rows and sees about the same number of causal (query, key) pairs. Everything outside
 * attention (embedding, RoPE, the loss, the output) works on those rows whichever method is chosen.
 *
 * context_parallel_rotate_method, per microbatch and layer, for local q (B, T/cp, H, D) and k, v
 * (B, T/cp, KVH, D) on cp ranks:
 *   allgather  K and V all-gathered (each rank receives (cp-1) B T/cp KVH D floats of each), dK and dV
 *              reduce-scattered in backward; exposed, one collective each.
 *   alltoall   the ring: the same K/V bytes in cp-1 hops (and dK/dV in cp), each hidden behind a
 *              block's attention; the most compute-bound choice where the hops hide.
 *   ulysses    four all-to-alls forward (q, k, v, the output) and four backward, each moving
 *              (cp-1)/cp of a rank's (B, T/cp, H or KVH, D) buffer, exposed; attention is one plain
 *              causal attention on H/cp heads of the whole sequence. Per step, in B T/cp D floats a
 *              rank moves: allgather 6 (cp-1) KVH, ulysses 4 (cp-1) (H + KVH) / cp, fewer from
 *              cp > 2 (H + KVH) / (3 KVH) on: from cp 2 without GQA, from cp 4 at H = 4 KVH. Needs
 *              n_heads and n_kv_heads (per tp rank under TP) divisible by cp.
 */
#ifndef CT_CP_PLUGIN_H
#define CT_CP_PLUGIN_H

#include "ctitan/strategy.h"

/* The positions of one local length, made once on the device and kept until destroy: rank r's rows
 * at pos + r * tl (tl entries each, rank-major), then the whole sequence 0..T-1 at pos + cp * tl. */
typedef struct cp_positions {
    int64_t tl;
    int32_t *pos;
    struct cp_positions *next;
} cp_positions;

/* A rope_freqs table (ABI 2.4, scaled RoPE) on the device, kept until destroy: a copy at every
 * forward would be refused inside a captured graph. Found by content. */
typedef struct cp_freqs {
    struct cp_freqs *next;
    float *dev;
    int64_t half;
    float host[];
} cp_freqs;

typedef struct ct_strategy { /* the ABI's opaque ct_strategy */
    const ct_host *host;
    ct_strategy_env env;
    ct_mesh_info mesh;
    int size, rank;      /* the cp axis: degree, this rank's coordinate */
    ct_comm_group *group;
    int ring;            /* context_parallel_rotate_method: alltoall (the ring) rather than allgather */
    int ulysses;         /* context_parallel_rotate_method: ulysses (heads over cp, ulysses.c) */
    int ulysses_said;    /* its one log line (rank 0, first attention) is out */
    int ring_overlap;    /* post each ring transfer before the compute it hides behind */
    ct_param_slot *slots;
    int n_slots;
    int last;            /* the step's last backward pass has run (post_backward's last_microbatch) */
    ct_builder *next;    /* the builder this one wraps (tp's, or the host's) */
    cp_positions *positions;
    int64_t positions_bytes;
    cp_freqs *freqs;
    /* the ring's transfers: time in flight, time in their waits and pokes (the hidden share, logged at destroy) */
    double ring_inflight_s, ring_blocked_s;
    int64_t ring_transfers;
} cp;

/* 1 on the planner's builder (ABI 2.2): ops run on shapes only, no device, no comm, no data. */
static inline int cp_planning(const ct_builder *b) { return CT_HAS_FIELD(b, ct_builder, planning) && b->planning; }

/* The device positions for local length tl (made on first use), or NULL with the error set. */
const int32_t *cp_positions_for(cp *c, int64_t tl);

/* Row chunks between a local (b, tl, e) tensor and the whole sequence's (b, cp * tl, e): rank r's two
 * chunks moved to / from their places (f32, or int32 moved as bytes). 0, or -1 with the error set. */
int cp_chunks_to_global(cp *c, void *global, const void *local, int r, int64_t b, int64_t tl, int64_t e, size_t elem);
int cp_chunks_to_local(cp *c, void *local, const void *global, int r, int64_t b, int64_t tl, int64_t e, size_t elem);

/* A failed device or comm call: 0 on CT_OK, else -1 with a message (when the callee left none). */
int cp_failed(cp *c, ct_status st, const char *what);

/* Replaces out's embedding, positions, rope, attention, cross entropy and finish_output (ops.c). */
void cp_builder_init(cp *c, ct_builder *next, ct_builder *out);

/* Attention of the local queries against every rank's keys (attention.c); NULL with the error set. */
ct_tensor *cp_attention(cp *c, ct_builder *b, ct_tensor *q, ct_tensor *k, ct_tensor *v);

/* The same by heads (ulysses.c): q (B, Tl, H, D), k and v (B, Tl, KVH, D), shapes checked, H and KVH
 * divisible by cp; the output (B, Tl, H, D) through b's collectives, custom ops and attention. NULL
 * with the error set. */
ct_tensor *cp_ulysses_attention(cp *c, ct_builder *b, ct_tensor *q, ct_tensor *k, ct_tensor *v);

/* Adds a collective a custom op runs inside, over the cp axis (bytes: the whole f32 buffer). */
void cp_plan_comm(ct_op_cost *cost, int kind, int phase, int overlapped, double elems, int calls);

#endif
