/* output.c: a plan as text, as JSON (jansson; the schema is in docs/planning.md) and as a manifest
 * that `ctitan train` runs unchanged. */
#include "plan/output.h"

#include "base/error.h"
#include "engine/mesh.h"
#include "base/util.h"
#include "config/torchtitan_keys.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GIB (1024.0 * 1024.0 * 1024.0)

static const char *ac_name(int ac) {
    return ac == PLAN_AC_NONE ? "none" : ac == PLAN_AC_FULL ? "full" : ac == PLAN_AC_SELECTIVE_OP ? "selective op" : "selective layer";
}

/* What the knobs of the strategy on `axis` add after its degree where they count: " (async)" for a
 * boolean that is on (its label, else its key's last word), " (alltoall)" for a string's value. */
static void axis_knobs(const plan_layout *l, int axis, char *out, size_t len) {
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < l->n_knobs && at < len; i++) {
        const plan_setting *k = &l->knob[i];
        if (k->quantizer || k->axis != axis || !plan_knob_applies(k, l) || !k->value[0] || !strcmp(k->value, "false"))
            continue;
        const char *word = k->value, *dot = strrchr(k->key, '.');
        if (plan_knob_true(k)) word = k->label[0] ? k->label : dot ? dot + 1 : k->key;
        at += (size_t)snprintf(out + at, len - at, " (%s)", word);
    }
}

/* The dense quantizer as the layout line names it: "float8 tensorwise", "float8 on", "float8 off". */
static void quant_words(const plan_layout *l, char *out, size_t len) {
    size_t at = (size_t)snprintf(out, len, "%s", l->quant_name[0] ? l->quant_name : "quantizer");
    int said = 0;
    for (int i = 0; l->quant && i < l->n_knobs && at < len; i++)
        if (l->knob[i].quantizer && !l->knob[i].enables && l->knob[i].value[0])
            at += (size_t)snprintf(out + at, len - at, " %s", l->knob[i].value), said = 1;
    if (!said && at < len) snprintf(out + at, len - at, " %s", l->quant ? "on" : "off");
}

void plan_layout_line(const plan_layout *l, char *out, size_t len) {
    char pp[96] = "", ac[48];
    if (l->pp > 1) snprintf(pp, sizeof pp, " (%s, microbatch %d)", l->schedule, l->pp_microbatch_size);
    if (l->ac == PLAN_AC_SELECTIVE_LAYER) snprintf(ac, sizeof ac, "selective every %d", l->ac_every);
    else snprintf(ac, sizeof ac, "%s", ac_name(l->ac));
    char global[48], off[48] = "", rep[64], shard[64], cpk[64], tpk[64], ppk[64], quant[128];
    axis_knobs(l, CT_AXIS_DP_REPLICATE, rep, sizeof rep);
    axis_knobs(l, CT_AXIS_DP_SHARD, shard, sizeof shard);
    axis_knobs(l, CT_AXIS_CP, cpk, sizeof cpk);
    axis_knobs(l, CT_AXIS_TP, tpk, sizeof tpk);
    axis_knobs(l, CT_AXIS_PP, ppk, sizeof ppk);
    quant_words(l, quant, sizeof quant);
    if (l->global_batch > 0) snprintf(global, sizeof global, "%lld", (long long)l->global_batch);
    else snprintf(global, sizeof global, "local x dp");
    if (l->offload) snprintf(off, sizeof off, "; offload %d blocks", l->offload);
    char ep[64] = "";
    if (l->ep > 1) snprintf(ep, sizeof ep, " (ep %d x efsdp %d of dp_shard x cp)", l->ep, l->dp_shard * l->cp / l->ep);
    snprintf(out, len,
             "dp_replicate %d%s x dp_shard %d%s x cp %d%s x tp %d%s x pp %d%s%s%s; local batch %lld of global %s x seq %lld; "
             "AC %s%s; %s; compile %s",
             l->dp_replicate, rep, l->dp_shard, shard, l->cp, cpk, l->tp, tpk, l->pp, ppk, pp, ep,
             (long long)l->local_batch, global, (long long)l->seq_len, ac, off, quant, l->compile ? "on" : "off");
}

/* ---- text ---- */

/* What a layout may use: the device's memory less the profile's headroom ("fits" compares with it). */
static double usable(const plan_result *r, const hw_profile *hw) {
    if (hw && hw->mem_bytes > 0) return hw->mem_bytes * (1.0 - hw->headroom_frac);
    return r->mem_capacity;
}

/* Seconds with a unit that keeps three significant figures readable. */
static void fmt_s(double s, char *out, size_t len) {
    if (!isfinite(s)) snprintf(out, len, "-");
    else if (s >= 1) snprintf(out, len, "%.3f s", s);
    else if (s >= 1e-3) snprintf(out, len, "%.2f ms", s * 1e3);
    else snprintf(out, len, "%.1f us", s * 1e6);
}

static void fmt_bytes(double b, char *out, size_t len) {
    if (b >= GIB) snprintf(out, len, "%.2f GiB", b / GIB);
    else if (b >= 1024.0 * 1024.0) snprintf(out, len, "%.1f MiB", b / (1024.0 * 1024.0));
    else snprintf(out, len, "%.0f B", b);
}

void plan_print_text(FILE *f, const plan_result *r, const hw_profile *hw) {
    char line[512], a[32], b[32];
    plan_layout_line(&r->layout, line, sizeof line);
    fprintf(f, "  layout: %s\n", line);
    double cap = usable(r, hw);
    if (hw && cap > 0)
        fprintf(f, "  memory per GPU (largest rank): %.2f GiB of %.2f GiB usable (%.1f GiB, %.0f%% kept free): %s, %.2f GiB %s\n",
                r->mem_total / GIB, cap / GIB, hw->mem_bytes / GIB, 100 * hw->headroom_frac, r->fits ? "fits" : "DOES NOT FIT",
                fabs(cap - r->mem_total) / GIB, r->fits ? "headroom" : "over");
    else
        fprintf(f, "  memory per GPU (largest rank): %.2f GiB\n", r->mem_total / GIB);
    fprintf(f, "   ");
    for (int i = 0; i < PLAN_MEM_N; i++) fprintf(f, " %s %.2f", plan_mem_names[i], r->mem[i] / GIB);
    fprintf(f, " (GiB)\n");
    if (r->layout.offload) {
        fmt_bytes(r->host_bytes, a, sizeof a);
        fmt_bytes(r->offload_bytes, b, sizeof b);
        fprintf(f, "  activation offload: blocks 1-%d; host memory %s; %s copied out and in per step", r->layout.offload,
                a, b);
        if (hw && hw->host_bw > 0) {
            fmt_s(r->t_offload, a, sizeof a);
            fmt_s(r->t_offload_exposed, b, sizeof b);
            fprintf(f, " in %s at %.0f GB/s, exposed %s", a, hw->host_bw / 1e9, b);
        }
        if (hw && hw->host_mem > 0) fprintf(f, " (host memory per GPU %.1f GiB)", hw->host_mem / GIB);
        fprintf(f, "\n");
    }
    if (!hw) { /* memory only: times need a profile's rates */
        if (r->assumptions[0]) fprintf(f, "  assumptions: %s\n", r->assumptions);
        return;
    }
    fmt_s(r->step_time, a, sizeof a);
    fprintf(f, "  step time %s:", a);
    struct {
        const char *name;
        double v;
    } parts[] = {{"gemm", r->t_gemm},           {"attention", r->t_attention}, {"memory-bound", r->t_memory_bound},
                 {"optimizer", r->t_optimizer}, {"recompute", r->t_recompute}, {"comm exposed", r->t_comm_exposed},
                 {"bubble", r->t_bubble}, {"offload exposed", r->t_offload_exposed}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        fmt_s(parts[i].v, a, sizeof a);
        fprintf(f, " %s %s%s", parts[i].name, a, i + 1 < sizeof parts / sizeof parts[0] ? "," : "");
    }
    fmt_s(r->t_comm_hidden, a, sizeof a);
    fprintf(f, " (comm hidden behind compute %s)\n", a);
    for (int i = 0; i < r->n_comms && i < (int)(sizeof r->comms / sizeof r->comms[0]); i++) {
        const plan_comm_line *c = &r->comms[i];
        fmt_bytes(c->bytes, line, sizeof line);
        fmt_s(c->seconds, a, sizeof a);
        fmt_s(c->exposed, b, sizeof b);
        fprintf(f, "    %-22s %s in %.0f calls, %s, exposed %s, hidden ", c->what, line, c->count, a, b);
        fmt_s(c->seconds - c->exposed > 0 ? c->seconds - c->exposed : 0, a, sizeof a);
        fprintf(f, "%s (%s)\n", a, c->inter_node ? "across nodes" : "within a node");
    }
    if (r->layout.ep > 1) {
        fmt_s(r->t_ep_all_to_all, a, sizeof a);
        fprintf(f, "  expert parallel: %d experts per layer over ep %d (%d each); dispatch and combine all-to-alls %s "
                "per step at %.2f x balanced routing\n", r->n_experts, r->layout.ep,
                r->layout.ep ? r->n_experts / r->layout.ep : 0, a, r->ep_imbalance);
    }
    if (r->layout.pp > 1)
        fprintf(f, "  pipeline: %s, bubble %.1f%% of the step, %d microbatch%s in flight\n", r->layout.schedule,
                100 * r->bubble_fraction, r->inflight_microbatches, r->inflight_microbatches == 1 ? "" : "es");
    fprintf(f, "  tokens/s per GPU %.0f, MFU %.1f%% (bf16 peak %.0f TFLOP/s, %.3g FLOP per token)", r->tokens_per_s_per_gpu,
            100 * r->mfu, hw->peak_flops[PLAN_BF16] / 1e12, r->flops_per_token);
    if (r->scaling_efficiency > 0) fprintf(f, ", scaling efficiency %.1f%%", 100 * r->scaling_efficiency);
    fprintf(f, "\n");
    if (r->assumptions[0]) fprintf(f, "  assumptions: %s\n", r->assumptions);
}

/* Where the winner and the guide's rule differ: which numbers decide. */
static void print_rule(const plan_search_stats *st, const plan_result *win, const hw_profile *hw, FILE *f) {
    char line[512];
    fprintf(f, "guide's rule for %.3g parameters: %s\n", st->model.n_params, st->rule);
    plan_layout_line(&st->rule_layout, line, sizeof line);
    fprintf(f, "  the rule's layout: %s\n", line);
    if (!st->rule_evaluated) {
        fprintf(f, "  the plugins refuse it: %s\n", st->rule_err);
    } else {
        const plan_result *rr = &st->rule_result;
        if (st->rule_err[0]) fprintf(f, "  (%s)\n", st->rule_err);
        fprintf(f, "  it needs %.2f GiB of %.2f GiB usable per GPU (%s) and reaches %.0f tokens/s per GPU\n",
                rr->mem_total / GIB, usable(rr, hw) / GIB, rr->fits ? "fits" : "does not fit", rr->tokens_per_s_per_gpu);
    }
    if (!win) {
        fprintf(f, "  no layout fits, so there is no winner to compare\n");
        return;
    }
    if (st->agrees) {
        fprintf(f, "  the winner agrees with the rule (%s)\n",
                plan_layout_kind(&win->layout) == 0 ? "data parallel alone" : plan_layout_kind(&win->layout) == 1 ? "with TP, no PP" : "with PP");
        return;
    }
    fprintf(f, "  the winner does not follow the rule: ");
    if (!st->rule_evaluated) fprintf(f, "the rule's layout cannot run with these plugins\n");
    else if (!st->rule_result.fits)
        fprintf(f, "the rule's layout needs %.2f GiB per GPU, %.2f GiB more than the %.2f GiB usable\n",
                st->rule_result.mem_total / GIB, (st->rule_result.mem_total - usable(&st->rule_result, hw)) / GIB,
                usable(&st->rule_result, hw) / GIB);
    else
        fprintf(f, "the rule's layout fits but reaches %.0f tokens/s per GPU against the winner's %.0f (%+.1f%%)\n",
                st->rule_result.tokens_per_s_per_gpu, win->tokens_per_s_per_gpu,
                100 * (st->rule_result.tokens_per_s_per_gpu / win->tokens_per_s_per_gpu - 1));
}

/* The cp axis's collectives of a plan: bytes per step and the seconds they leave exposed. */
static void cp_comm(const plan_result *r, double *bytes, double *exposed) {
    *bytes = *exposed = 0;
    for (int i = 0; i < r->n_comms && i < (int)(sizeof r->comms / sizeof r->comms[0]); i++)
        if (r->comms[i].axis == CT_AXIS_CP) *bytes += r->comms[i].bytes, *exposed += r->comms[i].exposed;
}

/* The winner's rotate method against the others at its other settings: the step time's parts where
 * they differ (attention, its recompute, the cp collectives and what they leave exposed), memory. */
static void print_cp_methods(const plan_search_stats *st, const plan_result *win, FILE *f) {
    if (!win || st->n_cp_methods < 2) return;
    int ki = st->cp_knob;
    const struct plan_cp_method *next = NULL; /* the best other value that fits */
    for (int i = 0; i < st->n_cp_methods; i++) {
        const struct plan_cp_method *e = &st->cp_methods[i];
        if (e->evaluated && e->r.fits && strcmp(e->r.layout.knob[ki].value, win->layout.knob[ki].value) &&
            (!next || e->r.tokens_per_s_per_gpu > next->r.tokens_per_s_per_gpu))
            next = e;
    }
    fprintf(f, "context parallel rotate method at seq %lld, cp %d: %s, %.0f tokens/s per GPU", (long long)win->layout.seq_len,
            win->layout.cp, win->layout.knob[ki].value, win->tokens_per_s_per_gpu);
    if (next) fprintf(f, " against %.0f for %s, the next best that fits", next->r.tokens_per_s_per_gpu, next->r.layout.knob[ki].value);
    else fprintf(f, ", the only one that fits");
    fprintf(f, "; each method with the winner's other settings:\n");
    for (int i = 0; i < st->n_cp_methods; i++) {
        const struct plan_cp_method *e = &st->cp_methods[i];
        fprintf(f, "  %-10s ", e->r.layout.knob[ki].value);
        if (!e->evaluated) {
            fprintf(f, "cannot run here: %s\n", e->note);
            continue;
        }
        char step[32], att[32], rec[32], bytes_s[32], cpx[32], all[32];
        double bytes, exposed;
        cp_comm(&e->r, &bytes, &exposed);
        fmt_s(e->r.step_time, step, sizeof step);
        fmt_s(e->r.t_attention, att, sizeof att);
        fmt_s(e->r.t_recompute, rec, sizeof rec);
        fmt_bytes(bytes, bytes_s, sizeof bytes_s);
        fmt_s(exposed, cpx, sizeof cpx);
        fmt_s(e->r.t_comm_exposed, all, sizeof all);
        fprintf(f, "step %s: attention %s, recompute %s, cp collectives %s with %s exposed (all comm exposed %s); "
                   "%.2f GiB per GPU (%s), %.0f tokens/s per GPU\n",
                step, att, rec, bytes_s, cpx, all, e->r.mem_total / GIB, e->r.fits ? "fits" : "does not fit",
                e->r.tokens_per_s_per_gpu);
    }
}

void plan_report_text(const plan_report *rep, FILE *f) {
    const hw_profile *hw = rep->hw;
    fprintf(f, "plan: %s on %d x %s (%d per node)\n", rep->manifest_path, rep->gpus, hw->name, rep->gpus_per_node);
    fprintf(f, "hardware: %s%s: %s\n", hw->path[0] ? hw->path : "built in", hw->calibrated ? " (calibrated)" : "",
            hw->source);
    if (rep->model && rep->model->n_params > 0)
        fprintf(f, "model: %.4g parameters, %d layers, %d heads, %d kv heads\n",
                rep->model->n_params, rep->model->n_layers, rep->model->n_heads, rep->model->n_kv_heads);
    const plan_search_stats *st = rep->search;
    if (!st) {
        if (rep->n_results) plan_print_text(f, &rep->results[0], hw);
        return;
    }
    fprintf(f,
            "search: %ld meshes (dp_replicate x dp_shard x cp x tp x pp dividing the model and the global batch of %lld), "
            "%ld pruned by their parameter and optimizer memory; %ld layouts evaluated, %ld refused by the plugins, %ld fit; "
            "knobs tuned on the best %d meshes; %.2f s\n",
            st->meshes, (long long)st->global_batch, st->pruned, st->evaluated, st->refused, st->fitting, st->full_meshes,
            st->seconds);
    if (st->refused && st->first_refusal[0]) fprintf(f, "  a refusal, for instance: %s\n", st->first_refusal);
    const plan_result *win = rep->n_results && rep->results[0].fits ? &rep->results[0] : NULL;
    if (!win && rep->n_results) fprintf(f, "no layout fits on %d GPUs; the closest:\n", rep->gpus);
    if (!rep->n_results)
        fprintf(f, "no layout could be evaluated on %d GPUs: %s\n", rep->gpus,
                st->meshes == 0 ? "no mesh multiplies to them and divides the model's heads, layers and the global batch"
                                : "the plugins refused every one");
    for (int i = 0; i < rep->n_results; i++) {
        fprintf(f, "#%d\n", i + 1);
        plan_print_text(f, &rep->results[i], hw);
    }
    if (win) {
        fprintf(f, "largest microbatch that fits the winner's settings: %s %lld (the winner uses %lld)\n",
                win->layout.pp > 1 ? "pipeline_parallel_microbatch_size" : "local_batch_size", (long long)st->max_microbatch,
                (long long)(win->layout.pp > 1 ? win->layout.pp_microbatch_size : win->layout.local_batch));
        fprintf(f, "scaling efficiency: tokens/s per GPU against the best at %d GPUs (%.0f), the smallest count %d / 2^k "
                   "where a layout fits\n",
                st->ref_gpus, st->ref_tokens_per_s_per_gpu, rep->gpus);
    }
    print_cp_methods(st, win, f);
    print_rule(st, win, hw, f);
}

/* ---- JSON ---- */

static json_t *jreal(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* The degrees, and each strategy's knobs under their key's last word: a boolean true where it counts,
 * a string as set. */
static json_t *layout_json(const plan_layout *l) {
    json_t *par = json_pack("{s:i, s:i, s:i, s:i, s:i, s:s, s:i}", "data_parallel_replicate_degree", l->dp_replicate,
                            "data_parallel_shard_degree", l->dp_shard, "context_parallel_degree", l->cp,
                            "tensor_parallel_degree", l->tp, "pipeline_parallel_degree", l->pp, "pipeline_parallel_schedule",
                            l->schedule, "pipeline_parallel_microbatch_size", l->pp_microbatch_size);
    for (int i = 0; par && i < l->n_knobs; i++) {
        const plan_setting *k = &l->knob[i];
        const char *dot = strrchr(k->key, '.'), *name = dot ? dot + 1 : k->key;
        if (k->quantizer) continue;
        if (!strcmp(k->value, "true") || !strcmp(k->value, "false") || !k->value[0])
            json_object_set_new(par, name, json_boolean(plan_knob_true(k) && plan_knob_applies(k, l)));
        else json_object_set_new(par, name, json_string(k->value));
    }
    if (par) json_object_set_new(par, "expert_parallel_degree", json_integer(l->ep > 1 ? l->ep : 1));
    return par;
}

/* Every plugin knob that counts in the layout, by its whole key: {"compile.enable_async_tensor_parallel": "true"}. */
static json_t *knobs_json(const plan_layout *l) {
    json_t *o = json_object();
    for (int i = 0; o && i < l->n_knobs; i++)
        if (plan_knob_applies(&l->knob[i], l) && l->knob[i].value[0])
            json_object_set_new(o, l->knob[i].key, json_string(l->knob[i].value));
    return o;
}

/* The dense quantizer's string settings, one word each ("tensorwise"); "" when it is off. */
static void quant_recipe(const plan_layout *l, char *out, size_t len) {
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; l->quant && i < l->n_knobs && at < len; i++)
        if (l->knob[i].quantizer && !l->knob[i].enables && l->knob[i].value[0])
            at += (size_t)snprintf(out + at, len - at, "%s%s", at ? " " : "", l->knob[i].value);
}

static json_t *result_json(const plan_result *r, const hw_profile *hw) {
    const plan_layout *l = &r->layout;
    json_t *o = json_object(), *mem = json_object(), *t = json_object(), *comms = json_array();
    if (!o || !mem || !t || !comms) goto fail;
    json_object_set_new(o, "parallelism", layout_json(l));
    json_object_set_new(o, "training", json_pack("{s:I, s:I, s:I}", "local_batch_size", (json_int_t)l->local_batch,
                                                 "global_batch_size", (json_int_t)l->global_batch, "seq_len",
                                                 (json_int_t)l->seq_len));
    const char *mode = l->ac == PLAN_AC_NONE ? "none" : l->ac == PLAN_AC_FULL ? "full" : "selective";
    json_t *ac = json_pack("{s:s}", "mode", mode);
    if (l->ac == PLAN_AC_SELECTIVE_OP) json_object_set_new(ac, "selective_ac_option", json_string("op"));
    if (l->ac == PLAN_AC_SELECTIVE_LAYER) json_object_set_new(ac, "selective_ac_option", json_integer(l->ac_every));
    json_object_set_new(o, "activation_checkpoint", ac);
    char recipe[128];
    quant_recipe(l, recipe, sizeof recipe);
    json_object_set_new(o, "float8", json_pack("{s:b, s:s}", "enable", l->quant != 0, "recipe", recipe));
    json_object_set_new(o, "knobs", knobs_json(l));
    json_object_set_new(o, "compile", json_boolean(l->compile));
    json_object_set_new(o, "bf16", json_boolean(l->bf16));
    json_object_set_new(o, "fits", json_boolean(r->fits));
    json_object_set_new(mem, "total", jreal(r->mem_total / GIB));
    json_object_set_new(mem, "capacity", jreal(r->mem_capacity / GIB));
    json_object_set_new(mem, "usable", jreal(usable(r, hw) / GIB));
    for (int i = 0; i < PLAN_MEM_N; i++) json_object_set_new(mem, plan_mem_names[i], jreal(r->mem[i] / GIB));
    json_object_set_new(o, "memory_gib", mem);
    mem = NULL;
    json_object_set_new(o, "step_time_s", jreal(r->step_time));
    json_object_set_new(t, "gemm", jreal(r->t_gemm));
    json_object_set_new(t, "attention", jreal(r->t_attention));
    json_object_set_new(t, "memory_bound", jreal(r->t_memory_bound));
    json_object_set_new(t, "optimizer", jreal(r->t_optimizer));
    json_object_set_new(t, "recompute", jreal(r->t_recompute));
    json_object_set_new(t, "comm_exposed", jreal(r->t_comm_exposed));
    json_object_set_new(t, "comm_hidden", jreal(r->t_comm_hidden));
    json_object_set_new(t, "bubble", jreal(r->t_bubble));
    json_object_set_new(t, "offload_exposed", jreal(r->t_offload_exposed));
    json_object_set_new(t, "ep_all_to_all", jreal(r->t_ep_all_to_all));
    json_object_set_new(o, "n_experts", json_integer(r->n_experts));
    json_object_set_new(o, "ep_load_imbalance", jreal(r->ep_imbalance > 0 ? r->ep_imbalance : 1));
    json_object_set_new(o, "activation_offload",
                        json_pack("{s:i, s:f, s:f, s:f, s:f}", "layers", l->offload, "host_gib", r->host_bytes / GIB,
                                  "host_capacity_gib", hw ? hw->host_mem / GIB : 0.0, "copied_gib_per_step",
                                  r->offload_bytes / GIB, "copy_s", r->t_offload));
    json_object_set_new(o, "time_s", t);
    t = NULL;
    for (int i = 0; i < r->n_comms && i < (int)(sizeof r->comms / sizeof r->comms[0]); i++) {
        const plan_comm_line *c = &r->comms[i];
        json_t *one = json_object();
        json_object_set_new(one, "what", json_string(c->what));
        json_object_set_new(one, "axis", json_integer(c->axis));
        json_object_set_new(one, "kind", json_integer(c->kind));
        json_object_set_new(one, "bytes", jreal(c->bytes));
        json_object_set_new(one, "count", jreal(c->count));
        json_object_set_new(one, "seconds", jreal(c->seconds));
        json_object_set_new(one, "exposed_s", jreal(c->exposed));
        json_object_set_new(one, "inter_node", json_boolean(c->inter_node));
        json_array_append_new(comms, one);
    }
    json_object_set_new(o, "collectives", comms);
    comms = NULL;
    json_object_set_new(o, "bubble_fraction", jreal(r->bubble_fraction));
    json_object_set_new(o, "inflight_microbatches", json_integer(r->inflight_microbatches));
    json_object_set_new(o, "tokens_per_s_per_gpu", jreal(r->tokens_per_s_per_gpu));
    json_object_set_new(o, "mfu", jreal(r->mfu));
    json_object_set_new(o, "flops_per_token", jreal(r->flops_per_token));
    json_object_set_new(o, "scaling_efficiency", jreal(r->scaling_efficiency));
    json_object_set_new(o, "assumptions", json_string(r->assumptions));
    return o;
fail:
    json_decref(o), json_decref(mem), json_decref(t), json_decref(comms);
    return NULL;
}

ct_status plan_print_json(const plan_report *rep, FILE *f) {
    const hw_profile *hw = rep->hw;
    json_t *root = json_object(), *layouts = json_array();
    ct_status rc = CT_ERR_NOMEM; /* until the JSON is built and written */
    if (!root || !layouts) goto out;
    json_object_set_new(root, "manifest", json_string(rep->manifest_path));
    json_object_set_new(root, "mode", json_string(rep->search ? "search" : "evaluate"));
    json_object_set_new(root, "gpus", json_integer(rep->gpus));
    json_object_set_new(root, "gpus_per_node", json_integer(rep->gpus_per_node));
    json_t *h = json_object();
    json_object_set_new(h, "name", json_string(hw->name));
    json_object_set_new(h, "path", json_string(hw->path));
    json_object_set_new(h, "source", json_string(hw->source));
    json_object_set_new(h, "memory_gib", jreal(hw->mem_bytes / GIB));
    json_object_set_new(h, "bf16_peak_flops", jreal(hw->peak_flops[PLAN_BF16]));
    json_object_set_new(h, "calibrated", json_boolean(hw->calibrated));
    json_object_set_new(root, "hardware", h);
    if (rep->model)
        json_object_set_new(root, "model", json_pack("{s:f, s:i, s:i, s:i}", "n_params", rep->model->n_params, "n_layers",
                                                     rep->model->n_layers, "n_heads", rep->model->n_heads, "n_kv_heads",
                                                     rep->model->n_kv_heads));
    for (int i = 0; i < rep->n_results; i++) {
        json_t *one = result_json(&rep->results[i], hw);
        if (!one) goto out;
        json_array_append_new(layouts, one);
    }
    json_object_set_new(root, "layouts", layouts);
    layouts = NULL;
    const plan_search_stats *st = rep->search;
    if (st) {
        json_t *s = json_object();
        json_object_set_new(s, "meshes", json_integer(st->meshes));
        json_object_set_new(s, "pruned", json_integer(st->pruned));
        json_object_set_new(s, "evaluated", json_integer(st->evaluated));
        json_object_set_new(s, "refused", json_integer(st->refused));
        json_object_set_new(s, "fitting", json_integer(st->fitting));
        json_object_set_new(s, "full_meshes", json_integer(st->full_meshes));
        json_object_set_new(s, "seconds", jreal(st->seconds));
        json_object_set_new(s, "global_batch_size", json_integer(st->global_batch));
        json_object_set_new(s, "max_microbatch", json_integer(st->max_microbatch));
        json_object_set_new(s, "reference_gpus", json_integer(st->ref_gpus));
        json_object_set_new(s, "reference_tokens_per_s_per_gpu", jreal(st->ref_tokens_per_s_per_gpu));
        json_object_set_new(s, "first_refusal", json_string(st->first_refusal));
        json_t *cpm = json_array(); /* the winner's layout with each rotate method (cp > 1) */
        for (int i = 0; i < st->n_cp_methods; i++) {
            const struct plan_cp_method *e = &st->cp_methods[i];
            double bytes, exposed;
            cp_comm(&e->r, &bytes, &exposed);
            json_t *one = json_pack("{s:s, s:b, s:s}", "method", e->r.layout.knob[st->cp_knob].value, "evaluated", e->evaluated,
                                    "note", e->note);
            if (one && e->evaluated) {
                json_object_set_new(one, "fits", json_boolean(e->r.fits));
                json_object_set_new(one, "tokens_per_s_per_gpu", jreal(e->r.tokens_per_s_per_gpu));
                json_object_set_new(one, "step_time_s", jreal(e->r.step_time));
                json_object_set_new(one, "attention_s", jreal(e->r.t_attention));
                json_object_set_new(one, "recompute_s", jreal(e->r.t_recompute));
                json_object_set_new(one, "comm_exposed_s", jreal(e->r.t_comm_exposed));
                json_object_set_new(one, "cp_comm_bytes", jreal(bytes));
                json_object_set_new(one, "cp_comm_exposed_s", jreal(exposed));
                json_object_set_new(one, "memory_gib", jreal(e->r.mem_total / GIB));
            }
            json_array_append_new(cpm, one);
        }
        json_object_set_new(s, "cp_methods", cpm);
        json_object_set_new(root, "search", s);
        json_t *g = json_object();
        json_object_set_new(g, "rule", json_string(st->rule ? st->rule : ""));
        json_object_set_new(g, "agrees", json_boolean(st->agrees));
        json_object_set_new(g, "refused", json_string(st->rule_evaluated ? "" : st->rule_err));
        json_object_set_new(g, "note", json_string(st->rule_evaluated ? st->rule_err : ""));
        if (st->rule_evaluated) json_object_set_new(g, "layout", result_json(&st->rule_result, hw));
        else json_object_set_new(g, "layout", json_null());
        json_object_set_new(root, "guide", g);
    }
    if (json_dumpf(root, f, JSON_INDENT(2) | JSON_REAL_PRECISION(9)) || fputc('\n', f) == EOF) {
        rc = ct_fail(CT_ERR_IO, "writing the JSON failed: %s", strerror(errno));
        goto out;
    }
    rc = CT_OK;
out:
    if (rc == CT_ERR_NOMEM) ct_set_error("out of memory building the JSON");
    json_decref(root);
    json_decref(layouts);
    return rc;
}

/* ---- manifest ---- */

typedef struct kv {
    char *key, *value;
    int is_seq;
} kv;

typedef struct kvs {
    kv *v;
    int n, cap;
    int oom;
} kvs;

static kv *kv_find(kvs *s, const char *key) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->v[i].key, key)) return &s->v[i];
    return NULL;
}

static void kv_set(kvs *s, const char *key, const char *value, int is_seq) {
    kv *e = kv_find(s, key);
    char *v = strdup(value);
    if (!v) {
        s->oom = 1;
        return;
    }
    if (e) {
        free(e->value);
        e->value = v, e->is_seq = is_seq;
        return;
    }
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        kv *g = realloc(s->v, sizeof *g * (size_t)cap);
        if (!g) {
            free(v);
            s->oom = 1;
            return;
        }
        s->v = g, s->cap = cap;
    }
    char *k = strdup(key);
    if (!k) {
        free(v);
        s->oom = 1;
        return;
    }
    s->v[s->n++] = (kv){k, v, is_seq};
}

static void kv_del(kvs *s, const char *key) {
    kv *e = kv_find(s, key);
    if (!e) return;
    free(e->key), free(e->value);
    *e = s->v[--s->n];
}

static void kv_setf(kvs *s, const char *key, const char *fmt, long long v) {
    char buf[64];
    snprintf(buf, sizeof buf, fmt, v);
    kv_set(s, key, buf, 0);
}

/* Keys compared component by component: '.' before every other character keeps a section's keys
 * together. */
static int key_cmp(const void *a, const void *b) {
    const unsigned char *x = (const unsigned char *)((const kv *)a)->key, *y = (const unsigned char *)((const kv *)b)->key;
    for (; *x && *x == *y; x++, y++) {
    }
    int cx = *x == '.' ? 1 : *x, cy = *y == '.' ? 1 : *y;
    return cx - cy;
}

static void yaml_quoted(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\x%02x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

/* A number or boolean the schema types as one, written bare; everything else is quoted. */
static int plain_scalar(const manifest *mf, const char *key, const char *v) {
    int typed = 0;
    for (int i = 0; i < mf->n_schema && !typed; i++)
        typed = !strcmp(mf->schema[i].key, key) && mf->schema[i].type != CT_OPT_STRING;
    if (!typed || !*v) return 0;
    for (const char *p = v; *p; p++)
        if (!strchr("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.+-_", *p)) return 0;
    return 1;
}

/* A path beside the old manifest that the new one, elsewhere, would not find: made absolute. */
static char *moved_path(const manifest *mf, const char *v) {
    char joined[PATH_MAX], real[PATH_MAX];
    if (!*v || v[0] == '/' || access(v, F_OK) == 0) return NULL;
    if (snprintf(joined, sizeof joined, "%s/%s", mf->dir, v) >= (int)sizeof joined || access(joined, F_OK) != 0) return NULL;
    if (!realpath(joined, real)) return NULL;
    return strdup(real);
}

ct_status plan_write_manifest(const manifest *mf, const plan_layout *l, const char *path) {
    kvs s = {0};
    ct_status rc = CT_ERR_IO;
    FILE *f = NULL;
    for (int i = 0; i < mf->n_values; i++) {
        const mf_value *v = &mf->values[i];
        if (!v->value) continue;
        char *moved = v->is_seq ? NULL : moved_path(mf, v->value);
        kv_set(&s, v->key, moved ? moved : v->value, v->is_seq);
        free(moved);
    }
    kv_setf(&s, mesh_degree_keys[CT_AXIS_DP_REPLICATE], "%lld", l->dp_replicate);
    kv_setf(&s, mesh_degree_keys[CT_AXIS_DP_SHARD], "%lld", l->dp_shard);
    kv_setf(&s, mesh_degree_keys[CT_AXIS_CP], "%lld", l->cp);
    kv_setf(&s, mesh_degree_keys[CT_AXIS_TP], "%lld", l->tp);
    kv_setf(&s, mesh_degree_keys[CT_AXIS_PP], "%lld", l->pp);
    kv_setf(&s, "parallelism.pipeline_parallel_microbatch_size", "%lld", l->pp_microbatch_size);
    if (l->schedule[0]) kv_set(&s, "parallelism.pipeline_parallel_schedule", l->schedule, 0);
    if (l->ep > 1 || kv_find(&s, MESH_EP_DEGREE_KEY)) kv_setf(&s, MESH_EP_DEGREE_KEY, "%lld", l->ep > 1 ? l->ep : 1);
    kv_setf(&s, "training.local_batch_size", "%lld", l->local_batch);
    kv_setf(&s, "training.global_batch_size", "%lld", l->global_batch);
    kv_set(&s, "activation_checkpoint.mode",
           l->ac == PLAN_AC_NONE ? "none" : l->ac == PLAN_AC_FULL ? "full" : "selective", 0);
    if (l->ac == PLAN_AC_SELECTIVE_OP) kv_set(&s, "activation_checkpoint.selective_ac_option", "op", 0);
    if (l->ac == PLAN_AC_SELECTIVE_LAYER) kv_setf(&s, "activation_checkpoint.selective_ac_option", "%lld", l->ac_every);
    if (l->offload) kv_setf(&s, "activation_offload.layers", "%lld", l->offload);
    else kv_del(&s, "activation_offload.layers"); /* (0 is the default) */
    /* the quantizer is on by its own switch (a knob) alone: torchtitan's other spellings go */
    for (int i = 0; tt_quantizer_recipe_keys[i]; i++) kv_del(&s, tt_quantizer_recipe_keys[i]);
    kv *conv = kv_find(&s, "model.converters");
    if (conv && !l->quant) { /* only the converters that do not quantize stay */
        char kept[4096] = "";
        for (char *item = conv->value; *item;) {
            size_t n = strcspn(item, ",");
            if (!tt_converter_quantizes(item, n))
                snprintf(kept + strlen(kept), sizeof kept - strlen(kept), "%s%.*s", kept[0] ? "," : "", (int)n, item);
            item += n + (item[n] == ',');
        }
        if (kept[0]) kv_set(&s, "model.converters", kept, 1);
        else kv_del(&s, "model.converters");
    }
    /* the plugins' knobs where they count (the quantizer's switch always), as the layout sets them; one
     * that does not count keeps the layout's value where the manifest (or an evaluation's setting of
     * it) has the key, and goes where the layout leaves it unset */
    for (int i = 0; i < l->n_knobs; i++) {
        const plan_setting *k = &l->knob[i];
        if (!k->value[0]) {
            if (!plan_knob_applies(k, l)) kv_del(&s, k->key);
        } else if (plan_knob_applies(k, l) || kv_find(&s, k->key)) {
            kv_set(&s, k->key, k->value, 0);
        }
    }
    kv_set(&s, "compile.enable", l->compile ? "true" : "false", 0);
    if (s.oom) {
        rc = ct_fail(CT_ERR_NOMEM, "out of memory");
        goto out;
    }
    qsort(s.v, (size_t)s.n, sizeof *s.v, key_cmp);
    if (!(f = ct_fopen_nofollow(path, "w"))) {
        ct_set_error("%s: cannot write the manifest: %s", path, ct_open_strerror(errno));
        goto out;
    }
    char line[512];
    plan_layout_line(l, line, sizeof line);
    fprintf(f, "# Written by ctitan plan from %s:\n#   %s\n", mf->path, line);
    const char *prev = "";
    for (int i = 0; i < s.n; i++) {
        const char *k = s.v[i].key;
        /* the maps this key shares with the previous one stay open; the rest open here */
        int depth = 0;
        const char *p = prev, *q = k;
        for (;;) {
            size_t a = strcspn(p, "."), b = strcspn(q, ".");
            if (!p[a] || !q[b] || a != b || strncmp(p, q, a)) break;
            depth++, p += a + 1, q += b + 1;
        }
        for (int d = depth;; d++) {
            size_t b = strcspn(q, ".");
            if (!q[b]) break;
            fprintf(f, "%*s%.*s:\n", 2 * d, "", (int)b, q);
            q += b + 1, depth = d + 1;
        }
        fprintf(f, "%*s%s: ", 2 * depth, "", q);
        if (s.v[i].is_seq) {
            fputc('[', f);
            for (const char *it = s.v[i].value; *it;) {
                size_t n = strcspn(it, ",");
                char one[1024];
                snprintf(one, sizeof one, "%.*s", (int)n, it);
                if (it != s.v[i].value) fputs(", ", f);
                yaml_quoted(f, one);
                it += n + (it[n] == ',');
            }
            fputs("]\n", f);
        } else if (plain_scalar(mf, k, s.v[i].value)) {
            fprintf(f, "%s\n", s.v[i].value);
        } else {
            yaml_quoted(f, s.v[i].value);
            fputc('\n', f);
        }
        prev = k;
    }
    if (ferror(f) | fclose(f)) {
        f = NULL;
        ct_set_error("%s: writing the manifest failed: %s", path, strerror(errno));
        goto out;
    }
    f = NULL;
    rc = CT_OK;
out:
    if (f) fclose(f);
    for (int i = 0; i < s.n; i++) free(s.v[i].key), free(s.v[i].value);
    free(s.v);
    return rc;
}
