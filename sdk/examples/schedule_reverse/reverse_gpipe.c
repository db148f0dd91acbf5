/* reverse_gpipe.c: an out-of-tree pipeline schedule, built from the SDK headers alone.
 *
 * "ReverseGPipe": GPipe whose backwards run last-in first-out. Every rank runs all its forwards in
 * microbatch order, then the backwards from the last microbatch to the first, the order in which
 * a single process's autograd would unwind them. The last stage can start the backward of the
 * microbatch it just finished, so the bubble is GPipe's; the peak activations are too (all of them).
 *
 * A schedule is pure logic (ctitan/schedule.h): given the pipeline's shape and one rank, write that
 * rank's actions in order. The host calls it once per rank, checks the lists (`ctitan schedule
 * --name ./reverse_gpipe.so --pp 4 --microbatches 8`) and the pp runtime runs them.
 *
 * Its one option, parallelism.reverse_group (default 0), shows how a schedule takes options: the
 * host checks the value against the declared type and range (in a manifest, or on `ctitan train`'s
 * or `ctitan schedule`'s command line as --parallelism.reverse_group=2) and the schedule reads it
 * with h->opt_int. With G > 0 the microbatches run in groups of G: a group's forwards, then its
 * backwards last-in first-out, then the next group; a rank holds at most G microbatches'
 * activations instead of all of them, for a larger bubble. */
#include <ctitan/schedule.h>

static ct_status reverse_actions(const ct_host *h, const ct_schedule_shape *s, ct_pp_action *out, int cap, int *n);

static const ct_option_spec options[] = {
    {sizeof(ct_option_spec), "reverse_group", CT_OPT_INT, "0",
     "microbatches per group: each group's forwards, then its backwards last-in first-out (0: one group of all)",
     "[0, 1048576]", NULL},
    {0},
};

static const ct_schedule_api api = {
    .struct_size = sizeof(ct_schedule_api),
    .placement = CT_PP_LOOP, /* stage s on rank s % pp; with 1 stage per rank, stage r on rank r */
    .min_stages_per_rank = 1,
    .max_stages_per_rank = 1,
    .actions = reverse_actions,
};

/* The host allocated out and set each element's struct_size: step by it (CT_AT), never out[k], and
 * write fields one by one so struct_size stays (a newer host's elements are larger than ours). */
static void put(ct_pp_action *out, int k, int op, int stage, int microbatch) {
    ct_pp_action *a = CT_AT(ct_pp_action, out, k);
    a->op = op;
    a->stage = stage;
    a->microbatch = microbatch;
}

static ct_status reverse_actions(const ct_host *h, const ct_schedule_shape *s, ct_pp_action *out, int cap, int *n) {
    if (s->struct_size < sizeof *s || s->n_microbatches < 1 || s->rank < 0 || s->rank >= s->pp_size) {
        h->set_error(h, "bad shape: rank %d of %d, %d microbatches", s->rank, s->pp_size, s->n_microbatches);
        return CT_ERR_INVALID;
    }
    if (s->stages_per_rank != 1) {
        h->set_error(h, "runs exactly 1 stage per rank, got %d", s->stages_per_rank);
        return CT_ERR_INVALID;
    }
    int64_t group = 0; /* the host checked it lies in the declared range */
    if (h->opt_int(h, "reverse_group", &group) != CT_OK) return CT_ERR_INVALID; /* the host said why */
    /* 2 m actions; when they do not fit, say how many are needed (the host retries) */
    int m = s->n_microbatches, k = 0, g = group > 0 && group < m ? (int)group : m;
    *n = 2 * m;
    if (cap < 2 * m) return CT_ERR_INVALID;
    for (int first = 0; first < m; first += g) { /* microbatches first .. last of one group */
        int last = first + g < m ? first + g - 1 : m - 1;
        for (int mb = first; mb <= last; mb++) put(out, k++, CT_PP_F, s->rank, mb);
        for (int mb = last; mb >= first; mb--) put(out, k++, CT_PP_B, s->rank, mb);
    }
    return CT_OK;
}

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    info->abi_major = CT_ABI_MAJOR;
    info->abi_minor = CT_ABI_MINOR;
    info->kind = CT_KIND_SCHEDULE;
    info->name = "ReverseGPipe";
    info->description = "pipeline schedule: GPipe with the backwards last-in first-out (an SDK example)";
    info->options = options;
    info->api = &api;
    return CT_OK;
}
