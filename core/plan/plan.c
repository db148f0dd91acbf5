/* plan.c: the planner's context (one manifest's plugins and model) and the evaluation of a layout. */
#include "plan/plan.h"

#include "engine/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct plan_ctx {
    session s;
    manifest *mf;
};

const char *const plan_mem_names[PLAN_MEM_N] = {"params", "grads", "optimizer", "master", "fsdp_buffers", "tp_buffers",
                                                "pp_buffers", "activations", "transient", "float8", "logits", "overhead"};

int plan_open(plan_ctx **out, manifest *mf, char *err, size_t errlen) {
    plan_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    c->mf = mf;
    if (session_open(&c->s, mf, 0, 0) != CT_OK) {
        snprintf(err, errlen, "%s", "the manifest's plugins could not be opened (see above)");
        free(c);
        return -1;
    }
    *out = c;
    return 0;
}

void plan_close(plan_ctx *c) {
    if (!c) return;
    session_close(&c->s);
    free(c);
}

void plan_trace_free(plan_trace *t) {
    free(t->ops);
    free(t->units);
    memset(t, 0, sizeof *t);
}

int plan_layout_from_manifest(plan_ctx *c, int gpus, plan_layout *l, char *err, size_t errlen) {
    (void)c, (void)gpus, (void)l;
    snprintf(err, errlen, "plan_layout_from_manifest: not written yet");
    return -1;
}

int plan_eval(plan_ctx *c, const plan_layout *l, const hw_profile *hw, plan_result *r, char *err, size_t errlen) {
    (void)c, (void)l, (void)hw, (void)r;
    snprintf(err, errlen, "plan_eval: not written yet");
    return -1;
}

int plan_trace_layout(plan_ctx *c, const plan_layout *l, plan_trace *t, char *err, size_t errlen) {
    (void)c, (void)l, (void)t;
    snprintf(err, errlen, "plan_trace_layout: not written yet");
    return -1;
}
