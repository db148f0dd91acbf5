/* offload.c: activation offload (activation_offload.layers). What blocks 1..n keep for their
 * backward leaves the device after their forward and comes back before their backward, the copies
 * running beside the other units' compute (device.h copy_async, ABI 2.9).
 *
 * It rides on actpack.c's packing: an offloaded unit's kept tensors are packed (bf16 under bf16
 * compute, as they are in fp32) into one of two device slots instead of the saved arena, and only
 * the output's handoff to the next unit stays in the saved arena, where the next unit's packing
 * drops it again. So the saved arena holds no offloaded unit's activations, and the slots hold two
 * units' at most:
 *   forward   unit u packs into slot s (after the copy out of the slot's previous tenant, queued
 *             two offloaded units ago, is done: the device waits, the host does not) and its copy
 *             out is queued; it runs while unit u+1 computes. The last two offloaded units stay in
 *             their slots: their backward comes first, so they are never copied.
 *   backward  before unit u unpacks, u's activations and unit u-1's (whose packed output unit u's
 *             input is expanded from) must be in slots: copies queued earlier are waited for (the
 *             device waits), missing ones are made now. After u has unpacked its slot is free, and
 *             unit u-2's copy in is queued there: it runs while unit u's backward computes.
 * Packed tensors keep their place relative to their blob, so a blob copied back anywhere is one
 * rebase (runtime_pack_rebase). On the planner's device the same calls count bytes and copy
 * nothing, so `ctitan plan` holds what training holds. */
#include "host/host.h"
#include "engine/runtime.h"

#include <stdlib.h>
#include <string.h>

static int can_copy(const runtime *rt) {
    const ct_device_api *d = rt->d;
    return CT_HAS_FIELD(d, ct_device_api, copy_wait) && d->host_alloc && d->host_free && d->copy_async && d->copy_wait;
}

ct_status runtime_offload_set(runtime *rt, int layers) {
    rt_offload *o = &rt->offload;
    int blocks = rt->desc.n_units - 2;
    if (layers < 0 || layers > (blocks > 0 ? blocks : 0)) {
        ct_set_error("%d, expected 0 (none) to %d (the model's blocks)", layers, blocks > 0 ? blocks : 0);
        return CT_ERR_INVALID;
    }
    if (layers && !can_copy(rt)) {
        ct_set_error("%d, but the device cannot copy beside its work (device.h copy_async, ABI 2.9)", layers);
        return CT_ERR_UNSUPPORTED;
    }
    if (layers && !o->unit) {
        o->unit = calloc((size_t)rt->desc.n_units, sizeof *o->unit);
        if (!o->unit) {
            ct_set_error("out of memory");
            return CT_ERR_NOMEM;
        }
        for (int k = 0; k < 2; k++) pool_init(&o->slot[k], rt->d, rt->dev, CT_MEM_ACTIVATIONS);
        if (rt->planning)
            for (int k = 0; k < 2; k++) o->slot[k].first_chunk = RT_PLAN_CHUNK;
    }
    o->layers = layers;
    runtime_offload_reset(rt);
    return CT_OK;
}

int runtime_offloads(const runtime *rt, int u) {
    return rt->offload.layers && u >= 1 && u <= rt->offload.layers && rt->in_order && rt->pack_units;
}

static ct_status wait_ticket(runtime *rt, uint64_t ticket) {
    return ticket ? rt->d->copy_wait(rt->dev, ticket) : CT_OK;
}

/* Queues the copy of unit u's blob to its host copy (growing that first). */
static ct_status copy_out(runtime *rt, int u) {
    rt_offload *o = &rt->offload;
    rt_offload_unit *ou = &o->unit[u];
    if (ou->host_cap < ou->bytes) {
        if (ou->host) {
            rt->d->host_free(rt->dev, ou->host);
            o->host_bytes -= (double)ou->host_cap;
        }
        ou->host = NULL;
        ou->host_cap = 0;
        ct_status st = rt->d->host_alloc(rt->dev, ou->bytes, &ou->host);
        if (st != CT_OK) return st;
        ou->host_cap = ou->bytes;
        o->host_bytes += (double)ou->bytes;
    }
    ct_status st = rt->d->copy_async(rt->dev, ou->host, ou->blob, ou->bytes, CT_COPY_D2H, &ou->ticket);
    if (st != CT_OK) return st;
    ou->on_host = 1;
    o->slot_ticket[ou->slot] = ou->ticket;
    o->step_bytes_out += (double)ou->bytes;
    return CT_OK;
}

/* Slot s emptied for new contents: a tenant still needed is copied out first, and the device waits
 * for the copies that read the slot. */
static ct_status evict(runtime *rt, int s) {
    rt_offload *o = &rt->offload;
    int t = o->tenant[s];
    if (t >= 0 && o->unit[t].bytes && !o->unit[t].on_host) {
        ct_status st = copy_out(rt, t);
        if (st != CT_OK) return st;
    }
    if (t >= 0) o->unit[t].slot = -1;
    o->tenant[s] = -1;
    ct_status st = wait_ticket(rt, o->slot_ticket[s]);
    o->slot_ticket[s] = 0;
    pool_release(&o->slot[s], (pool_mark){0, 0, 0});
    return st;
}

char *runtime_offload_take(runtime *rt, int u, size_t bytes) {
    rt_offload *o = &rt->offload;
    if (!runtime_offloads(rt, u)) return NULL;
    int s = o->next_slot;
    o->next_slot ^= 1;
    if (evict(rt, s) != CT_OK) return NULL;
    char *blob = pool_alloc(&o->slot[s], bytes);
    if (!blob) return NULL;
    o->tenant[s] = u;
    o->unit[u].bytes = bytes;
    o->unit[u].blob = blob;
    o->unit[u].slot = s;
    o->unit[u].on_host = 0;
    o->unit[u].loading = 0;
    runtime_note_act_peak(rt);
    return blob;
}

ct_status runtime_offload_out(runtime *rt, int u) {
    rt_offload *o = &rt->offload;
    if (!o->unit || !o->unit[u].bytes || o->unit[u].slot < 0) return CT_OK;
    if (u >= o->layers - 1) return CT_OK; /* the last two stay: their backward comes first */
    return copy_out(rt, u);
}

/* The slot to load into while units `keep_a` and `keep_b` must stay: one whose tenant is neither. */
static int free_slot(const rt_offload *o, int keep_a, int keep_b) {
    for (int s = 0; s < 2; s++)
        if (o->tenant[s] < 0) return s;
    for (int s = 0; s < 2; s++)
        if (o->tenant[s] != keep_a && o->tenant[s] != keep_b) return s;
    return -1;
}

/* Queues unit w's copy back into a slot not holding keep_a or keep_b. */
static ct_status load(runtime *rt, int w, int keep_a, int keep_b) {
    rt_offload *o = &rt->offload;
    rt_offload_unit *ou = &o->unit[w];
    int s = free_slot(o, keep_a, keep_b);
    if (s < 0) {
        ct_set_error("activation offload: no slot free for unit %d", w);
        return CT_ERR_INTERNAL;
    }
    ct_status st = evict(rt, s);
    if (st != CT_OK) return st;
    char *blob = pool_alloc(&o->slot[s], ou->bytes);
    if (!blob) {
        if (!ct_last_error()[0]) ct_set_error("out of memory for offloaded activations");
        return CT_ERR_NOMEM;
    }
    st = rt->d->copy_async(rt->dev, blob, ou->host, ou->bytes, CT_COPY_H2D, &ou->ticket);
    if (st != CT_OK) return st;
    runtime_pack_rebase(rt, w, blob);
    ou->blob = blob;
    ou->slot = s;
    ou->loading = 1;
    o->tenant[s] = w;
    o->step_bytes_in += (double)ou->bytes;
    runtime_note_act_peak(rt);
    return CT_OK;
}

static int alive(const rt_offload *o, int w) { return w >= 1 && o->unit && o->unit[w].bytes; }

ct_status runtime_offload_in(runtime *rt, int u) {
    rt_offload *o = &rt->offload;
    int need[2] = {u, u - 1};
    for (int k = 0; k < 2; k++) {
        int w = need[k];
        if (!alive(o, w)) continue;
        rt_offload_unit *ou = &o->unit[w];
        if (ou->slot < 0) { /* not prefetched: queued now */
            ct_status st = load(rt, w, u, u - 1);
            if (st != CT_OK) return st;
        }
        if (ou->loading) {
            ct_status st = wait_ticket(rt, ou->ticket);
            if (st != CT_OK) return st;
            ou->loading = 0;
        }
    }
    return CT_OK;
}

ct_status runtime_offload_prefetch(runtime *rt, int u) {
    rt_offload *o = &rt->offload;
    if (!o->unit) return CT_OK;
    if (alive(o, u)) { /* expanded: its slot is free */
        if (o->unit[u].slot >= 0) o->tenant[o->unit[u].slot] = -1;
        o->unit[u].bytes = 0;
        o->unit[u].slot = -1;
    }
    int w = u - 2;
    if (!alive(o, w) || o->unit[w].slot >= 0) return CT_OK;
    return load(rt, w, u - 1, w);
}

void runtime_offload_reset(runtime *rt) {
    rt_offload *o = &rt->offload;
    if (!o->unit) return;
    for (int u = 0; u < rt->desc.n_units; u++) {
        o->unit[u].bytes = 0;
        o->unit[u].slot = -1;
        o->unit[u].on_host = o->unit[u].loading = 0;
    }
    int chunks = o->slot[0].n_chunks > 1 || o->slot[1].n_chunks > 1;
    if (chunks && !rt->planning) rt->d->synchronize(rt->dev); /* copies reading the slots are done */
    for (int s = 0; s < 2; s++) {
        o->tenant[s] = -1;
        o->slot_ticket[s] = 0;
        if (chunks) pool_reset(&o->slot[s]); /* into one chunk each (a device without regions) */
        else pool_release(&o->slot[s], (pool_mark){0, 0, 0});
    }
    o->next_slot = 0;
}

void runtime_offload_report(const runtime *rt, FILE *f) {
    const rt_offload *o = &rt->offload;
    if (!o->layers || !o->unit) return;
    int stayed = 0, first = -1;
    for (int u = 1; u <= o->layers; u++)
        if (o->unit[u].stayed && !stayed++) first = u;
    if (o->layers > 2)
        fprintf(f, "activation_offload: blocks 1-%d: %.1f MiB of host memory hold blocks 1-%d's activations from "
                   "forward to backward; blocks %d-%d, whose backward comes first, wait in two device slots",
                o->layers, o->host_bytes / 1048576.0, o->layers - 2, o->layers - 1, o->layers);
    else
        fprintf(f, "activation_offload: blocks 1-%d wait in device slots, nothing goes to the host (the last two "
                   "offloaded blocks' backward comes first: offload more blocks to save memory)", o->layers);
    if (stayed)
        fprintf(f, "; %d of them stay on the device (from unit %d: a custom op keeps state in their activations, "
                   "so nothing of theirs may move)", stayed, first);
    fprintf(f, "\n");
}

void runtime_offload_free(runtime *rt) {
    rt_offload *o = &rt->offload;
    if (!o->unit) return;
    if (!rt->planning) rt->d->synchronize(rt->dev);
    for (int u = 0; u < rt->desc.n_units; u++)
        if (o->unit[u].host) rt->d->host_free(rt->dev, o->unit[u].host);
    for (int s = 0; s < 2; s++) pool_destroy(&o->slot[s]);
    free(o->unit);
    memset(o, 0, sizeof *o);
}
