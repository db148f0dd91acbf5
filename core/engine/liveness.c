/* liveness.c: a fully checkpointed unit's forward, given back at each tensor's last use
 * (liveness.h). */
#include "engine/liveness.h"

#include "engine/tape.h"
#include "host/host.h"

#include <stdlib.h>
#include <string.h>

typedef struct live_script {
    int n_allocs, n_ops;
    int64_t *bytes;    /* per allocation: its size */
    int *dies_after;   /* per allocation: the op after which the forward no longer reads it (-1: kept) */
    unsigned char *bwd; /* per allocation: a backward reads it */
    int *at, *order;   /* op j's allocations to give back: order[at[j] .. at[j + 1]) */
} live_script;

typedef struct rt_live {
    live_script *scripts; /* per unit */
    int n_units;
    int last_learned; /* the unit whose script was learned last (-1: none yet) */
    /* the pass under way */
    live_mode mode;
    int unit, n_alloc, n_op, diverged;
    int lend;  /* the unit whose script this pass runs, when not its own (-1: its own) */
    int learn; /* a forward with no script to run: recorded, and its script learned at its end */
    rt_tensor **tab; /* allocation index -> tensor */
    int cap;
} rt_live;

static void script_clear(live_script *s) {
    free(s->bytes);
    free(s->dies_after);
    free(s->bwd);
    free(s->at);
    free(s->order);
    memset(s, 0, sizeof *s);
}

void live_free(runtime *rt) {
    rt_live *l = rt->live;
    if (!l) return;
    for (int u = 0; u < l->n_units; u++) script_clear(&l->scripts[u]);
    free(l->scripts);
    free(l->tab);
    free(l);
    rt->live = NULL;
}

/* Units with the same parameters, in order and shape (a model's identical blocks): one's forward
 * allocates and reads as the other's does, which the pass checks as it runs (live_alloc). */
static int units_alike(const runtime *rt, int a, int b) {
    int i = 0, j = 0, n = rt->n_params;
    for (;;) {
        while (i < n && rt->slots[i].unit != a) i++;
        while (j < n && rt->slots[j].unit != b) j++;
        if (i == n || j == n) return i == n && j == n;
        const ct_tensor *x = &rt->params[i]->t, *y = &rt->params[j]->t;
        if (x->ndim != y->ndim || memcmp(x->shape, y->shape, sizeof(int64_t) * (size_t)x->ndim)) return 0;
        i++;
        j++;
    }
}

ct_status live_begin(runtime *rt, int u, live_mode mode) {
    if (!rt->live) {
        rt_live *l = calloc(1, sizeof *l);
        if (!l || !(l->scripts = calloc((size_t)rt->desc.n_units, sizeof *l->scripts))) {
            free(l);
            return CT_ERR_NOMEM;
        }
        l->n_units = rt->desc.n_units;
        l->last_learned = -1;
        rt->live = l;
    }
    rt_live *l = rt->live;
    l->mode = mode;
    l->unit = u;
    l->n_alloc = l->n_op = l->diverged = 0;
    l->learn = 0;
    l->lend = -1;
    if (!l->scripts[u].n_allocs) {
        if (l->last_learned >= 0 && units_alike(rt, u, l->last_learned)) l->lend = l->last_learned;
        else l->learn = mode == LIVE_FORWARD;
    }
    return CT_OK;
}

int live_learning(const runtime *rt) { return rt->live && rt->live->mode && rt->live->learn; }

int live_op_index(const runtime *rt) { return rt->live && rt->live->mode ? rt->live->n_op : -1; }

int live_seq_of(const runtime *rt, const rt_tensor *t) {
    const rt_live *l = rt->live;
    if (!l || !t) return -1;
    const rt_tensor *o = t->base ? t->base : t;
    o = o->alias ? o->alias : o;
    int a = o->seq;
    return a >= 0 && a < l->n_alloc && l->tab[a]->t.data == o->t.data ? a : -1;
}

static const live_script *script_of(const rt_live *l) {
    const live_script *s = &l->scripts[l->lend >= 0 ? l->lend : l->unit];
    return s->n_allocs && !l->diverged ? s : NULL;
}

void live_alloc(runtime *rt, rt_tensor *t, size_t bytes) {
    rt_live *l = rt->live;
    t->seq = -1;
    if (!l || !l->mode) return;
    if (l->n_alloc == l->cap) {
        int cap = l->cap ? 2 * l->cap : 256;
        rt_tensor **g = realloc(l->tab, sizeof(*g) * (size_t)cap);
        if (!g) { /* no room to remember it: give nothing back from here on */
            l->diverged = 1;
            return;
        }
        l->tab = g;
        l->cap = cap;
    }
    const live_script *s = script_of(l);
    if (s && (l->n_alloc >= s->n_allocs || s->bytes[l->n_alloc] != (int64_t)bytes)) l->diverged = 1;
    t->seq = l->n_alloc;
    l->tab[l->n_alloc++] = t;
}

ct_status live_check(const runtime *rt, rt_tensor *const *in, int n) {
    const rt_live *l = rt->live;
    if (!l || !l->mode) return CT_OK;
    for (int i = 0; i < n; i++) {
        const rt_tensor *x = !in[i] ? NULL : in[i]->base ? in[i]->base : in[i];
        if (x && x->alias) x = x->alias;
        if (x && x->freed) {
            ct_set_error("unit %d: op %d of its forward read a tensor given back after its last use in an earlier "
                         "pass; the unit's forward is not the same from pass to pass",
                         l->unit, l->n_op);
            return CT_ERR_INTERNAL;
        }
    }
    return CT_OK;
}

ct_status live_op(runtime *rt, rt_tensor *const *in, int n_in) {
    rt_live *l = rt->live;
    if (!l || !l->mode) return CT_OK;
    ct_status st = live_check(rt, in, n_in);
    if (st) return st;
    const live_script *s = script_of(l);
    int j = l->n_op++;
    if (!s || j >= s->n_ops) return CT_OK;
    for (int k = s->at[j]; k < s->at[j + 1]; k++) {
        int a = s->order[k];
        if (a >= l->n_alloc || (l->mode == LIVE_RECOMPUTE && s->bwd[a])) continue;
        rt_tensor *t = l->tab[a];
        if (!t->data_heap) continue;
        tape_give_back_data(t);
        t->freed = 1;
    }
    return CT_OK;
}

/* The script of the pass just recorded (tail: its tape; out: the unit's output, kept). */
static ct_status learn(runtime *rt, live_script *s, tape_entry *tail, rt_tensor *out) {
    rt_live *l = rt->live;
    int n = l->n_alloc, ops = l->n_op;
    script_clear(s);
    if (!n) return CT_OK;
    s->bytes = malloc(sizeof(int64_t) * (size_t)n);
    s->dies_after = malloc(sizeof(int) * (size_t)n);
    s->bwd = calloc((size_t)n, 1);
    s->at = calloc((size_t)ops + 2, sizeof(int));
    s->order = malloc(sizeof(int) * (size_t)n);
    if (!s->bytes || !s->dies_after || !s->bwd || !s->at || !s->order) {
        script_clear(s);
        return CT_ERR_NOMEM;
    }
    for (int a = 0; a < n; a++) {
        s->bytes[a] = ct_tensor_numel(&l->tab[a]->t) * (int64_t)ct_dtype_size(l->tab[a]->t.dtype);
        s->dies_after[a] = -1;
    }
    if (tape_live_scan(rt, tail, s->dies_after, s->bwd, n)) { /* a custom op hides tensors: give nothing back */
        script_clear(s);
        return CT_OK;
    }
    rt_tensor *o = out && out->base ? out->base : out;
    if (o && o->seq >= 0 && o->seq < n) s->dies_after[o->seq] = -1;
    for (int a = 0; a < n; a++)
        if (s->dies_after[a] >= ops) s->dies_after[a] = -1;
    for (int a = 0; a < n; a++) /* counting sort by the op after which each dies */
        if (s->dies_after[a] >= 0) s->at[s->dies_after[a] + 1]++;
    for (int j = 0; j < ops; j++) s->at[j + 1] += s->at[j];
    int *fill = calloc((size_t)ops + 1, sizeof(int));
    if (!fill) {
        script_clear(s);
        return CT_ERR_NOMEM;
    }
    for (int a = 0; a < n; a++)
        if (s->dies_after[a] >= 0) s->order[s->at[s->dies_after[a]] + fill[s->dies_after[a]]++] = a;
    free(fill);
    s->n_allocs = n;
    s->n_ops = ops;
    return CT_OK;
}

ct_status live_end(runtime *rt, int u, tape_entry *tail, rt_tensor *out, int bad) {
    rt_live *l = rt->live;
    if (!l || !l->mode) return CT_OK;
    live_script *s = &l->scripts[u];
    ct_status st = CT_OK;
    if (!bad && (l->mode == LIVE_RECOMPUTE || (l->learn && tail))) {
        st = learn(rt, s, tail, out);
        if (st == CT_OK && s->n_allocs) l->last_learned = u;
    }
    else if (!bad && (l->diverged || (s->n_allocs && (l->n_alloc != s->n_allocs || l->n_op != s->n_ops))))
        script_clear(s); /* another forward than the script's: learned again at the next recompute */
    l->mode = LIVE_OFF;
    return st;
}
