/* muon.h: the Muon optimizer's state, shared by muon.c (options, the update) and whole.c (the
 * whole matrix: gathering it across ranks, orthogonalising it, keeping this rank's part). */
#ifndef CT_MUON_H
#define CT_MUON_H

#include "ctitan/optimizer.h"

/* Scratch buffers on the device, each grown to the largest size a step asks for and kept. */
enum { BUF_U, BUF_SHARD, BUF_SPLIT, BUF_X, BUF_Y, BUF_A, BUF_B, N_BUFS };

typedef struct ct_optimizer { /* the ABI's opaque ct_optimizer */
    const ct_host *host;
    const ct_device_api *d;
    ct_device *dev;
    /* Muon, for the 2-D weights of linear layers */
    double momentum, weight_decay;
    int nesterov, moonlight; /* moonlight: adjust_lr = moonlight, else original */
    int64_t ns_steps;
    char *exclude;  /* muon_exclude: comma-separated patterns, separated by NULs in place */
    int n_exclude;
    /* AdamW, for everything else */
    double beta1, beta2, eps, adamw_weight_decay;
    /* from attach (NULL on one rank) */
    const ct_comm_api *capi;
    ct_comm *comm;
    const ct_mesh_info *mesh;
    float *buf[N_BUFS];
    int64_t cap[N_BUFS];
} muon;

/* buf[which] with room for n f32 (grown when smaller), or NULL with the error set. */
float *muon_buf(muon *o, int which, int64_t n);
/* The ranks a slot's shard_axis spans (a mesh axis, or ABI 2.3's flattened dp_shard x cp); 0 when
 * the mesh is unknown or the axis is not one. */
static inline int muon_axis_degree(const ct_mesh_info *m, int axis) {
    if (!m) return 0;
    if (axis >= 0 && axis < CT_MESH_NAXES) return m->degree[axis];
    if (axis == CT_AXIS_DP_SHARD_CP && CT_HAS_FIELD(m, ct_mesh_info, dp_shard_cp_size)) return m->dp_shard_cp_size;
    return 0;
}

/* Replaces this rank's part `u` (slot->local_numel values) of the momentum-updated matrix by its
 * part of the orthogonalised whole matrix: gathers the whole over the slot's shard and split axes,
 * runs Newton-Schulz on it (every rank alike), keeps this rank's part. */
ct_status muon_orthogonalise(muon *o, const ct_param_slot *slot, float *u);

#endif
