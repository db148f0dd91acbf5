/* search.h: what a layout search did besides ranking (plan.h's plan_search is the plain form). */
#ifndef CT_PLAN_SEARCH_H
#define CT_PLAN_SEARCH_H

#include "plan/plan.h"

/* The model's sizes the search needs (from the model's description). */
typedef struct plan_model_sizes {
    double n_params;
    int n_heads, n_kv_heads, n_layers;
} plan_model_sizes;

typedef struct plan_search_stats {
    plan_model_sizes model;
    int64_t global_batch;  /* sequences per step, the same for every layout */
    long meshes;           /* dp_replicate x dp_shard x cp x tp x pp that multiply to the GPUs and divide the model */
    long pruned;           /* meshes whose parameters, gradients and optimizer states alone exceed the capacity */
    long evaluated;        /* plan_eval calls (every GPU count searched, the guide's layout included) */
    long refused;          /* of those, layouts the plugins refused */
    long fitting;          /* of those, layouts that fit */
    int full_meshes;       /* meshes whose knobs were tuned (the best of the first pass) */
    char first_refusal[256];
    double seconds;
    /* scaling efficiency's reference: the smallest count gpus / 2^k with a layout that fits */
    int ref_gpus;
    double ref_tokens_per_s_per_gpu;
    /* the largest microbatch that fits with the winner's other settings (pp_microbatch_size when
     * pp > 1, else local_batch_size), 0 when nothing fits */
    int64_t max_microbatch;
    /* the guide's rule for this model size, its layout evaluated, and whether the winner agrees */
    const char *rule;
    plan_layout rule_layout;
    plan_result rule_result;
    int rule_evaluated;    /* 0: the plugins refused it (rule_err says why) */
    char rule_err[256];
    int agrees;            /* the winner is of the rule's kind (FSDP alone, FSDP x TP, 3D with pp) */
    /* context parallel, where the winner has cp > 1 and the cp strategy declares a string search knob
     * (its rotate method): the winner's layout planned with each of its values (its other settings
     * held), in the strategy's order, so the output can say why the winner's value won. evaluated 0:
     * refused, note says why. */
    int n_cp_methods;
    int cp_knob; /* the knob: r.layout.knob[cp_knob] names each entry's value */
    struct plan_cp_method {
        plan_result r;
        int evaluated;
        char note[200];
    } cp_methods[4];
} plan_search_stats;

/* plan_search with its statistics (stats may be NULL). */
ct_status plan_search_ex(plan_ctx *ctx, const plan_search_opts *o, const hw_profile *hw, plan_result **out, int *n,
                         plan_search_stats *stats);

/* The model's sizes (n_kv_heads 0: the model did not say). */
void plan_model_sizes_get(const plan_ctx *ctx, plan_model_sizes *ms);

/* The rule's kind for a layout: 0 FSDP (or DDP) alone, 1 with TP, 2 with PP. */
int plan_layout_kind(const plan_layout *l);

#endif
