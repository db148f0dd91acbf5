/* strategies.h: a run's parallel strategies as one ordered list.
 *
 * The order is the one they are applied in: each places its parameters after those before it, its
 * hooks run after theirs (finish_backward before), and it wraps the builder they wrapped, so the pack
 * calls the last one's ops first. parallelism.strategies gives the list (plugin names or paths, and
 * `dp`: the data-parallel strategy parallelism.dp_strategy picks); without it the list is torchtitan's
 * order: parallelism.tp_strategy, cp_strategy, ep_strategy, then `dp`. Each strategy says what it serves
 * (ct_strategy_api.serves, ABI 2.22); one that does not (built before 2.22) takes the role of the key
 * whose value it is, and the table in strategies.c that pairs those keys with roles is the one place the
 * core knows a strategy by name. An axis's strategy is created where that axis's degree is > 1, the
 * data-parallel one wherever it is listed.
 *
 * Errors: every function that can fail returns CT_ERR_INVALID with one line set (ct_last_error) naming
 * where the manifest set the key and what is expected; nothing is printed. */
#ifndef CT_STRATEGIES_H
#define CT_STRATEGIES_H

#include "ctitan/strategy.h"
#include "config/manifest.h"
#include "engine/runtime.h"
#include "engine/settings.h"

#define STRATEGY_LIST_KEY "parallelism.strategies"
#define SESSION_MAX_STRATEGIES RT_MAX_STRATEGIES

/* One strategy of the list. */
typedef struct strategy_item {
    char name[512];  /* the plugin's name or path, as the manifest gives it */
    const char *key; /* the key that named it (a static string): STRATEGY_LIST_KEY or an axis's *_strategy key */
    /* what it serves: CT_SERVES_AXIS (axis: CT_AXIS_*) or CT_SERVES_DATA_PARALLEL (axis -1); from the key
     * until strategy_resolve reads the plugin's own word; CT_SERVES_UNSAID while unknown */
    int serves, axis;
} strategy_item;

typedef struct strategy_list {
    strategy_item item[SESSION_MAX_STRATEGIES];
    int n;
    int listed; /* 1: from parallelism.strategies; 0: the default order */
} strategy_list;

/* The list a job of `world` ranks runs, from the keys as es holds them (engine_settings_read's, leniently
 * read: the manifest is validated after the plugins load; mf names a key in an error): without `with_dp` the data-parallel pick is left out (it needs the job's size). An explicit
 * list is checked here for what needs no plugin: items, duplicates, and that each *_strategy key the
 * manifest sets names an item. */
ct_status strategy_list_read(const engine_settings *es, const manifest *mf, int world, int with_dp,
                             strategy_list *out);

/* The role of item it once its plugin is loaded (api, whose name is `name`): the plugin's own (ABI 2.22),
 * which must agree with a key that named it, else the key's; an item of parallelism.strategies that
 * names a plugin saying nothing and is no key's value is refused. */
ct_status strategy_resolve(const manifest *mf, strategy_item *it, const ct_strategy_api *api, const char *name);

/* Once every item is resolved: one strategy per axis, at most one data-parallel one and after every
 * axis's. */
ct_status strategy_list_check(const manifest *mf, const strategy_list *l);

/* Against the mesh: every axis of degree > 1 that needs a strategy (tp, cp, ep) has one, and an explicit
 * list over several data-parallel ranks names a data-parallel strategy. */
ct_status strategy_list_cover(const manifest *mf, const strategy_list *l, const ct_mesh_info *mesh);

/* Whether item it is created on this mesh: the data-parallel one always, an axis's where its degree is > 1. */
int strategy_on_mesh(const strategy_item *it, const ct_mesh_info *mesh);

/* The data-parallel plugins parallelism.dp_strategy: auto picks from (fsdp, ddp): their options are
 * validated in every run. */
extern const char *const strategy_dp_auto[2];

/* The axis's name ("tp", "cp", "ep", ...), or NULL for one no strategy may serve; the key of its degree. */
const char *strategy_axis_name(int axis);
const char *strategy_degree_key(int axis);

#endif
