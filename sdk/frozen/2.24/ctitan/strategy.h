/* ctitan/strategy.h: the parallel-strategy interface (plugin kind CT_KIND_STRATEGY).
 *
 * A strategy decides where each parameter lives (its placement) and acts around units, around
 * operations, or both. FSDP gathers a unit's parameters before its forward and reduce-scatters
 * their gradients after its backward; DDP all-reduces gradients (unit hooks). Tensor parallel
 * splits parameters and wraps the builder's ops with the collectives its plan implies (an
 * operation-level strategy: wrap_builder). The model never knows.
 *
 * Which strategies run, in which order: the list parallelism.strategies (ABI 2.22), by default
 * torchtitan's order: the ones serving the tp, cp and ep axes (parallelism.tp_strategy, created when
 * tensor_parallel_degree > 1; ABI 2.3: parallelism.cp_strategy, created when context_parallel_degree
 * > 1; ABI 2.17: parallelism.ep_strategy) and then the data-parallel one (parallelism.dp_strategy).
 * Each says what it serves (`serves`, ABI 2.22). The host calls the axis strategies' place() first,
 * in the list's order, then the data-parallel one's on the blocks they left (it comes last); every
 * hook runs in that order, finish_backward in the reverse one. Builders wrap in that order too: the
 * pack calls the outermost (the last strategy's), whose ops call the next one's, down to the host's. A cp rank's gradients are partial sums over its tokens: a data-parallel strategy
 * that shards over CT_AXIS_DP_SHARD_CP sums them in its reduce-scatter; the cp strategy sums over
 * cp the gradients of every other slot in its finish_backward.
 *
 * Life of a run (what a strategy gets, when):
 *   create(env)  -> place(slots)          : the strategy sets each slot's local size and offset
 *   host allocates local storage (parameter shard, its gradient, optimizer states; and, where place()
 *   asked for them, whole compute copies), initialises it from the seed
 *                                -> setup(slots) -> wrap_builder(host's builder)
 *   each step, for each of its gradient-accumulation passes (one microbatch; under pipeline parallel
 *   one pipeline pass over the schedule's microbatches):
 *     each microbatch: for units 0..n-1: pre_forward(u), forward, post_forward(u)
 *                      for units n-1..0: pre_backward(u), backward, post_backward(u, last)
 *     finish_backward()  (every reduction started so far complete; `last` was set on the step's
 *                         final pass only)
 *   then the host sums the gradients of shared parameters' copies, clips by the norm over every rank's
 *     local gradients, and runs the optimizer on local storage only -> post_step()
 *   after a checkpoint is loaded into local storage: post_step() again
 *   Pipeline parallel: each stage calls the hooks of its own units, per microbatch, in the order of
 *   the schedule's actions: a forward action runs pre_forward(u), forward, post_forward(u) for each
 *   of the stage's units in order; a backward action (B, or the input half I) runs pre_backward(u) and
 *   the backward for each unit in reverse order; post_backward(u, last) follows u's part of the action
 *   that completes u's weight gradient for that microbatch (B, or the weight half W), with last = 1
 *   on the step's final one for u. Under zero-bubble schedules the windows of two microbatches of one unit
 *   may overlap (pre_backward for microbatch 2 before post_backward for microbatch 1): a strategy
 *   keeps a unit's storage valid while any of its backward windows is open (count them).
 *   tests/cli/strategy_hooks.sh holds the host to this order on every schedule.
 *
 * The model computes with slot->param: a tensor whose `data` and `grad` the strategy must point at
 * valid memory from pre_forward/pre_backward until the matching post hook (or, for whole compute
 * copies, the host points them at whole_data/whole_grad for the whole run). The host's gradient
 * accumulation is `+=` into param->grad, so a fresh full-gradient buffer must be zeroed. Gradients
 * are SUMS over ranks: the host already divided the loss by the global token count, so a strategy
 * never averages. A gradient the backward would write where the strategy left param->grad NULL is an
 * error naming the tensor and the unit.
 *
 * Lifetimes: the env and the mesh it points to live until destroy; the slots array until destroy
 * (the host may not move it after setup); a builder returned by wrap_builder must live until
 * destroy.
 */
#ifndef CTITAN_STRATEGY_H
#define CTITAN_STRATEGY_H

#include "ctitan/abi.h"
#include "ctitan/comm.h"
#include "ctitan/device.h"
#include "ctitan/host.h"
#include "ctitan/model.h"
#include "ctitan/tensor.h"

/* Mesh axes in torchtitan's order; tp varies fastest over ranks. */
typedef enum ct_mesh_axis {
    CT_AXIS_PP = 0,
    CT_AXIS_DP_REPLICATE = 1,
    CT_AXIS_DP_SHARD = 2,
    CT_AXIS_CP = 3,
    CT_AXIS_TP = 4,
    CT_MESH_NAXES = 5
} ct_mesh_axis;

typedef struct ct_mesh_info {
    size_t struct_size;
    int world_rank, world_size;
    int degree[CT_MESH_NAXES];
    int coord[CT_MESH_NAXES];
    /* The groups belong to the host (split from the comm's world) and stay valid until every
     * strategy is destroyed; a strategy uses them and never frees them. */
    ct_comm_group *group[CT_MESH_NAXES]; /* comm group of the ranks that differ only on this axis */
    ct_comm_group *dp_group;             /* dp_replicate x dp_shard flattened (batch and loss reductions) */
    int dp_rank, dp_size;
    /* ABI 2.3: dp_shard x cp flattened, cp fastest (torchtitan's dp_shard_cp): what a data-parallel
     * strategy shards over when context parallel is on, so each cp rank keeps 1/(dp_shard x cp) of the
     * parameters, gradients and optimizer states and the reduce-scatter sums the cp ranks' partial
     * gradients too. rank = coord[DP_SHARD] * degree[CP] + coord[CP]. The group is NULL on one rank. */
    ct_comm_group *dp_shard_cp_group;
    int dp_shard_cp_rank, dp_shard_cp_size;
    /* ABI 2.17: expert parallel (parallelism.expert_parallel_degree), borrowed from dp_shard x cp as
     * torchtitan borrows it: the ep group is ep_size consecutive ranks of dp_shard_cp (ep_rank =
     * dp_shard_cp_rank % ep_size), which hold different experts and exchange tokens; the efsdp group is
     * the dp_shard_cp ranks with the same ep_rank (efsdp_rank = dp_shard_cp_rank / ep_size, efsdp_size =
     * dp_shard_cp_size / ep_size), which hold the same experts. ep_size is 1 without expert parallel
     * (efsdp is then dp_shard_cp). The groups are NULL on one rank. */
    ct_comm_group *ep_group;
    int ep_rank, ep_size;
    ct_comm_group *efsdp_group;
    int efsdp_rank, efsdp_size;
} ct_mesh_info;

/* ABI 2.3: a ct_param_slot.shard_axis value beyond the mesh axes: sharded over dp_shard_cp_group
 * (degree dp_shard_cp_size, this rank's block dp_shard_cp_rank). */
#define CT_AXIS_DP_SHARD_CP 5
/* ABI 2.17: beyond the mesh axes too. CT_AXIS_EP: a ct_param_slot.split_axis (split over ep_group,
 * split_parts ep_size, split_index ep_rank) and the axis of the builder's all_to_all_v. CT_AXIS_EFSDP: a
 * shard_axis (sharded over efsdp_group): a data-parallel strategy shards a slot split over CT_AXIS_EP
 * over efsdp, so its reduction sums the gradient over the ranks that hold the same experts. The host
 * refuses a slot split over CT_AXIS_EP that is sharded over any other axis, or replicated while
 * efsdp_size > 1. */
#define CT_AXIS_EP 6
#define CT_AXIS_EFSDP 7

/* Given at create. The env struct itself may be gone after create returns (copy it); every pointer
 * in it (dapi, dev, capi, comm, mesh, tp_plan) is the host's and stays valid until destroy. */
typedef struct ct_strategy_env {
    size_t struct_size;
    const ct_device_api *dapi;
    ct_device *dev;
    const ct_comm_api *capi; /* counts the bytes a strategy hands it (comm_bytes in the metrics) */
    ct_comm *comm;
    const ct_mesh_info *mesh;
    int bf16_compute; /* training.mixed_precision_param: bfloat16 -> gather and compute in bf16 values */
    /* gather the weights the quantizer converts (CT_TENSOR_QUANTIZED) as e4m3 with tensor-wide scales
     * from one all-reduced amax (torchao's float8 all-gather for FSDP) */
    int fp8_all_gather;
    /* The model pack's tensor-parallel plan (NULL: it has none) and its description. */
    const ct_tp_rule *tp_plan;
    const ct_model_desc *model;
    int64_t seq_len;  /* training.seq_len */
    int has_quantizer; /* a quantizer converts some linears: an op strategy that computes a linear
                          itself must leave those to the host's linear */
    /* ABI 2.1: 1 when the instance is made only to report its costs for this mesh (the planner):
     * dapi, dev, capi, comm and the mesh's groups are NULL; place() and report() are the only calls
     * before destroy. */
    int planning;
    /* ABI 2.6: 1 when the pipeline schedule splits a unit's backward into its input and weight
     * halves (zero bubble): a unit's backward windows may then stay open while other units run,
     * forward ones included, so what a strategy holds for a unit between its windows is held
     * across them (FSDP keeps no bf16 copy beside the f32 one then). */
    int split_backward;
} ct_strategy_env;

/* Placement of one parameter on this rank. */
#define CT_PLACE_REPLICATE 0 /* every rank holds all of it */
#define CT_PLACE_SHARD 1     /* flattened, this rank holds [offset, offset + local_numel), zero-padded */
#define CT_PLACE_NONE 2      /* another pipeline stage holds it; local_numel 0. Set by the host
                                before place(); a strategy leaves such slots alone */

/* The host hands place() and setup() an array of slots and every strategy steps through it by
 * slots[0].struct_size (CT_SLOT_AT), so a later minor may append fields. */
typedef struct ct_param_slot {
    size_t struct_size;
    ct_tensor *param; /* the model computes with param->data / param->grad */
    int unit;
    int64_t numel;    /* of the parameter as the model computes with it (the block left by splits) */
    /* set by place(): */
    int placement;
    int shard_axis;       /* the mesh axis sharded over (CT_AXIS_DP_SHARD for FSDP; CT_AXIS_DP_SHARD_CP, ABI 2.3) */
    int64_t local_numel;  /* elements this rank stores (padding included) */
    int64_t offset;       /* first element of the flattened parameter this rank stores */
    /* set by the host before setup(): the local storage */
    float *local_data, *local_grad;
    /* A split over a mesh axis, set by an axis strategy's place() (which runs before a data-parallel
     * strategy's): the model computes with block split_index of split_parts along dim split_dim of the
     * whole parameter (split_dim -1: whole). param->shape is that block's shape and `numel` its size,
     * which a data-parallel strategy then shards; global_shape is the whole parameter's (the host
     * fills it). The host initialises, checkpoints, exports and norms each block as the part of the
     * whole parameter that it is. */
    int split_axis;
    int split_dim, split_parts, split_index;
    int64_t global_shape[CT_MAX_DIMS];
    /* ABI 2.1: whole compute storage beside the placed one (ZeRO: the optimizer updates a shard, the
     * model computes with the whole block). place() sets `whole` to CT_WHOLE_DATA and/or
     * CT_WHOLE_GRAD; the host then allocates whole_data and/or whole_grad (numel f32 each), points
     * param->data / param->grad at them for the whole run and counts them as parameters / gradients
     * (the placed local_data is then counted as master weights). whole_data starts with the block's
     * values; the host zeroes whole_grad with the local gradients at each step. The strategy moves
     * gradients from whole to local storage (reduce-scatter) by finish_backward, and local data back
     * to whole (all-gather) in post_step. */
    uint32_t whole;
    float *whole_data, *whole_grad;
    /* ABI 2.1, set by the host: the slot whose parameter this one is a copy of (a shared parameter's
     * use in another unit, model.h's share), or -1. A strategy places a copy like any slot. */
    int copy_of;
} ct_param_slot;

#define CT_WHOLE_DATA 0x1u
#define CT_WHOLE_GRAD 0x2u

/* ABI 2.1: one collective a strategy issues per step, for the planner (ct_strategy_api.report). */
typedef enum ct_step_phase { CT_PHASE_FORWARD = 1, CT_PHASE_BACKWARD = 2, CT_PHASE_STEP = 3 } ct_step_phase;

typedef struct ct_comm_cost {
    size_t struct_size;
    int axis;            /* ct_mesh_axis it runs over */
    ct_collective kind;  /* CT_COLL_ALL_GATHER, CT_COLL_REDUCE_SCATTER, CT_COLL_ALL_REDUCE or (2.12)
                            CT_COLL_ALL_TO_ALL */
    int unit;            /* the unit it serves, -1 for the whole model */
    ct_step_phase phase;
    double bytes;        /* the size of the whole (gathered, or reduced) buffer, in bytes; an all-to-all:
                            one rank's send buffer */
    double count;        /* how many times per step */
    int overlapped;      /* 1: issued asynchronously, so it may hide behind compute */
} ct_comm_cost;

/* Filled by report. mem_bytes: this rank's peak bytes by ct_mem_category (index < 8) of what the
 * strategy allocates itself (gather buffers, gradient buckets); the host counts its own storage from
 * the placement. comms: the host's array of max_comms elements (step by comms->struct_size,
 * CT_AT); the strategy fills the first min(n, max_comms) and sets n_comms to n. */
typedef struct ct_strategy_report {
    size_t struct_size;
    int64_t mem_bytes[8];
    ct_comm_cost *comms;
    int max_comms;
    int n_comms;
} ct_strategy_report;

/* Slot i of an array handed over by the host, stepping by the host's element size. */
#define CT_SLOT_AT(slots, i) ((ct_param_slot *)((char *)(slots) + (size_t)(i) * (slots)->struct_size))

/* create's *s is the host's until destroy. The slots array handed to place and setup is the host's:
 * the same array at the same address for every hook, so a strategy may keep the pointer; the host
 * may free it (and the parameters) before destroy, so destroy must not read it. */
typedef struct ct_strategy_api {
    size_t struct_size;
    ct_status (*create)(const ct_host *host, const ct_strategy_env *env, ct_strategy **s);
    void (*destroy)(ct_strategy *s);
    ct_status (*place)(ct_strategy *s, ct_param_slot *slots, int n);
    ct_status (*setup)(ct_strategy *s, ct_param_slot *slots, int n, int n_units);
    ct_status (*pre_forward)(ct_strategy *s, int unit);
    ct_status (*post_forward)(ct_strategy *s, int unit);
    ct_status (*pre_backward)(ct_strategy *s, int unit);
    /* last_microbatch: the step's last backward (DDP reduces only then) */
    ct_status (*post_backward)(ct_strategy *s, int unit, int last_microbatch);
    ct_status (*finish_backward)(ct_strategy *s);
    /* Optional (NULL: acts around units only): an operation-level strategy wraps the builder. `out`
     * arrives with every op forwarding to `next` and ctx NULL; the strategy replaces the ops it
     * changes and sets out->ctx to its own state. Its ops call next's (`next->linear(next, ...)`) for
     * what they compute. Called once, after setup; `next` and `out` are the host's and live until
     * destroy. */
    ct_status (*wrap_builder)(ct_strategy *s, ct_builder *next, ct_builder *out);
    /* Optional: every sequence the host runs must have a multiple of this many tokens (sequence
     * parallel splits token rows over tp); the host pads a sampling prompt up to it. NULL: 1. */
    int64_t (*sequence_multiple)(ct_strategy *s);
    /* ---- ABI 2.1, optional ---- */
    /* After the optimizer's step (and after a checkpoint load) changed local storage: e.g. ZeRO's
     * all-gather of the updated shards into whole_data. */
    ct_status (*post_step)(ct_strategy *s);
    /* After place(), on a live or a planning instance: the strategy's own memory and the collectives
     * it issues per step with `n_microbatches` microbatches per step. A strategy that sets report
     * must accept env.planning; the host makes planning instances only of those. */
    ct_status (*report)(ct_strategy *s, int n_microbatches, ct_strategy_report *out);
    /* ---- ABI 2.22 ---- */
    /* What the strategy serves, which tells the host when to create it and where the ordered list
     * parallelism.strategies may put it: CT_SERVES_AXIS, the mesh axis `axis` (CT_AXIS_TP, CT_AXIS_CP,
     * CT_AXIS_EP, CT_AXIS_DP_REPLICATE or CT_AXIS_DP_SHARD; created where that axis's degree is > 1), or
     * CT_SERVES_DATA_PARALLEL, the data-parallel group (`axis` unused; created where it is named, after
     * every axis's strategy in the list). CT_SERVES_UNSAID (0, and every plugin built before 2.22): the
     * host takes it from the key that named the plugin (parallelism.tp_strategy: the tp axis, ...,
     * parallelism.dp_strategy: data parallel) and refuses the plugin as an item of parallelism.strategies
     * under any other name. */
    int serves;
    int axis;
} ct_strategy_api;

/* ABI 2.22: ct_strategy_api.serves. */
#define CT_SERVES_UNSAID 0
#define CT_SERVES_AXIS 1
#define CT_SERVES_DATA_PARALLEL 2

#endif
