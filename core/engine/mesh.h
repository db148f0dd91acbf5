/* mesh.h: the device mesh. Named axes in torchtitan's order (pp, dp_replicate, dp_shard, cp, tp;
 * tp varies fastest over ranks), one comm group per axis, and the flattened data-parallel and dp_shard x cp groups. */
#ifndef CT_MESH_H
#define CT_MESH_H

#include "ctitan/comm.h"
#include "ctitan/strategy.h"
#include "config/manifest.h"

extern const char *const mesh_axis_names[CT_MESH_NAXES];
/* Each axis's degree key in a manifest ("parallelism.tensor_parallel_degree"), by ct_mesh_axis: the
 * one place they are spelled. */
extern const char *const mesh_degree_keys[CT_MESH_NAXES];
/* Expert parallel's degree key: ep is not a mesh axis of its own (it is borrowed from dp_shard x cp). */
#define MESH_EP_DEGREE_KEY "parallelism.expert_parallel_degree"
/* The name ("tp", "ep", ...) and degree key of a mesh axis or CT_AXIS_EP, for messages and manifests; NULL
 * for any other axis. */
const char *mesh_axis_name(int axis);
const char *mesh_axis_degree_key(int axis);

/* The degree keys as read (engine/settings.h). */
typedef struct mesh_settings mesh_settings;

/* Checks that the degrees (ms, engine_settings_read's) multiply to world_size (dp_shard -1 takes what is
 * left): CT_OK, or CT_ERR_INVALID with the line naming the key where mf set it (nothing printed). */
ct_status mesh_degrees(const mesh_settings *ms, const manifest *mf, int world_size, int degree[CT_MESH_NAXES]);
/* Fills coordinates and creates the groups (a collective over the world). CT_ERR_INTERNAL when the
 * comm cannot make one: "comm: cannot create the tp group: " and the comm's message. */
ct_status mesh_build(ct_mesh_info *m, const ct_comm_api *c, ct_comm *comm, int world_rank, int world_size,
                     const int degree[CT_MESH_NAXES], int ep);
/* parallelism.expert_parallel_degree, checked against the degrees: it must divide dp_shard x cp, the
 * ranks it is borrowed from. CT_OK, or CT_ERR_INVALID with the line naming the key (nothing printed). */
ct_status mesh_ep_degree(const mesh_settings *ms, const manifest *mf, const int degree[CT_MESH_NAXES], int *ep);
void mesh_free(ct_mesh_info *m, const ct_comm_api *c, ct_comm *comm);

/* A shard axis (ct_param_slot.shard_axis: a mesh axis, the flattened CT_AXIS_DP_SHARD_CP, or ABI 2.17's
 * CT_AXIS_EP and CT_AXIS_EFSDP, both within dp_shard x cp): its
 * degree, its group (NULL on one rank or for a bad axis) and the mesh axes it spans as bits. */
int mesh_shard_degree(const ct_mesh_info *m, int axis);
ct_comm_group *mesh_shard_group(const ct_mesh_info *m, int axis);
unsigned mesh_axis_bits(int axis);

/* The job's world size from the launcher's environment (mpirun, srun, PMI); 1 when not launched. */
int mesh_env_world_size(void);

#endif
