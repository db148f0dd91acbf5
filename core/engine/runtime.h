/* runtime.h: the model at run time: parameters (one allocation each for data, gradients and
 * optimizer states), activation arenas, the tape that records SDK ops and replays their backward,
 * and activation checkpointing per unit.
 *
 * Memory lifetimes (each a pool: device memory + the host descriptors that go with it). Units
 * run forward in order and backward in reverse, so activation memory is a stack:
 *   saved   activations kept from forward to backward, unit by unit (rt_unit_mark); a unit's are
 *           given back when its backward is done. Without a pipeline it is the one region of a
 *           microbatch: a fully checkpointed unit's forward runs above its kept output and is given
 *           back, a per-op checkpointed unit's forward runs there too and what it keeps moves down
 *           over its temporaries (runtime_keep_op_unit), and a unit's recompute and activation
 *           gradients go above its activations; during
 *           the unit's backward the region is in heap mode and the tape gives each tensor back at
 *           its last use (tape_drop_unread, tape_backward), so the region's size is the live peak.
 *   bgrads  the boundary gradients (a unit's input gradient), two at most (bgrads[u & 1])
 *   scratch under a pipeline: per-op checkpointed units' forward temporaries and the recompute
 *   grads   activation gradients where saved cannot take them (a pipeline: one arena shared by the
 *           microbatch contexts when no backward is split, else per context)
 *   offload.slot[2]  activation offload (offload.c): the packed activations of the offloaded blocks
 *           on the device, two at a time; the rest wait in host memory
 */
#ifndef CT_RUNTIME_H
#define CT_RUNTIME_H

#include "engine/observer.h"
#include "ctitan/comm.h"
#include "ctitan/device.h"
#include "ctitan/model.h"
#include "ctitan/quantizer.h"
#include "ctitan/strategy.h"

#include <stdio.h>

/* Each parameter's storage (data, grad, optimizer state) starts on a 64-byte boundary. */
static inline size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

/* A host tensor: the ABI descriptor plus what the tape needs. */
typedef struct rt_tensor {
    ct_tensor t;            /* first: plugins see &t */
    struct rt_tensor *base; /* a view's owner (shares data and grad) */
    int param;              /* parameters: index + 1 in runtime.params; 0 for activations */
    struct rt_memo *memo;   /* notes strategies keep on it (ct_builder.memo), valid in memo_pass only */
    int64_t memo_pass;
    struct rt_tensor *sac_next; /* per-op checkpointing: the next op output a block saved (from its
                                   output's, in op order) */
    struct pool *data_heap, *grad_heap; /* the pool in heap mode its data / gradient came from (NULL: none):
                                    given back there at its last use in backward (tape.c) */
    int64_t need_pass;           /* tape_drop_unread: read by the unit's backward */
    int seq;                     /* liveness.c: its allocation's index in the unit's pass (-1: none) */
    struct rt_tensor *alias;     /* a collective's copy: the tensor whose data it shares (no view: a
                                    gradient of its own) */
    struct tape_entry *last_bwd; /* tape_backward: the last op whose backward reads its data */
    int freed;                   /* liveness.c gave its data back: no op may read it */
    struct rt_tensor *docs;      /* token ids under block-causal attention: their rows' positions and document
                                    ids, int32 (2, B, T), and with rope_doc a third plane, each row's position in
                                    its document (3, B, T) (runtime_upload_tokens); NULL otherwise */
    struct rt_tensor *doc_view;  /* the document ids again, (B, T) on their own: ct_builder.doc_ids */
} rt_tensor;

typedef struct pool_chunk {
    char *base;
    size_t cap;    /* a region's: the address space reserved */
    size_t backed; /* a region's (device.h region_reserve): the bytes asked to be backed; 0: a block */
} pool_chunk;

typedef struct pool_mark {
    int cur;
    size_t top, used;
} pool_mark;

/* A hole: memory given back inside a pool's region above its heap mark (pool_free). */
typedef struct pool_hole {
    int chunk;
    size_t off, size;
} pool_hole;

#define POOL_MAX_HOLES 64 /* more at once: the smallest is forgotten until the region's release */

/* A bump allocator with marks. On a device with growable regions (ABI 2.8) its first chunk is a
 * region, backed as far as the top has reached: the pool grows in place and a pass holds its
 * extent, no more. Otherwise it grows by chunks and coalesces into one chunk at reset. Either way
 * steady state makes no allocation. Between pool_heap_begin and the release of a mark at or below it,
 * what was allocated since may be given back one allocation at a time (pool_free): a hole is
 * reused by later allocations (best fit) and one at the top lowers the top, so `used` (the
 * region's extent, holes included) is the memory the region really needs. The same allocations
 * and frees in the same order land at the same addresses every time. */
typedef struct pool {
    const ct_device_api *d;
    ct_device *dev; /* NULL: host memory (malloc) */
    ct_mem_category cat;
    pool_chunk *chunks;
    int n_chunks, cur;
    size_t top;
    size_t used, peak_used, cap_total;
    size_t high;       /* the largest `used` since the last reset (the pass's extent) */
    size_t first_chunk; /* the planner's: one first chunk this large (address space only), so a pass
                           runs as the runtime's steady state does, in one chunk */
    int shrinks;       /* how often pool_reset shrank its chunk (twice at most) */
    int no_region;     /* the device has no regions, or refused one: blocks */
    int heap;          /* pool_free allowed for what was allocated above heap_at */
    pool_mark heap_at;
    pool_hole holes[POOL_MAX_HOLES]; /* by chunk, then offset; none adjacent to another or to the top */
    int n_holes;
} pool;

#define POOL_MIN_CHUNK ((size_t)1 << 20) /* a pool's first chunk is at least this */
#define RT_PLAN_CHUNK ((size_t)1 << 40)  /* the planner's first chunks: address space, never touched */
void pool_init(pool *p, const ct_device_api *d, ct_device *dev, ct_mem_category cat);
void pool_destroy(pool *p);
void *pool_alloc(pool *p, size_t bytes);
pool_mark pool_get_mark(const pool *p);
void pool_release(pool *p, pool_mark m);
/* From now until the release of a mark at or below this point, allocations may be freed. */
void pool_heap_begin(pool *p);
/* Gives back `bytes` at ptr: one pool_alloc of that size made since pool_heap_begin. */
void pool_free(pool *p, void *ptr, size_t bytes);
/* Heap mode off; its holes stay taken until a release below them. */
void pool_heap_end(pool *p);
/* Empties the pool (its backing may shrink or become one chunk): CT_OK, or a status when the new
 * chunk cannot be had (the device's error set, if any). */
ct_status pool_reset(pool *p);
/* The bytes the pool holds once the same allocations repeat, from a pass that ran in one chunk:
 * its extent (at least the first chunk's minimum; 0 when it allocated nothing). */
size_t pool_steady_bytes(const pool *p);

typedef struct tape_entry tape_entry;

/* Where unit u's forward started in the saved arena; `held` while its activations are kept. A
 * unit's saved activations are given back when its backward is done and every later unit's
 * already were (backward runs in reverse, so the arena stays a stack). */
typedef struct rt_unit_mark {
    pool_mark data, desc;
    int held;
} rt_unit_mark;

/* A pair of pools: device data and host descriptors with the same lifetime. */
typedef struct arena {
    pool data, desc;
} arena;

/* Many ranks: the comm, the mesh and the strategies (all NULL on one rank). Strategies run in order
 * (tensor parallel first, then the data-parallel one); finish_backward in the reverse order. */
#define RT_MAX_STRATEGIES 8 /* the strategies of one run (engine/strategies.h): one per axis and a data-parallel one */
#define RT_MAX_LAYERS (RT_MAX_STRATEGIES + 1) /* the builder's layers: the strategies' and the quantizer's */
typedef struct runtime_dist {
    const ct_comm_api *capi;
    ct_comm *comm;
    const ct_mesh_info *mesh;
    const ct_strategy_api *st[RT_MAX_STRATEGIES];
    ct_strategy *strat[RT_MAX_STRATEGIES];
    int n_st;
    const int *unit_rank; /* pipeline parallel: the pp rank that runs each unit (NULL: this rank runs all) */
    int axis[RT_MAX_STRATEGIES]; /* st[k]'s mesh axis (ct_mesh_axis, CT_AXIS_EP, ...); -1: the data-parallel one */
} runtime_dist;

/* Time blocked in the tape's collectives over one mesh axis (and in strategies' custom ops that
 * report it), forward and backward. */
typedef struct runtime_axis_comm {
    double seconds, bwd_seconds;
    int64_t collectives;
} runtime_axis_comm;

/* compile.enable on a device with graph ops (ABI 1.5): one microbatch's forward and backward
 * captured once the arenas are steady, then launched as one graph per microbatch (runtime.c). */
typedef struct runtime_graph {
    int enabled;          /* the session allows it: one rank, no float8, the 1.5 loss ops */
    int failed;           /* a capture failed (why): eager from then on */
    char why[256];
    int eager_runs;       /* microbatches run eagerly at shape (B, T) */
    int64_t B, T;
    ct_graph *graph;      /* the device's graph, or NULL */
    void *at[4];          /* what it reads and writes: the uploads' and the loss's addresses ... */
    char *arena_base[5];  /* ... inside these arena chunks (saved, scratch, grads, both bgrads) */
    int64_t ops, captures, launches;
} runtime_graph;

enum { RT_AC_NONE, RT_AC_FULL, RT_AC_OP };

/* Activation offload (activation_offload.layers, offload.c): what blocks 1..n keep for their
 * backward goes to host memory after their forward and comes back before their backward, while
 * other units compute (device.h copy_async). On the device an offloaded unit's packed activations
 * live in one of two slots, not the saved arena: the unit after it computes while the slot is
 * copied out, and in backward the unit before it is copied in while it computes. */
typedef struct rt_offload_unit {
    void *host;          /* its host copy (host_alloc), kept from step to step */
    size_t host_cap;
    size_t bytes;        /* its packed activations this microbatch (0: not offloaded) */
    char *blob;          /* where they are on the device now (in slot `slot`), or where they were */
    int slot;            /* the slot holding them, -1 when only the host copy has them */
    int on_host;         /* the host copy is (being) written */
    uint64_t ticket;     /* the copy out, or the copy in while slot >= 0 and loading */
    int loading;         /* a copy in was queued and not waited for */
    int stayed;          /* asked to go, it could not (a custom op keeps state in its activations) */
} rt_offload_unit;

typedef struct rt_offload {
    int layers;            /* blocks offloaded (units 1..layers); 0: none */
    pool slot[2];          /* device memory for the packed activations of the units in flight */
    int tenant[2];         /* the unit whose activations a slot holds, -1: none */
    uint64_t slot_ticket[2]; /* the last copy that reads the slot (out) */
    int next_slot;         /* forward: the slot the next offloaded unit takes */
    rt_offload_unit *unit; /* per unit */
    double host_bytes;     /* host memory held for the copies */
    double step_bytes_out, step_bytes_in; /* copied this step (reported, then zeroed) */
} rt_offload;
enum { RT_SAC_OFF, RT_SAC_SAVE, RT_SAC_REUSE };

typedef struct runtime {
    const ct_device_api *d;
    ct_device *dev;
    const ct_model_api *m;
    ct_model *model;
    ct_model_desc desc;
    uint64_t seed;

    /* parameters, in declaration order: the full-shape handles the model uses, their placement
     * (slots) and views of this rank's local storage (what the optimizer updates) */
    rt_tensor **params;
    ct_param_slot *slots;
    ct_tensor *local;
    int *storage_order; /* parameter indices by storage offset: the weight-decayed ones, then the rest */
    int n_params;
    int64_t n_param_elems;      /* of the full model */
    char *param_mem, *grad_mem; /* local storage: one device allocation each */
    size_t param_bytes;         /* bytes of local storage (64-byte aligned per parameter) */
    runtime_dist dist;
    const ct_comm_api *coll_capi;          /* the tape's collectives (the counting table: bytes in the metrics) */
    runtime_axis_comm axis_comm[CT_MESH_NAXES];
    int in_backward;
    int cur_unit;          /* the unit whose forward or backward runs now, -1 outside */
    float *share_buf;      /* a shared parameter's gradient from another pipeline stage */
    struct rope_table *rope_tables; /* rope_freqs' frequency tables on the device (tape.c) */
    int64_t share_buf_n;
    int64_t seq_multiple;                  /* every sequence's length is a multiple of it (strategies') */
    int32_t doc_eos;       /* model.attn_mask_type block_causal: the EOS id that ends a document; -1: causal */
    const uint8_t *doc_starts; /* block_causal: the document starts (B, T) of the tokens given to the running
                                  runtime_forward_backward, runtime_forward_loss or pipeline_step, as the
                                  shard records them (dataloader_sequence_docs); NULL: after each EOS.
                                  Set by the session around that call only. */
    int rope_doc;          /* model.rope_positions document: RoPE at positions within each document */
    rt_tensor *cur_docs;   /* the (2 or 3, B, T) positions and document ids of the tokens unit_forward runs on */
    rt_tensor *cur_doc_ids; /* their document ids (B, T), what ct_builder.doc_ids returns */
    double attn_doc_len;   /* the planner: block-causal attention priced at documents this long (0: causal) */
    double comm_seconds;   /* wall time in strategy hooks and collectives (exposed communication) */
    const ct_quantizer_api *qapi; /* the quantizer of the linear layers (NULL: none), set before
                                     runtime_wrap_builder puts its layer (quantize.c) in the chain */
    ct_quantizer *quant;
    const char *quant_name;       /* its plugin's name, for the start-up report */
    float *bf16_shadow;         /* mixed_precision_param=bfloat16: bf16-rounded copies of the replicated
                                   parameters of the unit that runs (sharded ones: the strategy rounds its
                                   gather), as large as the largest unit's */
    size_t *shadow_off, shadow_bytes; /* parameter i's copy at bf16_shadow + shadow_off[i] (from its unit's start) */
    int shadow_on, shadow_unit;  /* runtime_use_shadow's switch; the unit whose copies the buffer holds (-1: none) */

    /* activation checkpointing: ac[u] is RT_AC_NONE, RT_AC_FULL (unit u recomputed in backward) or
     * RT_AC_OP (recomputed, but the outputs of its matmuls (every other one), attention and tp
     * reduce-scatters are saved in forward and reused: torchtitan's per-op policy) */
    int *ac;
    int sac_phase;       /* RT_SAC_SAVE in an RT_AC_OP unit's forward, RT_SAC_REUSE in its recompute */
    int sac_mm;          /* linears seen in this pass of the unit */
    rt_tensor *sac_head, *sac_tail; /* SAVE: the chain of saved outputs; REUSE: head = the next one */

    arena saved, scratch, grads;
    /* Units run forward in order and backward strictly in reverse, one microbatch at a time (no
     * pipeline). Then boundary gradients (a unit's input gradient, which outlives the unit's
     * backward) alternate between two pools: unit u's goes to bgrads[u & 1], emptied first, since
     * what it held (unit u+2's input gradient) died with unit u+1's backward. So two are live at
     * most, not one per unit. Both live from the first microbatch to runtime_free. */
    int in_order;
    pool bgrads[2];
    /* Under a pipeline whose schedule splits no backward: per unit, nonzero when its input gradient
     * stays with the microbatch (a stage's first unit: the gradient goes to the stage before); the
     * other units' input gradients alternate in bgrads as in order, since a B action runs its
     * stage's units back to back. NULL otherwise (owned by the pipeline). */
    const int *bgrad_keep;
    /* Under a pipeline whose schedule splits no backward (no I/W actions): the current microbatch
     * context's pool for its boundary gradients (received output gradients, input gradients to
     * send), while the unit-internal activation gradients go to the runtime's own grads arena,
     * shared by every context and given back after each unit's backward. NULL otherwise. */
    pool *bgrad_ctx;
    /* Where the tape puts activation gradients: the grads arena, or, in a unit's backward when
     * units are in_order, the saved arena above the unit's own
     * activations: one region, given back whole when the unit is done, so the arena's size is the
     * live peak, not the sum of three arenas' peaks. */
    pool *grad_pool;
    pool opscratch;      /* custom ops' temporaries (ct_builder.scratch), released when the callback returns */
    /* A custom op's backward inside a unit's backward in heap mode takes its scratch from the heap
     * region the unit's gradients go to (rt->grad_pool), given back when the callback returns, so it
     * shares memory with the unit's other backward temporaries instead of holding opscratch at its
     * largest: op_heap is that pool while the callback runs (NULL otherwise), op_heap_at what it
     * handed out. plan_bwd_scratch: the op's ct_op_cost.backward_scratch, from its plan. */
    pool *op_heap;
    struct {
        void *p;
        size_t bytes;
    } op_heap_at[8];
    int n_op_heap;
    double plan_bwd_scratch;
    int64_t memo_pass;   /* bumped at every unit forward: notes from an earlier pass are stale */
    /* per microbatch */
    rt_tensor **unit_in, **unit_out;
    tape_entry **unit_tape;
    rt_unit_mark *unit_mark;
    int recording;
    arena *act; /* where builder outputs go now */
    tape_entry *tail;
    ct_builder builder;  /* the host's ops */
    ct_builder *top;     /* what the pack calls: the host's, wrapped by each op-level strategy in order */
    ct_builder *layers[RT_MAX_LAYERS]; /* the wrapping layers (tape_layer_new), the quantizer's first */
    int n_layers;
    int64_t peak_act_bytes; /* live bytes of saved + scratch + grads at their worst */
    int64_t act_allocs;     /* activations made so far (a custom op's forward: did it return them all) */
    int64_t need_pass;      /* tape_drop_unread's passes */
    struct rt_live *live;   /* liveness.c: what a fully checkpointed unit's forward gives back when */
    /* bf16 compute (training.mixed_precision_param: bfloat16): with units in order a unit's saved
     * activations wait for its backward in bf16 (actpack.c: runtime_pack_unit after its forward,
     * runtime_unpack_unit before its backward), and linear_cross_entropy runs in blocks of rows */
    int bf16_compute;
    int pack_units;             /* 0 under a pipeline whose schedule splits backward (I then W): a
                                   unit's input half would expand it under a later unit's weight
                                   half, so its activations are rounded to bf16 in place instead,
                                   and no unit's backward gives memory back before it ends */
    struct rt_pack *unit_pack;  /* per microbatch, as unit_mark */
    rt_offload offload;
    runtime_graph graph;
    /* the planner (core/plan): the device is plan_null_device, nothing is computed or sent; the
     * tape's arenas count bytes as in training; with trace_ops set, each op of a forward pass is
     * appended to `trace` (plan_op) and each collective too, forward or backward */
    int planning, trace_ops;
    const rt_observer *observer; /* set by the planner: the tape tells it each op (engine/observer.h) */
    struct plan_trace *trace;
    float loss_scale;   /* the microbatch's d(loss)/d(loss sum): 1 / global valid tokens */
    struct rt_moe *moe; /* moe.c: the aux-loss sum and the MoE layers' counts on the device (NULL: none yet) */
} runtime;

/* The planner's runtime (after runtime_plan, on plan_null_device): storage carved from address
 * space, arenas and the builder as in training, the builder marked planning, each op told to
 * `observer`. CT_OK, or a status with
 * the error set. */
ct_status runtime_plan_start(runtime *rt, const rt_observer *observer);

/* Builds the runtime: declares the parameters, lets the strategy place them (dist may be NULL: one
 * rank), allocates this rank's storage and initialises it from `seed` (element i of a parameter
 * gets the same value whatever the layout). CT_OK; CT_ERR_INVALID when the model's declarations are
 * refused, its parameters and gradients would not fit the device's memory or the address-space limit
 * (checked before allocating) or its shared parameters are placed apart; another status on other
 * errors. On error the runtime is freed and the error set. */
ct_status runtime_init(runtime *rt, const ct_device_api *d, ct_device *dev, const ct_model_api *m, ct_model *model,
                       uint64_t seed, const runtime_dist *dist);
void runtime_free(runtime *rt);

/* Sets which units are checkpointed: mode "none" | "full" | "selective" with every Nth block, or
 * with "op" every block under the per-op policy.
 * CT_ERR_INVALID for a bad mode, or (mode "selective") a bad option. */
ct_status runtime_set_ac(runtime *rt, const char *mode, const char *option);
/* Uses bf16-rounded parameters in forward (fp32 master weights and gradients). */
ct_status runtime_enable_bf16_params(runtime *rt);
/* Before the forward passes of a step: the bf16 copies are to be made again from the weights. */
void runtime_begin_step(runtime *rt);

/* The passes below, and every runtime_* call returning a ct_status, give CT_OK or the status of what
 * failed (the device's, the comm's, a plugin's; CT_ERR_NOMEM for the arenas) with the error set
 * (ct_last_error; a device or comm plugin sets its own). */

/* One microbatch: tokens, targets (B,T) int32 on the host. Forward through every unit and backward,
 * with d(loss_sum)/d(loss) = loss_scale (1 / global valid tokens). Accumulates into parameter
 * gradients; *loss_sum receives the summed cross entropy of the microbatch. With graph.enabled,
 * the third microbatch of a shape is captured and every later one launches the graph. */
ct_status runtime_forward_backward(runtime *rt, const int32_t *tokens, const int32_t *targets, int64_t B,
                                   int64_t T, float loss_scale, int last_microbatch, double *loss_sum);
/* Forward only, nothing recorded and no gradient touched: the summed cross entropy of the microbatch
 * against targets (B,T) into *loss_sum, on every rank (under pipeline parallel each stage's output is
 * broadcast over the pp group, as for the logits below). */
ct_status runtime_forward_loss(runtime *rt, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T,
                               double *loss_sum);
/* Forward only: the logits (B, T, V) into host memory. */
ct_status runtime_forward_logits(runtime *rt, const int32_t *tokens, int64_t B, int64_t T, float *logits_out);

/* Declares and places the parameters without storage (the strategies' planning instances in dist);
 * CT_OK, CT_ERR_INVALID when the pack refuses its declarations, another status otherwise (the error
 * set). runtime_free releases it. */
ct_status runtime_plan(runtime *rt, const ct_device_api *d, ct_device *dev, const ct_model_api *m, ct_model *model,
                       const runtime_dist *dist);
ct_status runtime_zero_grads(runtime *rt);
/* Global L2 norm of all gradients over every rank (double accumulation). */
ct_status runtime_grad_norm(runtime *rt, double *norm);
ct_status runtime_scale_grads(runtime *rt, float s);

/* Host copies for tests and export: parameter i's full data or grad (numel floats; gathered from
 * the shards when sharded, a collective then). */
ct_status runtime_param_get(runtime *rt, int i, float *host, int grad);
ct_status runtime_param_set(runtime *rt, int i, const float *host);
/* n floats at host, from the pipeline stage that runs unit to every rank of this rank's pp group (in
 * place; the other stages' host contents are overwritten). A collective over pp; CT_OK at once without
 * pipeline parallel. */
ct_status runtime_stage_broadcast(runtime *rt, int unit, float *host, int64_t n);
/* The index of the parameter called name, or -1 (a lookup: no error set). */
int runtime_find_param(runtime *rt, const char *name);
/* Shared parameters (model.h's share): parameter i's index of the parameter it is a copy of, or -1;
 * and the name it is stored under (the declared parameter's: checkpoints and exports hold it once). */
int runtime_param_copy_of(const runtime *rt, int i);
const char *runtime_param_key(const runtime *rt, int i);
/* After the step's last backward: each copy's gradient becomes the sum over the parameter's uses
 * (a trade over the pp group when a use is on another stage), so the copies stay equal. */
ct_status runtime_sum_shared_grads(runtime *rt);
/* Each copy is placed like the parameter it copies (same local block): CT_OK, else the error set. */
ct_status runtime_check_shared(runtime *rt);

/* ---- pieces the pipeline runtime (pipeline.c) drives unit by unit ---- */
/* Forward of unit u from x (NULL for unit 0) without the strategies' hooks; *out = its output. */
ct_status runtime_unit_fwd(runtime *rt, int u, rt_tensor *x, rt_tensor *tokens, rt_tensor *targets, int record,
                           rt_tensor **out);
/* Backward of unit u without hooks: halves TAPE_BOTH, TAPE_INPUT, or TAPE_WEIGHT after TAPE_INPUT. */
ct_status runtime_unit_bwd(runtime *rt, int u, rt_tensor *tokens, rt_tensor *targets, int halves);
/* Runs hook `which` of every strategy (unit and last are ignored where the hook has none): CT_OK, or
 * the failing strategy's status. */
typedef enum rt_hook {
    HOOK_PRE_FORWARD, HOOK_POST_FORWARD, HOOK_PRE_BACKWARD, HOOK_POST_BACKWARD, HOOK_FINISH_BACKWARD
} rt_hook;
ct_status runtime_hook(runtime *rt, rt_hook which, int unit, int last);
/* Notes the activation arenas' live bytes now against the microbatch's peak (peak_act_bytes). */
void runtime_note_act_peak(runtime *rt);
/* bf16 compute: on, each unit's forward and backward run with bf16-rounded copies of its replicated
 * parameters, made when the unit starts (runtime_shadow_unit) into one buffer; off, every
 * parameter points at its f32 master again. */
void runtime_use_shadow(runtime *rt, int on);
ct_status runtime_shadow_unit(runtime *rt, int u);
rt_tensor *runtime_upload_ids(runtime *rt, const int32_t *ids, int64_t B, int64_t T);
/* The model's token ids (B, T): runtime_upload_ids, and under block-causal attention (doc_eos >= 0)
 * their positions and document ids beside them (rt_tensor.docs), from starts (B, T) when not NULL. */
rt_tensor *runtime_upload_tokens(runtime *rt, const int32_t *ids, const uint8_t *starts, int64_t B, int64_t T);
/* Document ids of tokens (B, T): 0 from each row's start, one more at each token that starts[] flags,
 * or with starts NULL after each `eos`; docs (B, T). With pos not NULL, also each token's position
 * within its document (B, T), from 0. */
void runtime_doc_ids(int32_t *docs, int32_t *pos, const int32_t *tokens, const uint8_t *starts, int64_t B,
                     int64_t T, int32_t eos);
ct_status runtime_reset_arenas(runtime *rt);
/* The gradient buffer of a unit boundary tensor (an output gradient a pipeline receives, an input
 * gradient it sends): in the context's own pool under bgrad_ctx, else as tape_grad. */
float *runtime_boundary_grad(runtime *rt, rt_tensor *t);

/* Saved activations held in bf16 between a unit's forward and its backward (actpack.c): the
 * per-unit records (one set per microbatch in flight: the runtime's, a pipeline context's), the
 * compaction after unit u's forward and the expansion before its backward: CT_OK, or a status
 * with the error set. */
struct rt_pack *runtime_pack_new(int n_units);
void runtime_pack_clear(struct rt_pack *p, int n_units);
ct_status runtime_pack_unit(runtime *rt, int u);
ct_status runtime_unpack_unit(runtime *rt, int u);
/* Where unit u's packed activations are, once runtime_pack_unit made them: their start moves to
 * `blob` (offload.c copied them there); the items and the output's packed copy follow. */
void runtime_pack_rebase(runtime *rt, int u, char *blob);

/* Activation offload (offload.c). runtime_offload_set: the first `layers` blocks offloaded (after
 * runtime_init; 0 turns it off). During unit u's packing:
 * runtime_offload_take returns device memory for its `bytes` of packed activations (NULL: the unit
 * is not offloaded; pack in the saved arena), runtime_offload_out queues their copy to the host
 * once they are packed. Before unit u's backward unpacks, runtime_offload_in brings u's and the
 * previous unit's back (waiting for copies queued earlier); after it, runtime_offload_prefetch
 * queues the copy of the unit two below. runtime_offload_reset: a new microbatch. Those returning a
 * ct_status give CT_OK or a status with the error set (ct_last_error). */
ct_status runtime_offload_set(runtime *rt, int layers);
/* The bytes the two offload slots hold now. */
static inline size_t runtime_offload_slots_used(const runtime *rt) {
    return rt->offload.slot[0].used + rt->offload.slot[1].used;
}
/* Whether unit u's activations are offloaded (a predicate). */
int runtime_offloads(const runtime *rt, int u);
char *runtime_offload_take(runtime *rt, int u, size_t bytes);
ct_status runtime_offload_out(runtime *rt, int u);
ct_status runtime_offload_in(runtime *rt, int u);
ct_status runtime_offload_prefetch(runtime *rt, int u);
void runtime_offload_reset(runtime *rt);
void runtime_offload_free(runtime *rt);
/* One line after the first step: the blocks offloaded, the host memory they take, and any block whose
 * activations had to stay (nothing when offload is off). */
void runtime_offload_report(const runtime *rt, FILE *f);

/* After a per-op checkpointed unit's forward in the saved arena from `from` (units in order): what
 * it keeps moves down over its temporaries, which are given back; *out becomes the kept copy of
 * the unit's output, chained to the kept outputs. CT_OK, or a status with the error set. */
ct_status runtime_keep_op_unit(runtime *rt, pool_mark from, rt_tensor **out);

/* The global shape of parameter i (the whole parameter's, when an axis strategy splits it). */
const int64_t *runtime_global_shape(const runtime *rt, int i);
/* Asks each op-level strategy to wrap the builder (after setup); rt->top is what the pack calls.
 * CT_OK, or a status with the error set. */
/* The mesh axes whose ranks hold different tokens of one microbatch, each of degree above 1: with
 * rows_only 0 the data-parallel ones (dp_replicate, dp_shard) and, always, those whose strategy splits
 * a sequence's rows (a sequence_multiple above 1: context parallel, sequence parallel). Their count. */
int runtime_token_axes(const runtime *rt, int axes[CT_MESH_NAXES], int rows_only);
ct_status runtime_wrap_builder(runtime *rt);
/* Element k of parameter i's block, flattened -> its index in the flattened global parameter. */
int64_t runtime_global_index(const ct_param_slot *sl, int64_t k);



#endif
