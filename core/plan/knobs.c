/* knobs.c: the search knobs the plugins declare (ABI 2.21, ct_plugin_info.knobs) as the planner holds
 * them. Each is one of a plugin's options with the values a search may give it; a layout carries a
 * copy of each (plan_setting: key, value, where it counts), so that it applies, prints and writes
 * itself without the planner knowing any plugin's key by name. */
#include "plan/plan.h"
#include "plan/plan_internal.h"

#include "host/host.h"

#include <stdio.h>
#include <string.h>

/* Adds the knobs of plugin p, whose options live in `section`: a strategy's on mesh axis `axis` (-1:
 * none), or the dense quantizer's (quantizer 1; enable_key is its switch). A knob past
 * PLAN_MAX_KNOBS is left out, and said in t->dropped. */
void plan_knobs_add(plan_knob_table *t, const plugin *p, const char *section, int axis, int quantizer,
                    const char *enable_key) {
    const ct_search_knob *list = p ? plugin_knobs(&p->info) : NULL;
    for (int i = 0; list && CT_AT(const ct_search_knob, list, i)->key; i++) {
        const ct_search_knob *k = CT_AT(const ct_search_knob, list, i);
        if (t->n == PLAN_MAX_KNOBS) {
            snprintf(t->dropped, sizeof t->dropped, "%s's knob %s", p->info.name, k->key);
            continue;
        }
        plan_setting *s = &t->k[t->n];
        memset(s, 0, sizeof *s);
        if (strchr(k->key, '.')) snprintf(s->key, sizeof s->key, "%s", k->key); /* another section's, whole */
        else snprintf(s->key, sizeof s->key, "%s.%s", section, k->key);
        snprintf(s->label, sizeof s->label, "%s", k->label ? k->label : "");
        s->axis = axis;
        s->quantizer = quantizer;
        s->enables = quantizer && enable_key && !strcmp(s->key, enable_key);
        snprintf(t->values[t->n], sizeof t->values[t->n], "%s", k->values);
        t->n++;
    }
}

/* The i-th of a knob's values ("a|b"), into out; 0 past the last. */
int plan_knob_value(const char *values, int i, char *out, size_t len) {
    const char *p = values;
    for (int j = 0; *p; j++) {
        size_t n = strcspn(p, "|");
        if (j == i) {
            snprintf(out, len, "%.*s", (int)n, p);
            return 1;
        }
        p += n + (p[n] == '|');
    }
    return 0;
}

static int axis_degree(const plan_layout *l, int axis) {
    switch (axis) {
    case CT_AXIS_DP_REPLICATE: return l->dp_replicate;
    case CT_AXIS_DP_SHARD: return l->dp_shard;
    case CT_AXIS_CP: return l->cp;
    case CT_AXIS_TP: return l->tp;
    case CT_AXIS_PP: return l->pp;
    case CT_AXIS_EP: return l->ep > 1 ? l->ep : 1;
    default: return 1;
    }
}

int plan_knob_applies(const plan_setting *k, const plan_layout *l) {
    if (k->quantizer) return k->enables || l->quant;
    return k->axis < 0 || axis_degree(l, k->axis) > 1;
}

void plan_layout_set_knob(plan_layout *l, int i, const char *value) {
    if (i < 0 || i >= l->n_knobs) return;
    snprintf(l->knob[i].value, sizeof l->knob[i].value, "%s", value);
    if (l->knob[i].enables) l->quant = !strcmp(value, "true");
}

int plan_knob_true(const plan_setting *k) { return !strcmp(k->value, "true"); }

/* The settings of the dense quantizer as one string: the quantizer is created again when it changes. */
void plan_knobs_quant_signature(const plan_layout *l, char *out, size_t len) {
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < l->n_knobs && at < len; i++)
        if (l->knob[i].quantizer && !l->knob[i].enables)
            at += (size_t)snprintf(out + at, len - at, "%s=%s;", l->knob[i].key, l->knob[i].value);
}
