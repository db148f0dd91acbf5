/* strategies.c: the ordered list of a run's parallel strategies (strategies.h). */
#include "engine/strategies.h"

#include "base/error.h"
#include "engine/mesh.h"
#include "engine/settings.h"

#include <stdio.h>
#include <string.h>

/* torchtitan's order (tensor, context, expert, then data parallel), and the one place the core pairs a
 * strategy's key with what it serves: the role of a plugin that does not say (built before ABI 2.22).
 * Entry e's key, the one that names the plugin, is strategy_role_keys[e] (engine/settings.h). */
static const struct {
    const char *dflt; /* its default; NULL: the data-parallel pick (strategy_dp_name) */
    int serves, axis;
} default_order[STRATEGY_N_KEYS] = {
    [STRATEGY_KEY_TP] = {"tp", CT_SERVES_AXIS, CT_AXIS_TP},
    [STRATEGY_KEY_CP] = {"cp", CT_SERVES_AXIS, CT_AXIS_CP},
    [STRATEGY_KEY_EP] = {"ep", CT_SERVES_AXIS, CT_AXIS_EP},
    [STRATEGY_KEY_DP] = {NULL, CT_SERVES_DATA_PARALLEL, -1},
};
#define N_DEFAULT ((int)(sizeof default_order / sizeof default_order[0]))
#define DP_ITEM "dp" /* the list's item for the data-parallel pick */

const char *const strategy_dp_auto[2] = {"fsdp", "ddp"};

/* The data-parallel strategy the degrees pick when parallelism.dp_strategy is auto (fsdp, ddp or NULL). */
static const char *strategy_dp_name(const mesh_settings *ms, int world) {
    int64_t rep = 1, shard = -1, others = 1, cp = 1, v;
    static const int axes[] = {CT_AXIS_PP, CT_AXIS_CP, CT_AXIS_TP};
    const int64_t *deg = ms->degree;
    const int *has = ms->has_degree;
    if (has[CT_AXIS_DP_REPLICATE] && deg[CT_AXIS_DP_REPLICATE] >= 1) rep = deg[CT_AXIS_DP_REPLICATE];
    if (has[CT_AXIS_DP_SHARD]) shard = deg[CT_AXIS_DP_SHARD];
    for (int i = 0; i < 3; i++) /* not validated yet: capped past the world so nothing overflows */
        if (has[axes[i]] && (v = deg[axes[i]]) > 0)
            others = v > world || others * v > world ? world + 1 : others * v;
    if (rep > world) rep = world + 1;
    if (shard == -1) shard = world % (rep * others) ? 1 : world / (rep * others);
    if (has[CT_AXIS_CP] && deg[CT_AXIS_CP] > 1) cp = deg[CT_AXIS_CP];
    if (shard > 1 || cp > 1) return strategy_dp_auto[0];
    if (rep > 1) return strategy_dp_auto[1];
    return NULL;
}

/* parallelism.dp_strategy: a plugin, none (NULL), or auto: by the degrees as torchtitan picks (fsdp when
 * dp_shard > 1 or cp > 1, sharding over dp_shard x cp; ddp when only dp_replicate > 1; none on one
 * data-parallel rank without cp). */
static const char *dp_pick(const engine_settings *es, int world) {
    const char *name = es->strategies.role[STRATEGY_KEY_DP] ? es->strategies.role[STRATEGY_KEY_DP] : "auto";
    if (strcmp(name, "auto") != 0) return strcmp(name, "none") ? name : NULL;
    return strategy_dp_name(&es->mesh, world);
}

/* The plugin default_order entry e names (NULL: none). */
static const char *entry_name(const engine_settings *es, int e, int world) {
    if (!default_order[e].dflt) return dp_pick(es, world);
    return es->strategies.role[e] ? es->strategies.role[e] : default_order[e].dflt;
}

const char *strategy_axis_name(int axis) { return axis == CT_AXIS_PP ? NULL : mesh_axis_name(axis); }

const char *strategy_degree_key(int axis) { return mesh_axis_degree_key(axis); }

static void role_text(int serves, int axis, char *buf, size_t len) {
    if (serves == CT_SERVES_DATA_PARALLEL) snprintf(buf, len, "data parallel");
    else snprintf(buf, len, "the %s axis", strategy_axis_name(axis) ? strategy_axis_name(axis) : "?");
}

static ct_status item_add(strategy_list *l, const char *where, const char *name, size_t len, const char *key,
                          int serves, int axis) {
    if (l->n == SESSION_MAX_STRATEGIES)
        return ct_fail(CT_ERR_INVALID, "%s: more than %d strategies", where, SESSION_MAX_STRATEGIES);
    strategy_item *it = &l->item[l->n];
    if (len >= sizeof it->name) return ct_fail(CT_ERR_INVALID, "%s: a strategy's name or path is too long", where);
    memcpy(it->name, name, len);
    it->name[len] = 0;
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->item[i].name, it->name))
            return ct_fail(CT_ERR_INVALID, "%s: '%s' is listed twice (one strategy each)", where, it->name);
    it->key = key;
    it->serves = serves;
    it->axis = axis;
    l->n++;
    return CT_OK;
}

/* Each *_strategy key the manifest sets names an item of the explicit list: its value (an axis's key)
 * or the dp item (dp_strategy, which says what dp is). */
static ct_status keys_in_list(const engine_settings *es, const manifest *mf, const strategy_list *l, int has_dp,
                              const char *list_where) {
    char where[600];
    for (int e = 0; e < N_DEFAULT; e++) {
        const char *key = strategy_role_keys[e], *name = es->strategies.role[e];
        if (!es->strategies.role_set[e]) continue;
        int found = !default_order[e].dflt && has_dp;
        for (int i = 0; i < l->n && !found && default_order[e].dflt; i++) found = !strcmp(l->item[i].name, name);
        if (found) continue;
        mf_where(mf, key, where, sizeof where);
        return ct_fail(CT_ERR_INVALID, "%s: '%s' is not an item of parallelism.strategies (set at %s): %s, or leave "
                                       "this key out", where, name, list_where,
                       default_order[e].dflt ? "add it there" : "add dp there (the strategy this key picks)");
    }
    return CT_OK;
}

static ct_status empty_item(const char *where, const char *v) {
    return ct_fail(CT_ERR_INVALID, "%s: an empty item in '%.200s'; expected strategy plugins (names or paths) and dp, "
                                   "separated by commas", where, v);
}

ct_status strategy_list_read(const engine_settings *es, const manifest *mf, int world, int with_dp,
                             strategy_list *out) {
    char where[600];
    const char *v = es->strategies.list;
    memset(out, 0, sizeof *out);
    if (!v) {
        for (int e = 0; e < N_DEFAULT; e++) {
            const char *name = default_order[e].dflt || with_dp ? entry_name(es, e, world) : NULL;
            mf_where(mf, strategy_role_keys[e], where, sizeof where);
            if (name && item_add(out, where, name, strlen(name), strategy_role_keys[e], default_order[e].serves,
                                 default_order[e].axis))
                return CT_ERR_INVALID;
        }
        return CT_OK;
    }
    out->listed = 1;
    mf_where(mf, STRATEGY_LIST_KEY, where, sizeof where);
    int has_dp = 0;
    for (const char *p = v + strspn(v, " "); *p;) {
        size_t n = strcspn(p, ",");
        while (n && p[n - 1] == ' ') n--;
        if (!n) return empty_item(where, v);
        ct_status st = CT_OK;
        if (n == strlen(DP_ITEM) && !strncmp(p, DP_ITEM, n)) {
            const char *name = with_dp ? dp_pick(es, world) : NULL;
            if (has_dp++) return ct_fail(CT_ERR_INVALID, "%s: dp is listed twice", where);
            if (name) st = item_add(out, where, name, strlen(name), "parallelism.dp_strategy", CT_SERVES_DATA_PARALLEL, -1);
        } else {
            int e = 0; /* the role of an axis key whose value it is, for a plugin that does not say its own */
            while (e < N_DEFAULT && !(default_order[e].dflt && strlen(entry_name(es, e, world)) == n &&
                                      !strncmp(entry_name(es, e, world), p, n)))
                e++;
            st = item_add(out, where, p, n, STRATEGY_LIST_KEY, e < N_DEFAULT ? default_order[e].serves : CT_SERVES_UNSAID,
                          e < N_DEFAULT ? default_order[e].axis : -1);
        }
        if (st) return st;
        p += strcspn(p, ",");
        if (!*p) break;
        p += 1 + strspn(p + 1, " "); /* one comma: "a,,b" and "a," leave an empty item */
        if (!*p) return empty_item(where, v);
    }
    return keys_in_list(es, mf, out, has_dp, where);
}

ct_status strategy_resolve(const manifest *mf, strategy_item *it, const ct_strategy_api *api, const char *name) {
    char where[600], said[64], keyed[64];
    int serves = CT_SERVES_UNSAID, axis = -1;
    if (CT_HAS_FIELD(api, ct_strategy_api, axis)) {
        serves = api->serves;
        axis = api->axis;
    }
    mf_where(mf, it->key, where, sizeof where);
    if (serves == CT_SERVES_UNSAID) {
        if (it->serves != CT_SERVES_UNSAID) return CT_OK; /* the key's */
        return ct_fail(CT_ERR_INVALID, "%s: strategy '%s' does not say what it serves (ct_strategy_api.serves, ABI "
                                       "2.22): rebuild it setting serves and axis, or name it with "
                                       "parallelism.tp_strategy, cp_strategy or ep_strategy", where, name);
    }
    if (serves == CT_SERVES_DATA_PARALLEL) axis = -1;
    else if (serves != CT_SERVES_AXIS)
        return ct_fail(CT_ERR_INVALID, "%s: strategy '%s' says it serves %d; expected CT_SERVES_AXIS or "
                                       "CT_SERVES_DATA_PARALLEL", where, name, serves);
    else if (!strategy_axis_name(axis))
        return ct_fail(CT_ERR_INVALID, "%s: strategy '%s' says it serves mesh axis %d, which no strategy may serve "
                                       "(expected tp, cp, ep, dp_replicate or dp_shard)", where, name, axis);
    if (it->serves != CT_SERVES_UNSAID && (it->serves != serves || it->axis != axis)) {
        role_text(serves, axis, said, sizeof said);
        role_text(it->serves, it->axis, keyed, sizeof keyed);
        return ct_fail(CT_ERR_INVALID, "%s: strategy '%s' serves %s, not %s", where, name, said, keyed);
    }
    it->serves = serves;
    it->axis = axis;
    return CT_OK;
}

ct_status strategy_list_check(const manifest *mf, const strategy_list *l) {
    char where[600], a[64], b[64];
    for (int i = 0; i < l->n; i++)
        for (int j = 0; j < i; j++) {
            const strategy_item *x = &l->item[j], *y = &l->item[i];
            mf_where(mf, l->listed ? STRATEGY_LIST_KEY : y->key, where, sizeof where);
            role_text(x->serves, x->axis, a, sizeof a);
            role_text(y->serves, y->axis, b, sizeof b);
            if (x->serves == y->serves && x->axis == y->axis)
                return ct_fail(CT_ERR_INVALID, "%s: '%s' and '%s' both serve %s: one strategy each", where, x->name,
                               y->name, a);
            if (x->serves == CT_SERVES_DATA_PARALLEL)
                return ct_fail(CT_ERR_INVALID, "%s: '%s' (data parallel) comes before '%s' (%s): the data-parallel "
                                               "strategy shards what the axes' strategies leave, so it comes last",
                               where, x->name, y->name, b);
        }
    return CT_OK;
}

ct_status strategy_list_cover(const manifest *mf, const strategy_list *l, const ct_mesh_info *mesh) {
    char where[600];
    int has_dp = 0;
    for (int i = 0; i < l->n; i++) has_dp |= l->item[i].serves == CT_SERVES_DATA_PARALLEL;
    mf_where(mf, STRATEGY_LIST_KEY, where, sizeof where);
    for (int e = 0; e < N_DEFAULT; e++) {
        int axis = default_order[e].axis, found = 0;
        if (default_order[e].serves != CT_SERVES_AXIS || mesh_shard_degree(mesh, axis) <= 1) continue;
        for (int i = 0; i < l->n; i++) found |= l->item[i].serves == CT_SERVES_AXIS && l->item[i].axis == axis;
        if (!found)
            return ct_fail(CT_ERR_INVALID, "%s: no strategy serves the %s axis, whose degree (%s) is %d: add one "
                                           "(%s by default)", where, strategy_axis_name(axis),
                            strategy_degree_key(axis), mesh_shard_degree(mesh, axis), default_order[e].dflt);
    }
    if (l->listed && !has_dp && mesh->degree[CT_AXIS_DP_REPLICATE] * mesh->degree[CT_AXIS_DP_SHARD] > 1)
        return ct_fail(CT_ERR_INVALID, "%s: no data-parallel strategy, and the job has %d data-parallel ranks "
                                       "(dp_replicate %d x dp_shard %d): add dp (or fsdp, ddp ...)", where,
                       mesh->degree[CT_AXIS_DP_REPLICATE] * mesh->degree[CT_AXIS_DP_SHARD],
                       mesh->degree[CT_AXIS_DP_REPLICATE], mesh->degree[CT_AXIS_DP_SHARD]);
    return CT_OK;
}

int strategy_on_mesh(const strategy_item *it, const ct_mesh_info *mesh) {
    return it->serves == CT_SERVES_DATA_PARALLEL || mesh_shard_degree(mesh, it->axis) > 1;
}
