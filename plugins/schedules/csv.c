/* csv.c: a schedule read from a file (torchtitan's parallelism.pipeline_parallel_schedule_csv, PyTorch's
 * compute-only CSV format), so a user can hand-write or generate any order and check it with
 * `ctitan schedule --name csv --csv FILE`.
 *
 * One row per pp rank, in rank order (the first row is rank 0); each row lists the rank's actions in
 * the order it runs them, comma-separated. A cell is <stage><op><microbatch>: `0F0` forward of
 * microbatch 0 through stage 0, `3B2` its whole backward, `3I2` / `3W2` the backward split into the
 * input and the weight gradients. Whitespace around cells is ignored and empty cells are skipped
 * (PyTorch writes idle steps as empty cells); lines that are blank or start with `#` are not rows.
 * Loop placement (stage s on rank s % pp); stages per rank are what the caller says, or with no split
 * named, as many as the file names (stages_per_rank).
 *
 * The file is untrusted: every refusal names file:line:column, the rank and the cell
 * (tests/fuzz/fuzz_schedule_csv.c feeds this parser arbitrary bytes). */
#include "schedule_common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define CSV_MAX_BYTES (64L << 20)

static void csv_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void csv_err(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static int csv_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }
static int csv_digit(char c) { return c >= '0' && c <= '9'; }

/* Reads up to 9 digits at *p into *out; -1 when there are none or too many. */
static int csv_number(const char **p, const char *end, int *out) {
    int v = 0, k = 0;
    for (; *p < end && csv_digit(**p); (*p)++, k++) {
        if (k == 9) return -1;
        v = v * 10 + (**p - '0');
    }
    *out = v;
    return k ? 0 : -1;
}

/* The cell as text for a message: at most 24 bytes, unprintable bytes as '?'. */
static void csv_cell_text(const char *b, const char *e, char *out, size_t len) {
    size_t n = 0;
    for (; b < e && n + 4 < len && n < 24; b++) out[n++] = (*b >= 0x20 && *b < 0x7f) ? *b : '?';
    if (b < e) out[n++] = '.', out[n++] = '.', out[n++] = '.';
    out[n] = 0;
}

typedef struct csv_pos {
    const char *path;
    int line, col, row;
} csv_pos;

/* Parses one cell [b, e) (already trimmed, not empty) into *a. 0, or -1 with a message. */
static int csv_cell(const csv_pos *at, const char *b, const char *e, int n_stages, int n_mb, ct_pp_action *a,
                    char *err, size_t errlen) {
    char text[32];
    csv_cell_text(b, e, text, sizeof text);
    const char *p = b;
    const char *fmt = "%s:%d:%d: rank %d: cell '%s': %s";
    if (csv_number(&p, e, &a->stage)) {
        const char *why = p < e && csv_digit(*p) ? "stage number too long"
                                                 : "expected <stage><F|B|I|W><microbatch>, e.g. 0F0 or 3I2";
        csv_err(err, errlen, fmt, at->path, at->line, at->col, at->row, text, why);
        return -1;
    }
    char op = p < e ? *p++ : 0;
    a->op = op == 'F' ? CT_PP_F : op == 'B' ? CT_PP_B : op == 'I' ? CT_PP_I : op == 'W' ? CT_PP_W : 0;
    if (!a->op) {
        csv_err(err, errlen, fmt, at->path, at->line, at->col, at->row, text,
                "expected an op F, B, I or W after the stage number (<stage><op><microbatch>, e.g. 0F0)");
        return -1;
    }
    if (csv_number(&p, e, &a->microbatch) || p != e) {
        const char *why = p < e && csv_digit(*p) ? "microbatch number too long"
                                                 : "expected a microbatch number to end the cell (<stage><op><microbatch>, e.g. 0F0)";
        csv_err(err, errlen, fmt, at->path, at->line, at->col, at->row, text, why);
        return -1;
    }
    if (a->stage >= n_stages || a->microbatch >= n_mb) {
        int stage_bad = a->stage >= n_stages;
        csv_err(err, errlen, "%s:%d:%d: rank %d: cell '%s': %s %d is outside 0..%d (%d %s)", at->path, at->line,
                at->col, at->row, text, stage_bad ? "stage" : "microbatch", stage_bad ? a->stage : a->microbatch,
                (stage_bad ? n_stages : n_mb) - 1, stage_bad ? n_stages : n_mb, stage_bad ? "stages" : "microbatches");
        return -1;
    }
    return 0;
}

/* Parses the CSV text [text, text + len) for a pipeline of shape s: checks every row, writes the
 * actions of row s->rank into w. 0, or -1 with a one-line message in err. */
/* Parses the file for rank s->rank (none when -1) into w; *max_stage (may be NULL) gets the largest
 * stage any row names. */
static int csv_parse(const char *path, const char *text, size_t len, const ct_schedule_shape *s, sched_writer *w,
                     int *max_stage, char *err, size_t errlen) {
    int n_stages = s->pp_size * s->stages_per_rank;
    csv_pos at = {path, 0, 0, 0};
    const char *end = text + len;
    for (const char *line = text; line < end;) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol) eol = end;
        at.line++;
        const char *q = line;
        while (q < eol && csv_space(*q)) q++;
        if (q < eol && *q != '#') {
            if (at.row >= s->pp_size) {
                csv_err(err, errlen, "%s:%d: a row for rank %d, but the pipeline has %d rank%s (one row per rank)",
                        path, at.line, at.row, s->pp_size, s->pp_size == 1 ? "" : "s");
                return -1;
            }
            for (const char *cell = line; cell <= eol;) {
                const char *comma = memchr(cell, ',', (size_t)(eol - cell));
                const char *ce = comma ? comma : eol, *cb = cell;
                while (cb < ce && csv_space(*cb)) cb++;
                while (ce > cb && csv_space(ce[-1])) ce--;
                if (cb < ce) {
                    ct_pp_action a;
                    at.col = (int)(cb - line) + 1;
                    if (csv_cell(&at, cb, ce, n_stages, s->n_microbatches, &a, err, errlen)) return -1;
                    if (at.row == s->rank) sched_emit(w, a.op, a.stage, a.microbatch);
                    if (max_stage && a.stage > *max_stage) *max_stage = a.stage;
                }
                if (!comma) break;
                cell = comma + 1;
            }
            at.row++;
        }
        line = eol + 1;
    }
    if (at.row != s->pp_size) {
        csv_err(err, errlen, "%s: %d row%s of actions, but the pipeline has %d ranks (one row per rank, row r = rank r)",
                path, at.row, at.row == 1 ? "" : "s", s->pp_size);
        return -1;
    }
    return 0;
}

/* Reads the whole file into a NUL-terminated buffer (the caller frees it). */
static char *csv_read(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        csv_err(err, errlen, "cannot open the schedule CSV %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            size_t grown = cap ? cap * 2 : 4096;
            char *b = grown <= (size_t)CSV_MAX_BYTES ? realloc(buf, grown + 1) : NULL;
            if (!b) {
                csv_err(err, errlen, "%s: %s", path, grown > (size_t)CSV_MAX_BYTES ? "larger than 64 MiB: not a schedule"
                                                                                  : "out of memory");
                goto fail;
            }
            buf = b;
            cap = grown;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        csv_err(err, errlen, "cannot read the schedule CSV %s", path);
        goto fail;
    }
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
fail:
    free(buf);
    fclose(f);
    return NULL;
}

static ct_status csv_actions(const ct_host *h, const ct_schedule_shape *s, ct_pp_action *out, int cap, int *n);
static ct_status csv_stages_per_rank(const ct_host *h, const ct_schedule_shape *s, int *spr);

static const ct_schedule_api api = {
    .struct_size = sizeof(ct_schedule_api),
    .placement = CT_PP_LOOP,
    .min_stages_per_rank = 1,
    .max_stages_per_rank = 0,
    .actions = csv_actions,
    .stages_per_rank = csv_stages_per_rank,
};

/* As many stages per rank as the file names stages (torchtitan derives them from the file too). */
static ct_status csv_stages_per_rank(const ct_host *h, const ct_schedule_shape *s, int *spr) {
    if (!s->csv_path || !*s->csv_path || s->pp_size < 1) {
        *spr = 1; /* actions says what is missing */
        return CT_OK;
    }
    char err[1024];
    size_t len = 0;
    char *text = csv_read(s->csv_path, &len, err, sizeof err);
    if (!text) {
        h->set_error(h, "%s", err);
        return CT_ERR_IO;
    }
    ct_schedule_shape any = *s; /* every stage and microbatch number allowed: the file's own are counted */
    any.stages_per_rank = (1 << 20) / s->pp_size;
    any.rank = -1;
    int max_stage = -1, bad = csv_parse(s->csv_path, text, len, &any, NULL, &max_stage, err, sizeof err);
    free(text);
    if (bad) {
        h->set_error(h, "%s", err);
        return CT_ERR_INVALID;
    }
    if (max_stage < 0 || (max_stage + 1) % s->pp_size) {
        h->set_error(h, "%s: the file names %d stages, which %d pipeline ranks cannot share evenly (stage s runs on "
                        "rank s %% %d)", s->csv_path, max_stage + 1, s->pp_size, s->pp_size);
        return CT_ERR_INVALID;
    }
    *spr = (max_stage + 1) / s->pp_size;
    return CT_OK;
}

static ct_status csv_actions(const ct_host *h, const ct_schedule_shape *s, ct_pp_action *out, int cap, int *n) {
    ct_status st = sched_check_shape(h, &api, s);
    if (st) return st;
    if (!s->csv_path || !*s->csv_path) {
        h->set_error(h, "the CSV schedule reads its actions from a file: set "
                        "parallelism.pipeline_parallel_schedule_csv (ctitan schedule: --csv FILE)");
        return CT_ERR_INVALID;
    }
    char err[1024];
    size_t len = 0;
    char *text = csv_read(s->csv_path, &len, err, sizeof err);
    if (!text) {
        h->set_error(h, "%s", err);
        return CT_ERR_IO;
    }
    sched_writer w = {out, cap, 0};
    int bad = csv_parse(s->csv_path, text, len, s, &w, NULL, err, sizeof err);
    free(text);
    if (bad) {
        h->set_error(h, "%s", err);
        return CT_ERR_INVALID;
    }
    return sched_finish(&w, n);
}

CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *host, ct_plugin_info *info) {
    (void)host;
    return sched_entry(info, "CSV", "pipeline schedule read from a CSV file, one row of <stage><F|B|I|W><microbatch> per rank",
                       &api);
}
