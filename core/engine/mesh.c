/* mesh.c: degrees from the manifest, coordinates, and one comm group per mesh axis. */
#include "engine/mesh.h"

#include "engine/settings.h"

#include "host/commstats.h"
#include "base/error.h"

#include <stdlib.h>
#include <string.h>

const char *const mesh_axis_names[CT_MESH_NAXES] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};

const char *const mesh_degree_keys[CT_MESH_NAXES] = {
    "parallelism.pipeline_parallel_degree", "parallelism.data_parallel_replicate_degree",
    "parallelism.data_parallel_shard_degree", "parallelism.context_parallel_degree",
    "parallelism.tensor_parallel_degree"};

int mesh_env_world_size(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS", "WORLD_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return 1;
}

ct_status mesh_degrees(const mesh_settings *ms, const manifest *mf, int world_size, int degree[CT_MESH_NAXES]) {
    char where[600];
    int64_t others = 1;
    for (int a = 0; a < CT_MESH_NAXES; a++) {
        int64_t v = ms->degree[a];
        if (v < 1 && !(a == CT_AXIS_DP_SHARD && v == -1)) {
            mf_where(mf, mesh_degree_keys[a], where, sizeof where);
            return ct_fail(CT_ERR_INVALID, "%s: a degree must be >= 1%s, got %lld", where,
                           a == CT_AXIS_DP_SHARD ? " (or -1: the ranks left over)" : "", (long long)v);
        }
        if (v > world_size && a != CT_AXIS_DP_SHARD) { /* one key at a time: the key that is wrong is named */
            mf_where(mf, mesh_degree_keys[a], where, sizeof where);
            return ct_fail(CT_ERR_INVALID, "%s: degree %lld is more than the job's %d ranks (launch with `ctitan "
                           "launch -n N`)", where, (long long)v, world_size);
        }
        degree[a] = (int)v;
        if (a == CT_AXIS_DP_SHARD) continue;
        others *= v; /* <= world_size squared: no overflow */
        if (others > world_size) {
            mf_where(mf, mesh_degree_keys[a], where, sizeof where);
            return ct_fail(CT_ERR_INVALID, "%s: with degree %lld the axes other than dp_shard already need %lld ranks, "
                           "more than the job's %d", where, (long long)v, (long long)others, world_size);
        }
    }
    if (degree[CT_AXIS_DP_SHARD] == -1) {
        if (world_size % others) {
            mf_where(mf, mesh_degree_keys[CT_AXIS_DP_SHARD], where, sizeof where);
            return ct_fail(CT_ERR_INVALID, "%s: -1 takes the ranks left over, but %d ranks do not divide by the other "
                           "degrees' product %lld", where, world_size, (long long)others);
        }
        degree[CT_AXIS_DP_SHARD] = (int)(world_size / others);
    }
    int64_t product = others * degree[CT_AXIS_DP_SHARD];
    if (product != world_size) {
        mf_where(mf, mesh_degree_keys[CT_AXIS_DP_SHARD], where, sizeof where);
        return ct_fail(CT_ERR_INVALID, "%s: pp %d x dp_replicate %d x dp_shard %d x cp %d x tp %d = %lld ranks, but the "
                       "job has %d (launch with `ctitan launch -n %lld` or mpirun -n %lld)", where, degree[0], degree[1],
                       degree[2], degree[3], degree[4], (long long)product, world_size, (long long)product,
                       (long long)product);
    }
    return CT_OK;
}

const char *mesh_axis_name(int axis) {
    if (axis == CT_AXIS_EP) return "ep";
    return axis >= 0 && axis < CT_MESH_NAXES ? mesh_axis_names[axis] : NULL;
}

const char *mesh_axis_degree_key(int axis) {
    if (axis == CT_AXIS_EP) return MESH_EP_DEGREE_KEY;
    return axis >= 0 && axis < CT_MESH_NAXES ? mesh_degree_keys[axis] : NULL;
}

ct_status mesh_ep_degree(const mesh_settings *ms, const manifest *mf, const int degree[CT_MESH_NAXES], int *ep) {
    static const char key[] = MESH_EP_DEGREE_KEY;
    char where[600];
    int64_t v = ms->ep, from = (int64_t)degree[CT_AXIS_DP_SHARD] * degree[CT_AXIS_CP];
    *ep = 1;
    if (v < 1 || from % v) {
        mf_where(mf, key, where, sizeof where);
        return ct_fail(CT_ERR_INVALID, "%s: expert parallel borrows its ranks from dp_shard x cp (%d x %d = %lld), "
                       "which degree %lld does not divide", where, degree[CT_AXIS_DP_SHARD], degree[CT_AXIS_CP],
                       (long long)from, (long long)v);
    }
    *ep = (int)v;
    return CT_OK;
}

ct_status mesh_build(ct_mesh_info *m, const ct_comm_api *c, ct_comm *comm, int world_rank, int world_size,
                     const int degree[CT_MESH_NAXES], int ep) {
    memset(m, 0, sizeof *m);
    m->struct_size = sizeof *m;
    m->world_rank = world_rank;
    m->world_size = world_size;
    int stride[CT_MESH_NAXES], s = 1;
    for (int a = CT_MESH_NAXES - 1; a >= 0; a--) {
        m->degree[a] = degree[a];
        stride[a] = s;
        s *= degree[a];
    }
    for (int a = 0; a < CT_MESH_NAXES; a++) m->coord[a] = (world_rank / stride[a]) % degree[a];
    m->dp_rank = m->coord[CT_AXIS_DP_REPLICATE] * degree[CT_AXIS_DP_SHARD] + m->coord[CT_AXIS_DP_SHARD];
    m->dp_size = degree[CT_AXIS_DP_REPLICATE] * degree[CT_AXIS_DP_SHARD];
    m->dp_shard_cp_rank = m->coord[CT_AXIS_DP_SHARD] * degree[CT_AXIS_CP] + m->coord[CT_AXIS_CP];
    m->dp_shard_cp_size = degree[CT_AXIS_DP_SHARD] * degree[CT_AXIS_CP];
    /* expert parallel: consecutive dp_shard_cp ranks (torchtitan's dp_shard_in_ep x cp) */
    m->ep_size = ep;
    m->ep_rank = m->dp_shard_cp_rank % ep;
    m->efsdp_size = m->dp_shard_cp_size / ep;
    m->efsdp_rank = m->dp_shard_cp_rank / ep;
    if (!c) return CT_OK; /* one rank: no groups */
    ct_comm_group *world;
    if (c->world(comm, &world) != CT_OK) return ct_fail(CT_ERR_INTERNAL, "comm: no world group: %s", ct_last_error());
    for (int a = 0; a < CT_MESH_NAXES; a++) {
        /* ranks that agree on every other axis form this axis's group, ordered by its coordinate */
        int color = world_rank - m->coord[a] * stride[a];
        if (c->split(comm, world, color, m->coord[a], mesh_axis_names[a], &m->group[a]) != CT_OK)
            return ct_fail(CT_ERR_INTERNAL, "comm: cannot create the %s group: %s", mesh_axis_names[a],
                           ct_last_error());
        commstats_name_group(m->group[a], mesh_axis_names[a]);
    }
    int dp_color = world_rank - m->coord[CT_AXIS_DP_REPLICATE] * stride[CT_AXIS_DP_REPLICATE] -
                   m->coord[CT_AXIS_DP_SHARD] * stride[CT_AXIS_DP_SHARD];
    if (c->split(comm, world, dp_color, m->dp_rank, "dp", &m->dp_group) != CT_OK)
        return ct_fail(CT_ERR_INTERNAL, "comm: cannot create the dp group: %s", ct_last_error());
    commstats_name_group(m->dp_group, "dp");
    int shard_cp_color = world_rank - m->coord[CT_AXIS_DP_SHARD] * stride[CT_AXIS_DP_SHARD] -
                         m->coord[CT_AXIS_CP] * stride[CT_AXIS_CP];
    if (c->split(comm, world, shard_cp_color, m->dp_shard_cp_rank, "dp_shard_cp", &m->dp_shard_cp_group) != CT_OK)
        return ct_fail(CT_ERR_INTERNAL, "comm: cannot create the dp_shard_cp group: %s", ct_last_error());
    if (c->split(comm, m->dp_shard_cp_group, m->efsdp_rank, m->ep_rank, mesh_axis_name(CT_AXIS_EP), &m->ep_group) != CT_OK ||
        c->split(comm, m->dp_shard_cp_group, m->ep_rank, m->efsdp_rank, "efsdp", &m->efsdp_group) != CT_OK)
        return ct_fail(CT_ERR_INTERNAL, "comm: cannot create the ep and efsdp groups: %s", ct_last_error());
    commstats_name_group(m->ep_group, mesh_axis_name(CT_AXIS_EP));
    commstats_name_group(m->efsdp_group, "efsdp");
    return CT_OK;
}

void mesh_free(ct_mesh_info *m, const ct_comm_api *c, ct_comm *comm) {
    if (!c) return;
    for (int a = 0; a < CT_MESH_NAXES; a++)
        if (m->group[a]) c->group_free(comm, m->group[a]);
    if (m->dp_group) c->group_free(comm, m->dp_group);
    if (m->ep_group) c->group_free(comm, m->ep_group);
    if (m->efsdp_group) c->group_free(comm, m->efsdp_group);
    if (m->dp_shard_cp_group) c->group_free(comm, m->dp_shard_cp_group);
    memset(m, 0, sizeof *m);
}

int mesh_shard_degree(const ct_mesh_info *m, int axis) {
    if (axis == CT_AXIS_DP_SHARD_CP) return m->dp_shard_cp_size;
    if (axis == CT_AXIS_EP) return m->ep_size > 1 ? m->ep_size : 1;
    if (axis == CT_AXIS_EFSDP) return m->ep_size > 1 ? m->efsdp_size : m->dp_shard_cp_size;
    return axis >= 0 && axis < CT_MESH_NAXES ? m->degree[axis] : 1;
}

ct_comm_group *mesh_shard_group(const ct_mesh_info *m, int axis) {
    if (axis == CT_AXIS_DP_SHARD_CP) return m->dp_shard_cp_group;
    if (axis == CT_AXIS_EP) return m->ep_group;
    if (axis == CT_AXIS_EFSDP) return m->efsdp_group;
    return axis >= 0 && axis < CT_MESH_NAXES ? m->group[axis] : NULL;
}

unsigned mesh_axis_bits(int axis) {
    /* ep and efsdp each span part of dp_shard x cp: a slot split over ep and sharded over efsdp is a
     * different block on every rank of dp_shard x cp */
    if (axis == CT_AXIS_DP_SHARD_CP || axis == CT_AXIS_EP || axis == CT_AXIS_EFSDP) return 1u << CT_AXIS_DP_SHARD | 1u << CT_AXIS_CP;
    return axis >= 0 && axis < CT_MESH_NAXES ? 1u << axis : 0;
}
