/* cmd_plot.c: `ctitan plot`, training runs' curves from their metrics.jsonl, drawn with cairo (its
 * SVG surface for .svg, its image surface written as PNG for .png). */
#include "cmd/cmd_plot.h"
#include "engine/mesh.h"
#include "base/error.h"

#include <cairo/cairo-svg.h>
#include <cairo/cairo.h>
#include <errno.h>
#include <fontconfig/fontconfig.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char usage[] =
    "usage: ctitan plot RUN_DIR... --output FILE.svg|FILE.png [--metric FIELD] [--x step|tokens]\n"
    "                   [--label NAME]... [--title TEXT] [--log-y] [--smooth W] [--size WxH]\n"
    "\n"
    "Draws one curve per training run (its dump folder's metrics.jsonl) against step or tokens, each\n"
    "labelled by its layout as its start record gives it (\"dp_shard 2, tp 2, bf16\"). A run resumed\n"
    "several times plots the last value logged for each step.\n"
    "\n"
    "  --output FILE       the picture: .svg (vector) or .png\n"
    "  --metric FIELD      a numeric field of the records that have a step (default loss): grad_norm, lr,\n"
    "                      tps, mfu, memory.peak_bytes (a dot enters a nested object), validation_loss\n"
    "                      (the validation records), ...\n"
    "  --x step|tokens     the x axis: the step (default) or tokens trained on so far (steps x the\n"
    "                      tokens per step in the run's start record)\n"
    "  --label NAME        the legend name of the next run, in order (one per --label; the rest keep\n"
    "                      their layout's)\n"
    "  --title TEXT        a title above the plot\n"
    "  --log-y             a logarithmic y axis (every value must be positive)\n"
    "  --smooth W          also draw TensorBoard's smoothing: a debiased moving average of weight W in\n"
    "                      [0, 1) over the raw curve, which stays behind it, faint (default 0: none)\n"
    "  --size WxH          the picture's size in pixels (default 800x500; 240x180 to 8000x8000)\n"
    "  --help              this text\n";

/* Okabe and Ito's colour-blind-safe palette (yellow left out: too pale on white); after seven runs
 * the colours repeat dashed. */
static const double palette[][3] = {
    {0.000, 0.447, 0.698}, /* blue */
    {0.835, 0.369, 0.000}, /* vermillion */
    {0.000, 0.620, 0.451}, /* bluish green */
    {0.800, 0.475, 0.655}, /* reddish purple */
    {0.902, 0.624, 0.000}, /* orange */
    {0.337, 0.706, 0.914}, /* sky blue */
    {0.000, 0.000, 0.000}, /* black */
};
#define NPALETTE ((int)(sizeof palette / sizeof palette[0]))
#define MAX_TICKS 64

typedef struct plot_args {
    const char **dirs, **labels;
    int n_dirs, n_labels;
    const char *output, *metric, *title;
    int x_tokens, log_y, png, width, height;
    double smooth;
} plot_args;

typedef struct plot_point {
    int64_t step, seq; /* seq: the record's place in the file; a later one wins its step */
    int64_t tps;       /* tokens per step of the start this record belongs to (-1: not known) */
    double x, y;
} plot_point;

typedef struct plot_run {
    const char *dir;
    char path[4200], label[512];
    plot_point *pts;
    int n, cap;
    double *smoothed;
} plot_run;

static ct_status usage_error(const char *msg, const char *arg) {
    fprintf(stderr, "ctitan plot: %s%s%s (see ctitan plot --help)\n", msg, arg ? " " : "", arg ? arg : "");
    return CT_ERR_INVALID;
}

/* ---- ticks and smoothing (exported for the unit tests) ---- */

int plot_nice_ticks(double lo, double hi, int min_ticks, double *first, double *step) {
    if (!(lo < hi) || !isfinite(lo) || !isfinite(hi) || !isfinite(hi - lo) || min_ticks < 2 || min_ticks > 20) return 0;
    static const double mult[] = {5, 2, 1};
    double p = pow(10.0, ceil(log10(hi - lo)));
    for (int k = 0; k < 400; k++, p /= 10) /* from a step as wide as the range down */
        for (int m = 0; m < 3; m++) {
            double s = mult[m] * p, eps = s * 1e-9;
            double a = ceil((lo - eps) / s), b = floor((hi + eps) / s);
            if (b - a + 1 < min_ticks) continue;
            *first = a * s;
            *step = s;
            return (int)(b - a + 1);
        }
    return 0;
}

void plot_smooth_ema(const double *v, double *out, int n, double w) {
    double last = 0;
    for (int i = 0; i < n; i++) {
        last = last * w + (1 - w) * v[i];
        double debias = 1 - pow(w, i + 1);
        out[i] = debias > 0 ? last / debias : v[i];
    }
}

/* ---- reading a run ---- */

/* The value at a dotted path ("memory.peak_bytes") of an object, or NULL. */
static json_t *field_get(json_t *obj, const char *path) {
    char key[256];
    while (obj && json_is_object(obj)) {
        const char *dot = strchr(path, '.');
        size_t len = dot ? (size_t)(dot - path) : strlen(path);
        if (len >= sizeof key) return NULL;
        memcpy(key, path, len);
        key[len] = 0;
        obj = json_object_get(obj, key);
        if (!dot) return obj;
        path = dot + 1;
    }
    return NULL;
}

/* The legend name a start record's layout gives: the mesh axes above 1 (or "1 rank"), then the
 * precision. 0, or -1 when the record has no layout (written by an older ctitan). */
static int layout_label(json_t *start, char *out, size_t len) {
    const char *const *axes = mesh_axis_names; /* as train writes them */
    json_t *lay = json_object_get(start, "layout");
    if (!json_is_object(lay)) return -1;
    size_t k = 0;
    out[0] = 0;
    for (size_t i = 0; i < CT_MESH_NAXES; i++) {
        json_int_t d = json_integer_value(json_object_get(lay, axes[i]));
        if (d > 1 && k < len)
            k += (size_t)snprintf(out + k, len - k, "%s%s %lld", k ? ", " : "", axes[i], (long long)d);
    }
    if (!k && k < len) k += (size_t)snprintf(out, len, "1 rank");
    const char *f8 = json_string_value(json_object_get(lay, "float8"));
    const char *mp = json_string_value(json_object_get(lay, "param_dtype"));
    const char *prec = f8 ? NULL : mp && !strcmp(mp, "bfloat16") ? "bf16" : mp && !strcmp(mp, "float32") ? "fp32" : mp;
    if (k < len && f8) snprintf(out + k, len - k, ", float8 %s", f8);
    else if (k < len && prec) snprintf(out + k, len - k, ", %s", prec);
    return 0;
}

/* Adds the record's top-level keys that `keys` lacks (for the message when no record has the field). */
static void keys_note(json_t *rec, char *keys, size_t len) {
    const char *key;
    json_t *v;
    json_object_foreach(rec, key, v) {
        char item[300];
        snprintf(item, sizeof item, "%s%s", key, json_is_object(v) ? ".*" : "");
        size_t n = strlen(keys), il = strlen(item);
        int seen = 0;
        for (const char *p = keys; (p = strstr(p, item)); p++)
            if ((p == keys || p[-1] == ' ') && (p[il] == ',' || !p[il])) seen = 1;
        if (!seen && n + il + 3 < len) snprintf(keys + n, len - n, "%s%s", n ? ", " : "", item);
    }
}

/* ctitan writes a diverged run's values with printf ("nan", "-inf"), which JSON has no words for:
 * a copy of the line (out: at least 2 x its length + 1 bytes) with those tokens after a colon as
 * null, so the record still reads and the point is left out. 1 when there was one. */
static int nonfinite_to_null(const char *line, char *out) {
    static const char *const words[] = {"-nan", "nan", "-inf", "inf"};
    int changed = 0;
    while (*line) {
        *out++ = *line;
        if (*line++ != ':') continue;
        while (*line == ' ') *out++ = *line++;
        for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
            size_t n = strlen(words[i]);
            if (strncmp(line, words[i], n) || (line[n] != ',' && line[n] != '}' && line[n] != ' ')) continue;
            memcpy(out, "null", 4);
            out += 4;
            line += n;
            changed = 1;
            break;
        }
    }
    *out = 0;
    return changed;
}

static int point_cmp(const void *pa, const void *pb) {
    const plot_point *a = pa, *b = pb;
    if (a->step != b->step) return a->step < b->step ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/* CT_OK, or CT_ERR_NOMEM with nothing set (as before: the command says nothing more). */
static ct_status point_add(plot_run *r, plot_point p) {
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 256;
        plot_point *q = realloc(r->pts, sizeof *q * (size_t)cap);
        if (!q) return CT_ERR_NOMEM;
        r->pts = q;
        r->cap = cap;
    }
    r->pts[r->n++] = p;
    return CT_OK;
}

/* One record (a line of the file) into the run: a start record sets the label and tokens per step;
 * a record with a step and the field adds a point. */
static ct_status record_take(plot_run *r, const plot_args *a, json_t *rec, int line, int64_t *tps, char *keys,
                             size_t keys_len) {
    const char *ev = json_string_value(json_object_get(rec, "event"));
    if (ev && !strcmp(ev, "start")) {
        json_t *t = json_object_get(rec, "tokens_per_step");
        *tps = json_is_integer(t) && json_integer_value(t) > 0 ? (int64_t)json_integer_value(t) : -1;
        if (layout_label(rec, r->label, sizeof r->label)) r->label[0] = 0;
        return CT_OK;
    }
    json_t *st = json_object_get(rec, "step");
    if (!st) return CT_OK;
    if (!json_is_integer(st) || json_integer_value(st) < 0) {
        fprintf(stderr, "ctitan plot: %s:%d: \"step\" is not a step number\n", r->path, line);
        return CT_ERR_INVALID;
    }
    json_t *v = field_get(rec, a->metric);
    if (!v) {
        keys_note(rec, keys, keys_len);
        return CT_OK;
    }
    if (json_is_null(v)) { /* a non-finite value (nonfinite_to_null): a gap, said on stdout */
        keys_note(rec, keys, keys_len);
        printf("plot: %s:%d: \"%s\" is not finite at step %lld; left out\n", r->path, line, a->metric,
               (long long)json_integer_value(st));
        return CT_OK;
    }
    if (!json_is_number(v)) {
        fprintf(stderr, "ctitan plot: %s:%d: \"%s\" is not a number\n", r->path, line, a->metric);
        return CT_ERR_INVALID;
    }
    if (a->x_tokens && *tps < 0) {
        fprintf(stderr, "ctitan plot: %s:%d: --x tokens: no start record before it gives tokens_per_step (written by "
                        "an older ctitan?); plot against steps\n", r->path, line);
        return CT_ERR_INVALID;
    }
    plot_point p = {(int64_t)json_integer_value(st), r->n, *tps, 0, json_number_value(v)};
    return point_add(r, p);
}

/* After reading: one point per step (the last logged), x as step or cumulative tokens. */
static void run_points_finish(plot_run *r, const plot_args *a) {
    qsort(r->pts, (size_t)r->n, sizeof *r->pts, point_cmp);
    int k = 0;
    for (int i = 0; i < r->n; i++) {
        if (k && r->pts[k - 1].step == r->pts[i].step) k--; /* the later record of this step wins */
        r->pts[k++] = r->pts[i];
    }
    r->n = k;
    double tokens = 0;
    int64_t prev = 0;
    for (int i = 0; i < r->n; i++) {
        tokens += (double)(r->pts[i].step - prev) * (double)r->pts[i].tps; /* the steps up to this one */
        prev = r->pts[i].step;
        r->pts[i].x = a->x_tokens ? tokens : (double)r->pts[i].step;
    }
}

static ct_status run_read(plot_run *r, const plot_args *a) {
    struct stat sb;
    if (stat(r->dir, &sb) || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "ctitan plot: %s: not a folder (a run's dump folder, holding metrics.jsonl)\n", r->dir);
        return CT_ERR_INVALID;
    }
    snprintf(r->path, sizeof r->path, "%s/metrics.jsonl", r->dir);
    FILE *f = fopen(r->path, "r");
    if (!f) {
        int gone = errno == ENOENT;
        fprintf(stderr, "ctitan plot: %s: %s%s\n", r->dir, gone ? "no metrics.jsonl" : "cannot read metrics.jsonl: ",
                gone ? " (not a training run's dump folder, or a run that never started)" : strerror(errno));
        return CT_ERR_INVALID;
    }
    char *line = NULL, keys[1024] = "";
    size_t cap = 0;
    ssize_t len;
    int lineno = 0;
    int64_t tps = -1;
    ct_status st = CT_OK;
    while (st == CT_OK && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (strspn(line, " \t\r\n") == (size_t)len) continue;
        json_error_t e;
        json_t *rec = json_loadb(line, (size_t)len, 0, &e);
        if (!rec) { /* perhaps a nan: read again with nulls for those */
            char *fixed = malloc(2 * (size_t)len + 1);
            if (fixed && nonfinite_to_null(line, fixed)) rec = json_loads(fixed, 0, &e);
            free(fixed);
        }
        if (!json_is_object(rec)) {
            fprintf(stderr, "ctitan plot: %s:%d: not a JSON object: %s\n", r->path, lineno,
                    rec ? "another value" : e.text);
            st = CT_ERR_INVALID;
        } else {
            st = record_take(r, a, rec, lineno, &tps, keys, sizeof keys);
        }
        json_decref(rec);
    }
    if (st == CT_OK && ferror(f)) {
        fprintf(stderr, "ctitan plot: cannot read %s: %s\n", r->path, strerror(errno));
        st = CT_ERR_IO;
    }
    free(line);
    fclose(f);
    if (st != CT_OK) return st;
    if (!r->n) {
        fprintf(stderr, "ctitan plot: %s: no record has a numeric \"%s\" (%s%s)\n", r->path, a->metric,
                keys[0] ? "records with a step have: " : "no record has a step", keys);
        return CT_ERR_INVALID;
    }
    for (int i = 0; i < r->n && a->log_y; i++)
        if (!(r->pts[i].y > 0)) {
            fprintf(stderr, "ctitan plot: %s: --log-y: \"%s\" is %g at step %lld; a log scale needs positive values\n",
                    r->path, a->metric, r->pts[i].y, (long long)r->pts[i].step);
            return CT_ERR_INVALID;
        }
    run_points_finish(r, a);
    return CT_OK;
}

/* Labels: --label in order, else the layout, else the folder; equal labels get their folder added. */
static void labels_assign(plot_run *runs, const plot_args *a) {
    for (int i = 0; i < a->n_dirs; i++) {
        if (i < a->n_labels) snprintf(runs[i].label, sizeof runs[i].label, "%s", a->labels[i]);
        else if (!runs[i].label[0]) snprintf(runs[i].label, sizeof runs[i].label, "%s", runs[i].dir);
    }
    for (int i = 0; i < a->n_dirs; i++) {
        int dup = 0;
        for (int j = 0; j < a->n_dirs; j++) dup |= j != i && !strcmp(runs[i].label, runs[j].label);
        if (dup && i >= a->n_labels) {
            size_t k = strlen(runs[i].label);
            snprintf(runs[i].label + k, sizeof runs[i].label - k, " (%s)", runs[i].dir);
        }
    }
}

/* ---- drawing ---- */

typedef struct axis {
    double lo, hi; /* the data range shown (log10 of it on a log axis) */
    int log;
    int n;
    double tick[MAX_TICKS]; /* in data units */
    char text[MAX_TICKS][32];
} axis;

/* A tick value as text: k/M/G/T suffixes from 10^4 up, powers of ten below 10^-3, else plain with
 * the decimals the step needs. */
static void tick_text(double v, double step, double maxabs, char *out, size_t len) {
    static const char *const suffix[] = {"", "k", "M", "G", "T"};
    if (fabs(v) < step * 1e-9) v = 0;
    int e = 0;
    if (maxabs >= 1e4) e = (int)floor(log10(maxabs) / 3);
    if (e > 4) e = 4;
    double scale = pow(1000.0, e), s = step / scale;
    int dec = s >= 1 ? 0 : (int)ceil(-log10(s) - 1e-9);
    if (maxabs > 0 && maxabs < 1e-3) { /* 3.5e-05: the mantissa's digits down to the step's */
        int m = (int)(floor(log10(maxabs)) - floor(log10(step) + 1e-9));
        snprintf(out, len, "%.*e", m < 0 ? 0 : m > 9 ? 9 : m, v);
        return;
    }
    snprintf(out, len, "%.*f%s", dec > 9 ? 9 : dec, v / scale, v ? suffix[e] : "");
}

/* The ticks of an axis over its range, at least min_ticks (fewer on a log axis of whole decades). */
static void axis_ticks(axis *ax, int min_ticks) {
    double first, step;
    ax->n = 0;
    if (ax->log && ax->hi - ax->lo >= 1) { /* decades */
        int n = plot_nice_ticks(ax->lo, ax->hi, min_ticks < 3 ? min_ticks : 2, &first, &step);
        if (step < 1) first = ceil(ax->lo), step = 1, n = (int)(floor(ax->hi) - first + 1);
        for (int i = 0; i < n && ax->n < MAX_TICKS; i++) {
            double v = pow(10.0, first + i * step);
            ax->tick[ax->n] = v;
            tick_text(v, v, v, ax->text[ax->n], sizeof ax->text[0]);
            ax->n++;
        }
        return;
    }
    double lo = ax->log ? pow(10.0, ax->lo) : ax->lo, hi = ax->log ? pow(10.0, ax->hi) : ax->hi;
    int n = plot_nice_ticks(lo, hi, min_ticks, &first, &step);
    double maxabs = fmax(fabs(lo), fabs(hi));
    for (int i = 0; i < n && ax->n < MAX_TICKS; i++) {
        ax->tick[ax->n] = first + i * step;
        tick_text(first + i * step, step, maxabs, ax->text[ax->n], sizeof ax->text[0]);
        ax->n++;
    }
}

static double text_width(cairo_t *cr, const char *s) {
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    return e.x_advance;
}

static double axis_widest(cairo_t *cr, const axis *ax) {
    double w = 0;
    for (int i = 0; i < ax->n; i++) w = fmax(w, text_width(cr, ax->text[i]));
    return w;
}

/* The data ranges of every run, padded so no point sits on the frame. */
static void ranges_find(const plot_run *runs, int nr, const plot_args *a, axis *xa, axis *ya) {
    double x0 = DBL_MAX, x1 = -DBL_MAX, y0 = DBL_MAX, y1 = -DBL_MAX;
    for (int i = 0; i < nr; i++)
        for (int k = 0; k < runs[i].n; k++) {
            double y = a->log_y ? log10(runs[i].pts[k].y) : runs[i].pts[k].y;
            x0 = fmin(x0, runs[i].pts[k].x), x1 = fmax(x1, runs[i].pts[k].x);
            y0 = fmin(y0, y), y1 = fmax(y1, y);
        }
    if (x1 - x0 <= 0) x0 -= 1, x1 += 1;
    if (y1 - y0 <= 1e-12 * fmax(1, fabs(y0))) {
        double d = a->log_y ? 0.5 : fabs(y0) > 0 ? fabs(y0) * 0.1 : 1;
        y0 -= d, y1 += d;
    }
    double px = (x1 - x0) * 0.02, py = (y1 - y0) * 0.05;
    *xa = (axis){.lo = x0 - px, .hi = x1 + px};
    *ya = (axis){.lo = y0 - py, .hi = y1 + py, .log = a->log_y};
}

typedef struct frame {
    double left, top, w, h; /* the plot area in pixels */
} frame;

static double to_px_x(const frame *f, const axis *xa, double x) {
    return f->left + (x - xa->lo) / (xa->hi - xa->lo) * f->w;
}
static double to_px_y(const frame *f, const axis *ya, double y) {
    if (ya->log) y = log10(y);
    return f->top + f->h - (y - ya->lo) / (ya->hi - ya->lo) * f->h;
}

static void draw_axes(cairo_t *cr, const frame *f, const axis *xa, const axis *ya, const plot_args *a, double fs) {
    cairo_set_line_width(cr, 1);
    cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
    for (int i = 0; i < xa->n; i++) { /* grid, on pixel centres so lines stay sharp */
        double x = floor(to_px_x(f, xa, xa->tick[i])) + 0.5;
        cairo_move_to(cr, x, f->top), cairo_line_to(cr, x, f->top + f->h);
    }
    for (int i = 0; i < ya->n; i++) {
        double y = floor(to_px_y(f, ya, ya->tick[i])) + 0.5;
        cairo_move_to(cr, f->left, y), cairo_line_to(cr, f->left + f->w, y);
    }
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
    cairo_rectangle(cr, floor(f->left) + 0.5, floor(f->top) + 0.5, floor(f->w), floor(f->h));
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
    for (int i = 0; i < xa->n; i++) {
        double x = to_px_x(f, xa, xa->tick[i]);
        cairo_move_to(cr, x - text_width(cr, xa->text[i]) / 2, f->top + f->h + fs + 5);
        cairo_show_text(cr, xa->text[i]);
    }
    for (int i = 0; i < ya->n; i++) {
        double y = to_px_y(f, ya, ya->tick[i]);
        cairo_move_to(cr, f->left - 6 - text_width(cr, ya->text[i]), y + fs * 0.35);
        cairo_show_text(cr, ya->text[i]);
    }
    const char *xt = a->x_tokens ? "tokens" : "step";
    cairo_move_to(cr, f->left + f->w / 2 - text_width(cr, xt) / 2, f->top + f->h + 2 * fs + 12);
    cairo_show_text(cr, xt);
    char yt[300];
    snprintf(yt, sizeof yt, "%s%s", a->metric, a->log_y ? " (log scale)" : "");
    cairo_save(cr);
    cairo_move_to(cr, 12 + fs, f->top + f->h / 2 + text_width(cr, yt) / 2);
    cairo_rotate(cr, -M_PI / 2);
    cairo_show_text(cr, yt);
    cairo_restore(cr);
}

static void run_path(cairo_t *cr, const frame *f, const axis *xa, const axis *ya, const plot_run *r, const double *y) {
    for (int k = 0; k < r->n; k++) {
        double px = to_px_x(f, xa, r->pts[k].x), py = to_px_y(f, ya, y ? y[k] : r->pts[k].y);
        if (k) cairo_line_to(cr, px, py);
        else cairo_move_to(cr, px, py);
    }
}

/* Each run: one stroked path (the smoothed one drawn over its faint raw curve), dots on short runs. */
static void draw_runs(cairo_t *cr, const frame *f, const axis *xa, const axis *ya, const plot_run *runs, int nr) {
    cairo_save(cr);
    cairo_rectangle(cr, f->left, f->top, f->w, f->h);
    cairo_clip(cr);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    cairo_set_line_cap(cr, CAIRO_LINE_CAP_ROUND);
    for (int i = 0; i < nr; i++) {
        const double *c = palette[i % NPALETTE];
        double dash[] = {7, 4};
        cairo_set_dash(cr, dash, i >= NPALETTE ? 2 : 0, 0);
        if (runs[i].smoothed) {
            cairo_set_source_rgba(cr, c[0], c[1], c[2], 0.3);
            cairo_set_line_width(cr, 1);
            run_path(cr, f, xa, ya, &runs[i], NULL);
            cairo_stroke(cr);
        }
        cairo_set_source_rgb(cr, c[0], c[1], c[2]);
        cairo_set_line_width(cr, 2);
        run_path(cr, f, xa, ya, &runs[i], runs[i].smoothed);
        cairo_stroke(cr);
        for (int k = 0; k < runs[i].n && runs[i].n <= 20; k++) {
            double y = runs[i].smoothed ? runs[i].smoothed[k] : runs[i].pts[k].y;
            cairo_arc(cr, to_px_x(f, xa, runs[i].pts[k].x), to_px_y(f, ya, y), 3, 0, 2 * M_PI);
            cairo_fill(cr);
        }
    }
    cairo_restore(cr);
}

/* The legend, in the plot area's top right corner: a swatch (a filled bar in the run's colour) and
 * the label per run. */
static void draw_legend(cairo_t *cr, const frame *f, const plot_run *runs, int nr, double fs) {
    double tw = 0, row = fs + 7;
    for (int i = 0; i < nr; i++) tw = fmax(tw, text_width(cr, runs[i].label));
    double w = ceil(tw) + 44, h = nr * row + 10;
    double x = floor(f->left + f->w - w - 10), y = floor(f->top + 10);
    cairo_rectangle(cr, x + 0.5, y + 0.5, w, h);
    cairo_set_source_rgba(cr, 1, 1, 1, 0.9);
    cairo_fill_preserve(cr);
    cairo_set_source_rgb(cr, 0.7, 0.7, 0.7);
    cairo_set_line_width(cr, 1);
    cairo_stroke(cr);
    for (int i = 0; i < nr; i++) {
        const double *c = palette[i % NPALETTE];
        double ry = y + 5 + i * row;
        cairo_set_source_rgb(cr, c[0], c[1], c[2]);
        if (i < NPALETTE) {
            cairo_rectangle(cr, x + 8, floor(ry + row / 2) - 2, 22, 4);
        } else { /* dashed runs: a dashed swatch */
            cairo_rectangle(cr, x + 8, floor(ry + row / 2) - 2, 8, 4);
            cairo_rectangle(cr, x + 20, floor(ry + row / 2) - 2, 10, 4);
        }
        cairo_fill(cr);
        cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
        cairo_move_to(cr, x + 36, ry + row / 2 + fs * 0.35);
        cairo_show_text(cr, runs[i].label);
    }
}

/* Ticks that fit the frame: fewer while the x labels would touch. */
static void ticks_fit(cairo_t *cr, const frame *f, axis *xa, axis *ya) {
    for (int m = (int)fmin(10, fmax(2, f->w / 100)); m >= 2; m--) {
        axis_ticks(xa, m);
        if (xa->n < 2 || f->w / (xa->n - 1 + 1e-9) > axis_widest(cr, xa) + 14) break;
    }
    axis_ticks(ya, (int)fmin(6, fmax(2, f->h / 70)));
}

/* Draws every run on cr (a surface of a->width x a->height). CT_OK, or CT_ERR_INVALID with the line
 * set when the size leaves no room. */
static ct_status plot_draw(cairo_t *cr, plot_run *runs, int nr, const plot_args *a) {
    double fs = 12;
    axis xa, ya;
    ranges_find(runs, nr, a, &xa, &ya);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, fs);
    /* the margins hold the tick labels: the y labels' width is known once the ticks are chosen */
    frame f = {0, a->title ? 40 : 16, 0, 0};
    f.h = a->height - f.top - (2 * fs + 24);
    axis_ticks(&ya, (int)fmin(6, fmax(2, f.h / 70)));
    f.left = 12 + fs + 10 + ceil(axis_widest(cr, &ya)) + 8;
    f.w = a->width - f.left - 24;
    if (f.w < 80 || f.h < 60)
        return ct_fail(CT_ERR_INVALID, "--size %dx%d leaves no room for the plot beside its labels", a->width,
                       a->height);
    ticks_fit(cr, &f, &xa, &ya);
    draw_axes(cr, &f, &xa, &ya, a, fs);
    draw_runs(cr, &f, &xa, &ya, runs, nr);
    draw_legend(cr, &f, runs, nr, fs);
    if (a->title) {
        cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
        cairo_set_font_size(cr, 15);
        cairo_set_source_rgb(cr, 0, 0, 0);
        cairo_move_to(cr, f.left + f.w / 2 - text_width(cr, a->title) / 2, 26);
        cairo_show_text(cr, a->title);
    }
    return CT_OK;
}

/* The picture into a temporary name beside the output, renamed over it once complete. */
static ct_status plot_write(plot_run *runs, int nr, const plot_args *a) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", a->output, (long)getpid());
    cairo_surface_t *sf = a->png ? cairo_image_surface_create(CAIRO_FORMAT_RGB24, a->width, a->height)
                                 : cairo_svg_surface_create(tmp, a->width, a->height);
    cairo_t *cr = cairo_create(sf);
    ct_status st = CT_OK;
    if (cairo_status(cr) != CAIRO_STATUS_SUCCESS) {
        fprintf(stderr, "ctitan plot: cannot write %s: %s\n", a->output, cairo_status_to_string(cairo_status(cr)));
        st = CT_ERR_IO;
    } else if ((st = plot_draw(cr, runs, nr, a)) != CT_OK) {
        fprintf(stderr, "ctitan plot: %s\n", ct_last_error());
    }
    cairo_destroy(cr);
    cairo_status_t cs = cairo_surface_status(sf);
    if (!st && cs == CAIRO_STATUS_SUCCESS && a->png) cs = cairo_surface_write_to_png(sf, tmp);
    cairo_surface_finish(sf); /* the SVG surface writes the rest of its file here */
    if (cs == CAIRO_STATUS_SUCCESS) cs = cairo_surface_status(sf);
    cairo_surface_destroy(sf);
    if (!st && cs != CAIRO_STATUS_SUCCESS) {
        fprintf(stderr, "ctitan plot: cannot write %s: %s\n", a->output, cairo_status_to_string(cs));
        st = CT_ERR_IO;
    }
    if (!st && rename(tmp, a->output)) {
        fprintf(stderr, "ctitan plot: cannot write %s: %s\n", a->output, strerror(errno));
        st = CT_ERR_IO;
    }
    if (st) unlink(tmp);
    return st;
}

/* ---- arguments ---- */

/* --opt VALUE or --opt=VALUE: the value, or NULL when this argument is not opt. */
static const char *opt_value(int argc, char **argv, int *i, const char *opt, int *missing) {
    size_t n = strlen(opt);
    if (strncmp(argv[*i], opt, n)) return NULL;
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (argv[*i][n]) return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

static ct_status parse_size(const char *s, plot_args *a) {
    char *end;
    long w = strtol(s, &end, 10), h = *end == 'x' ? strtol(end + 1, &end, 10) : 0;
    if (*end || w < 240 || h < 180 || w > 8000 || h > 8000)
        return usage_error("--size: want WxH, 240x180 to 8000x8000, not", s);
    a->width = (int)w;
    a->height = (int)h;
    return CT_OK;
}

static ct_status parse_smooth(const char *s, plot_args *a) {
    char *end;
    errno = 0;
    double w = strtod(s, &end);
    if (!*s || *end || errno || !(w >= 0 && w < 1)) return usage_error("--smooth: want a weight in [0, 1), not", s);
    a->smooth = w;
    return CT_OK;
}

/* One option (at argv[*i]) into a; -1 when argv[*i] is not an option of this command. */
static int parse_option(int argc, char **argv, int *i, plot_args *a, ct_status *st) {
    int missing = 0;
    const char *v;
    *st = CT_OK;
    if ((v = opt_value(argc, argv, i, "--output", &missing))) a->output = v;
    else if ((v = opt_value(argc, argv, i, "--metric", &missing))) a->metric = v;
    else if ((v = opt_value(argc, argv, i, "--title", &missing))) a->title = v;
    else if ((v = opt_value(argc, argv, i, "--label", &missing))) a->labels[a->n_labels++] = v;
    else if ((v = opt_value(argc, argv, i, "--size", &missing))) *st = parse_size(v, a);
    else if ((v = opt_value(argc, argv, i, "--smooth", &missing))) *st = parse_smooth(v, a);
    else if ((v = opt_value(argc, argv, i, "--x", &missing))) {
        if (strcmp(v, "step") && strcmp(v, "tokens")) *st = usage_error("--x: want step or tokens, not", v);
        a->x_tokens = !strcmp(v, "tokens");
    } else if (!strcmp(argv[*i], "--log-y")) a->log_y = 1;
    else if (missing) *st = usage_error("missing the value of", argv[*i]);
    else return -1;
    return 0;
}

static ct_status parse_args(int argc, char **argv, plot_args *a, int *help) {
    for (int i = 1; i < argc; i++) {
        ct_status st;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            *help = 1;
            return CT_OK;
        }
        if (!parse_option(argc, argv, &i, a, &st)) {
            if (st) return st;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return usage_error("unknown option", argv[i]);
        } else {
            a->dirs[a->n_dirs++] = argv[i];
        }
    }
    if (!a->n_dirs) return usage_error("name at least one run folder", NULL);
    if (!a->output) return usage_error("--output FILE.svg or FILE.png is required", NULL);
    size_t n = strlen(a->output);
    a->png = n > 4 && !strcmp(a->output + n - 4, ".png");
    if (!a->png && !(n > 4 && !strcmp(a->output + n - 4, ".svg")))
        return usage_error("--output: the name must end in .svg or .png:", a->output);
    if (a->n_labels > a->n_dirs)
        return usage_error("more --label options than run folders; the extra one is", a->labels[a->n_dirs]);
    if (!*a->metric) return usage_error("--metric: empty field name", NULL);
    return CT_OK;
}

ct_status cmd_plot(int argc, char **argv) {
    plot_args a = {.metric = "loss", .width = 800, .height = 500};
    plot_run *runs = NULL;
    int help = 0;
    a.dirs = calloc((size_t)argc, sizeof *a.dirs);
    a.labels = calloc((size_t)argc, sizeof *a.labels);
    ct_status st = a.dirs && a.labels ? parse_args(argc, argv, &a, &help) : CT_ERR_NOMEM;
    if (st || help) {
        if (help) fputs(usage, stdout);
        goto done;
    }
    runs = calloc((size_t)a.n_dirs, sizeof *runs);
    if (!runs) {
        st = CT_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; i < a.n_dirs && !st; i++) {
        runs[i].dir = a.dirs[i];
        st = run_read(&runs[i], &a);
        if (!st && a.smooth > 0) {
            double *y = malloc(sizeof *y * (size_t)runs[i].n);
            runs[i].smoothed = malloc(sizeof *y * (size_t)runs[i].n);
            if (!y || !runs[i].smoothed) st = CT_ERR_NOMEM;
            for (int k = 0; !st && k < runs[i].n; k++) y[k] = runs[i].pts[k].y;
            if (!st) plot_smooth_ema(y, runs[i].smoothed, runs[i].n, a.smooth);
            free(y);
        }
    }
    if (st) goto done;
    labels_assign(runs, &a);
    if ((st = plot_write(runs, a.n_dirs, &a))) goto done;
    for (int i = 0; i < a.n_dirs; i++) {
        const plot_run *r = &runs[i];
        printf("plot: %s: \"%s\", %d point%s, steps %lld..%lld", r->dir, r->label, r->n, r->n == 1 ? "" : "s",
               (long long)r->pts[0].step, (long long)r->pts[r->n - 1].step);
        if (a.x_tokens) printf(", tokens %.0f..%.0f", r->pts[0].x, r->pts[r->n - 1].x);
        printf(", %s %.6g -> %.6g\n", a.metric, r->pts[0].y, r->pts[r->n - 1].y);
    }
    printf("plot: wrote %s (%dx%d)\n", a.output, a.width, a.height);
done:
    if (st == CT_ERR_NOMEM) fprintf(stderr, "ctitan plot: out of memory\n");
    for (int i = 0; runs && i < a.n_dirs; i++) {
        free(runs[i].pts);
        free(runs[i].smoothed);
    }
    free(runs);
    free(a.dirs);
    free(a.labels);
    /* cairo keeps the fonts its text used, and fontconfig its configuration, until told: both
     * released, so a leak checker sees what is ours */
    cairo_debug_reset_static_data();
    FcFini();
    return st;
}
