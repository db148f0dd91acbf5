/* hardware.c: hardware profiles (configs/hardware/NAME.yaml): found by name or path, read with every
 * key checked, written back exactly (calibration's output), listed, and their measurements looked up.
 *
 * A profile's file speaks human units (TFLOP/s, GiB, GB/s, microseconds); hw_profile holds bytes,
 * seconds and FLOP/s. Decimal units are applied to the number's text (989.4 TFLOP/s is read as the
 * decimal 989.4e12, rounded once), so a profile written by hw_profile_write reads back bit for bit.
 * configs/hardware/README.md documents every key. */
#include "plan/plan.h"

#include "config/manifest.h"
#include "base/error.h"
#include "base/util.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Limits on reading a profile, which is untrusted input. */
#define HW_MAX_DEPTH 8           /* maps and lists nested (the schema needs 5) */
#define HW_MAX_ENTRIES 65536     /* measured ops, and measured collectives */
#define HW_MAX_DIRS 16           /* folders searched for a NAME */
#define HW_MAX_NAMES 256         /* profiles listed */
#define GIB 1073741824.0

/* ---- the keys ---- */

enum { T_STR, T_INT, T_BOOL, T_NUM };

typedef struct hw_key {
    const char *section, *key; /* section "": top level */
    int type;
    size_t off;                /* into hw_profile */
    int pow10;                 /* T_NUM: one unit of the file is 10^pow10 of the struct's unit */
    int gib;                   /* T_NUM: one unit of the file is 2^30 bytes */
    double lo, hi;             /* allowed range, in the file's unit */
    int lo_open, hi_open;      /* the bound itself is excluded */
    int alt;                   /* the key that spells the same value in other units (one of the two is
                                  given); 0: none (K_NAME, key 0, has no other spelling) */
    int optional;
    const char *what;          /* the unit, for errors */
} hw_key;

#define PEAK(d) (offsetof(hw_profile, peak_flops) + (d) * sizeof(double))
#define OFF(f) offsetof(hw_profile, f)
enum {
    K_NAME, K_SOURCE, K_GPN, K_CALIBRATED, K_BF16, K_FP8, K_FP32, K_MEM_GIB, K_MEM_GB, K_MEM_BW, K_INTRA_BW,
    K_INTRA_LAT, K_INTER_BW, K_INTER_LAT, K_HOST_BW, K_HOST_MEM, K_MATMUL, K_ATTN, K_MEMEFF, K_OVER_GIB, K_OVER_GB, K_SLACK, K_HEADROOM,
    K_SHARE, K_OVERLAP, K_N
};
/* The common shapes of a key: a rate or size in (0, hi], a latency in [0, hi], a fraction. */
#define POSITIVE(sec, k, f, p, h, w) {.section = sec, .key = k, .type = T_NUM, .off = f, .pow10 = p, .hi = h, \
                                      .lo_open = 1, .what = w}
#define FRACTION(k, f, lo_op, hi_op) {.section = "assumptions", .key = k, .type = T_NUM, .off = OFF(f), .hi = 1, \
                                      .lo_open = lo_op, .hi_open = hi_op, .what = "a fraction"}
static const hw_key keys[K_N] = {
    [K_NAME] = {.section = "", .key = "name", .type = T_STR, .off = OFF(name),
                .what = "the GPU's name, one line of up to 127 bytes"},
    [K_SOURCE] = {.section = "", .key = "source", .type = T_STR, .off = OFF(source),
                  .what = "where the figures come from (document titles and URLs), one line of up to 511 bytes"},
    [K_GPN] = {.section = "", .key = "gpus_per_node", .type = T_INT, .off = OFF(gpus_per_node), .lo = 1, .hi = 65536,
               .what = "GPUs"},
    [K_CALIBRATED] = {.section = "", .key = "calibrated", .type = T_BOOL, .off = OFF(calibrated), .optional = 1,
                      .what = "true or false"},
    [K_BF16] = POSITIVE("compute", "bf16_tflops", PEAK(PLAN_BF16), 12, 1e5, "dense TFLOP/s"),
    [K_FP8] = POSITIVE("compute", "fp8_tflops", PEAK(PLAN_FP8), 12, 1e5,
                       "dense TFLOP/s (or none: planned at the bf16 rate)"),
    [K_FP32] = POSITIVE("compute", "fp32_tflops", PEAK(PLAN_F32), 12, 1e5, "dense TFLOP/s"),
    [K_MEM_GIB] = {.section = "memory", .key = "size_gib", .type = T_NUM, .off = OFF(mem_bytes), .gib = 1, .hi = 1e5,
                   .lo_open = 1, .alt = K_MEM_GB, .what = "GiB"},
    [K_MEM_GB] = {.section = "memory", .key = "size_gb", .type = T_NUM, .off = OFF(mem_bytes), .pow10 = 9, .hi = 1e5,
                  .lo_open = 1, .alt = K_MEM_GIB, .what = "GB"},
    [K_MEM_BW] = POSITIVE("memory", "bandwidth_gb_s", OFF(mem_bw), 9, 1e6, "GB/s"),
    [K_INTRA_BW] = POSITIVE("intra_node", "bandwidth_gb_s", OFF(intra_bw), 9, 1e6, "GB/s per GPU, one direction"),
    [K_INTRA_LAT] = {.section = "intra_node", .key = "latency_us", .type = T_NUM, .off = OFF(intra_lat), .pow10 = -6,
                     .hi = 1e6, .what = "microseconds"},
    [K_INTER_BW] = POSITIVE("inter_node", "bandwidth_gb_s", OFF(inter_bw), 9, 1e6, "GB/s per GPU, one direction"),
    [K_INTER_LAT] = {.section = "inter_node", .key = "latency_us", .type = T_NUM, .off = OFF(inter_lat), .pow10 = -6,
                     .hi = 1e6, .what = "microseconds"},
    [K_HOST_BW] = {.section = "host_link", .key = "bandwidth_gb_s", .type = T_NUM, .off = OFF(host_bw), .pow10 = 9,
                   .hi = 1e6, .lo_open = 1, .optional = 1,
                   .what = "GB/s per GPU to host memory, one direction (PCIe), optional"},
    [K_HOST_MEM] = {.section = "host_link", .key = "memory_gb", .type = T_NUM, .off = OFF(host_mem), .pow10 = 9,
                    .hi = 1e6, .lo_open = 1, .optional = 1,
                    .what = "GB of host memory per GPU (the node's divided by its GPUs), optional"},
    [K_MATMUL] = FRACTION("matmul_efficiency", matmul_eff, 1, 0),
    [K_ATTN] = FRACTION("attention_efficiency", attn_eff, 1, 0),
    [K_MEMEFF] = FRACTION("memory_efficiency", mem_eff, 1, 0),
    [K_OVER_GIB] = {.section = "assumptions", .key = "runtime_overhead_gib", .type = T_NUM, .off = OFF(overhead_bytes),
                    .gib = 1, .hi = 1e5, .alt = K_OVER_GB, .what = "GiB"},
    [K_OVER_GB] = {.section = "assumptions", .key = "runtime_overhead_gb", .type = T_NUM, .off = OFF(overhead_bytes),
                   .pow10 = 9, .hi = 1e5, .alt = K_OVER_GIB, .what = "GB"},
    [K_SLACK] = FRACTION("allocator_slack", alloc_frac, 0, 0),
    [K_HEADROOM] = FRACTION("headroom", headroom_frac, 0, 1),
    [K_SHARE] = {.section = "", .key = "core_share", .type = T_NUM, .off = OFF(core_share), .hi = 1, .lo_open = 1,
                 .optional = 1, .what = "cores per rank, below 1 when calibrated on more ranks than cores (a fraction)"},
    [K_OVERLAP] = {.section = "", .key = "comm_overlap", .type = T_NUM, .off = OFF(comm_overlap), .hi = 1, .lo_open = 1,
                   .optional = 1, .what = "the measured share of a collective hidden behind compute (a fraction)"},
};
/* The sections, in the order the writer prints them; "measured" is read on its own. */
static const char *const sections[] = {"compute", "memory", "intra_node", "inter_node", "host_link", "assumptions"};
#define N_SECTIONS (int)(sizeof sections / sizeof *sections)

/* A section whose keys are all optional may be left out. */
static int section_optional(const char *section);

static const char *const op_names[RT_OP_NKINDS] = {"gemm", "attention", "embedding", "rmsnorm", "layernorm",
                                                     "rope", "swiglu", "gelu", "add", "bias", "xent", "cast", "custom",
                                                     "collective"};
static const char *const dtype_names[PLAN_NDTYPES] = {"fp32", "bf16", "fp8"};
static const struct {
    const char *name;
    int kind;
} comm_names[] = {{"all_gather", CT_COLL_ALL_GATHER}, {"reduce_scatter", CT_COLL_REDUCE_SCATTER},
                  {"all_reduce", CT_COLL_ALL_REDUCE}, {"all_to_all", CT_COLL_ALL_TO_ALL}};
#define N_COMM_NAMES (int)(sizeof comm_names / sizeof *comm_names)

static double *field(hw_profile *hw, const hw_key *k) { return (double *)((char *)hw + k->off); }
static double cfield(const hw_profile *hw, const hw_key *k) { return *(const double *)((const char *)hw + k->off); }

/* "GiB in (0, 100000]" */
static void expect_text(const hw_key *k, char *buf, size_t len) {
    if (k->type == T_STR || k->type == T_BOOL) snprintf(buf, len, "%s", k->what);
    else snprintf(buf, len, "%s in %c%g, %g%c", k->what, k->lo_open ? '(' : '[', k->lo, k->hi, k->hi_open ? ')' : ']');
}

static int in_range(const hw_key *k, double v) {
    return (k->lo_open ? v > k->lo : v >= k->lo) && (k->hi_open ? v < k->hi : v <= k->hi);
}

/* ---- numbers ---- */

/* A decimal number, the whole of s ([+-]digits[.digits][e[+-]digits], no hex, inf or nan), times
 * 10^pow10: the exponent is shifted in the text, so the result is the decimal value rounded once. */
static int parse_scaled(const char *s, int pow10, double *out) {
    const char *p = s;
    size_t digits = 0;
    long e = 0;
    if (*p == '+' || *p == '-') p++;
    for (; isdigit((unsigned char)*p); p++) digits++;
    if (*p == '.')
        for (p++; isdigit((unsigned char)*p); p++) digits++;
    size_t mantissa = (size_t)(p - s);
    if (!digits || mantissa > 400) return -1;
    if (*p == 'e' || *p == 'E') {
        int neg = 0;
        p++;
        if (*p == '+' || *p == '-') neg = *p++ == '-';
        if (!isdigit((unsigned char)*p)) return -1;
        for (; isdigit((unsigned char)*p); p++)
            if (e < 100000) e = e * 10 + (*p - '0');
        if (neg) e = -e;
    }
    if (*p) return -1;
    char buf[448];
    snprintf(buf, sizeof buf, "%.*se%ld", (int)mantissa, s, e + pow10);
    char *end;
    double v = strtod(buf, &end);
    if (*end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

/* The struct's value of a T_NUM key from the file's text. */
static int parse_key_value(const hw_key *k, const char *s, double *human, double *base) {
    if (parse_scaled(s, 0, human)) return -1;
    if (k->gib) *base = *human * GIB; /* a power of two: exact */
    else if (parse_scaled(s, k->pow10, base)) return -1;
    return 0;
}

/* The shortest text of x in the key's unit that reads back as exactly x: plain decimals ("80",
 * "989.4", "0.001") where the value is of a plain size, else the exponent form ("2.5e-05"). */
static void format_key_value(const hw_key *k, double x, char *buf, size_t len) {
    double scale = k->gib ? GIB : pow(10, k->pow10), v = x / scale, back, base;
    int plain = fabs(v) >= 1e-4 && fabs(v) < 1e15;
    for (int prec = plain ? 0 : 1; prec <= (plain ? 24 : 17); prec++) {
        snprintf(buf, len, plain ? "%.*f" : "%.*g", prec, v);
        if (!parse_key_value(k, buf, &back, &base) && base == x) return;
    }
    /* x's 17 significant digits with the exponent shifted: always exact (GiB never gets here, its
     * division being exact) */
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%.16e", x);
    char *e = strchr(tmp, 'e');
    snprintf(buf, len, "%.*se%d", (int)(e - tmp), tmp, atoi(e + 1) - k->pow10);
}

/* A non-negative integer, the whole of s. */
static int parse_count(const char *s, int64_t max, int64_t *out) {
    int64_t v = 0;
    if (*s == '+') s++;
    if (!isdigit((unsigned char)*s)) return -1;
    for (; isdigit((unsigned char)*s); s++) {
        if (v > (max - (*s - '0')) / 10) return -1;
        v = v * 10 + (*s - '0');
    }
    if (*s) return -1;
    *out = v;
    return 0;
}

/* ---- text ---- */

/* The next UTF-8 code point of s (advancing *n bytes), or -1 for a malformed sequence. */
static long utf8_next(const unsigned char *s, int *n) {
    long c = s[0];
    int len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (!len) return -1;
    if (len > 1) c &= 0x3f >> (len - 1);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return -1;
        c = (c << 6) | (s[i] & 0x3f);
    }
    static const long min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min[len] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return -1;
    *n = len;
    return c;
}

/* A one-line value: valid UTF-8 without control characters (C0, DEL, C1) or line separators. */
static const char *text_problem(const char *s) {
    for (int n = 0; *s; s += n) {
        long c = utf8_next((const unsigned char *)s, &n);
        if (c < 0) return "is not valid UTF-8";
        if (c < 0x20 || (c >= 0x7f && c <= 0x9f) || c == 0x2028 || c == 0x2029)
            return "holds a control character or line break";
    }
    return NULL;
}

/* s as a YAML double-quoted scalar (s passed text_problem). */
static void write_quoted(FILE *f, const char *s) {
    fputc('"', f);
    for (int n = 0; *s; s += n) {
        long c = utf8_next((const unsigned char *)s, &n);
        if (c == '"' || c == '\\') fprintf(f, "\\%c", (int)c);
        else if (c == 0xfeff || (c > 0xfffd && c < 0x10000)) fprintf(f, "\\u%04lX", c); /* not printable in YAML */
        else fwrite(s, 1, (size_t)n, f);
    }
    fputc('"', f);
}

/* ---- reading ---- */

/* A profile is read by config/'s reader as data (manifest_load_data): dotted keys in file order, each map
 * and list an entry before what it holds, every key with its line. What follows checks its keys,
 * types and ranges. */

typedef struct entry_line {
    int index, line;
    plan_measured_op op;
    plan_measured_comm comm;
} entry_line;

typedef struct reader {
    const manifest *m;
    const char *path;
    hw_profile *hw;
    int line[K_N];                  /* where each key was given, 0: not given */
    int section_line[N_SECTIONS];
    int measured_line, fp8_none;
    entry_line *op_lines, *comm_lines; /* the measurements with their lines, in file order */
    int n_ops, n_comms, cap_ops, cap_comms;
} reader;

static int fail_at(reader *r, int line, const char *key, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail_at(reader *r, int line, const char *key, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (key && *key) ct_set_error("%s:%d: %s: %s", r->path, line, key, msg);
    else ct_set_error("%s:%d: %s", r->path, line, msg);
    return -1;
}

/* The entries under m->values[i] (a map's keys, a list's items) follow it: the index after the last. */
static int subtree_end(const manifest *m, int i) {
    const char *key = m->values[i].key;
    size_t n = strlen(key);
    int j = i + 1;
    while (j < m->n_values && !strncmp(m->values[j].key, key, n) &&
           (m->values[j].key[n] == '.' || m->values[j].key[n] == '['))
        j++;
    return j;
}

/* The scalar text of v, or NULL after an error naming its key and what it expects. */
static const char *scalar(reader *r, const mf_value *v, const char *expect) {
    if (v->is_seq)
        return fail_at(r, v->line, v->key, "a %s where a plain value belongs; expected %s",
                       v->is_seq == MF_MAP ? "map" : "list", expect), NULL;
    if (!v->value) return fail_at(r, v->line, v->key, "no value; expected %s", expect), NULL;
    return v->value;
}

/* The names a map's unknown key could have been: "bf16_tflops, fp8_tflops, fp32_tflops". */
static void known_keys(const char *section, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < K_N && used < len; i++)
        if (!strcmp(keys[i].section, section))
            used += (size_t)snprintf(buf + used, len - used, "%s%s", used ? ", " : "", keys[i].key);
    if (*section) return;
    for (int i = 0; i < N_SECTIONS && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, ", %s", sections[i]);
    if (used < len) snprintf(buf + used, len - used, ", measured");
}

static int read_key(reader *r, int ki, const mf_value *v) {
    const hw_key *k = &keys[ki];
    char expect[160];
    expect_text(k, expect, sizeof expect);
    const char *s = scalar(r, v, expect);
    if (!s) return -1;
    if (k->type == T_STR) {
        size_t cap = ki == K_NAME ? sizeof r->hw->name : sizeof r->hw->source;
        const char *bad = !*s ? "is empty" : strlen(s) >= cap ? "is too long" : text_problem(s);
        if (bad) return fail_at(r, v->line, v->key, "the value %s; expected %s", bad, expect);
        memcpy((char *)r->hw + k->off, s, strlen(s) + 1);
    } else if (k->type == T_BOOL) {
        if (mf_parse_bool(s, (int *)((char *)r->hw + k->off)))
            return fail_at(r, v->line, v->key, "'%.40s' is not true or false", s);
    } else if (k->type == T_INT) {
        int64_t n;
        if (parse_count(s, (int64_t)k->hi, &n) || n < (int64_t)k->lo)
            return fail_at(r, v->line, v->key, "'%.40s' is not a whole number in range; expected %s", s, expect);
        *(int *)((char *)r->hw + k->off) = (int)n;
    } else if (ki == K_FP8 && !strcmp(s, "none")) {
        r->fp8_none = 1;
    } else {
        double human, base;
        if (parse_key_value(k, s, &human, &base))
            return fail_at(r, v->line, v->key, "'%.40s' is not a number; expected %s", s, expect);
        if (!in_range(k, human)) return fail_at(r, v->line, v->key, "%s is out of range; expected %s", s, expect);
        *field(r->hw, k) = base;
    }
    return 0;
}

static int section_index(const char *name) {
    for (int i = 0; i < N_SECTIONS; i++)
        if (!strcmp(sections[i], name)) return i;
    return -1;
}

static int read_measured(reader *r, int at);

/* One map of keys, the entries [from, to) of m->values: the top level (section "") or a section. */
static int read_map(reader *r, int from, int to, const char *section) {
    size_t skip = *section ? strlen(section) + 1 : 0;
    for (int i = from; i < to; i = subtree_end(r->m, i)) {
        const mf_value *v = &r->m->values[i];
        const char *name = v->key + skip;
        int ki = 0;
        while (ki < K_N && (strcmp(keys[ki].section, section) || strcmp(keys[ki].key, name))) ki++;
        if (ki < K_N) { /* a known key (one given twice the reader refused) */
            if (keys[ki].alt && r->line[keys[ki].alt])
                return fail_at(r, v->line, v->key, "given with %s.%s at line %d; give one of the two", section,
                               keys[keys[ki].alt].key, r->line[keys[ki].alt]);
            r->line[ki] = v->line;
            if (read_key(r, ki, v)) return -1;
            continue;
        }
        int si = *section ? -1 : section_index(name);
        if (si < 0 && (*section || strcmp(name, "measured"))) {
            char known[512];
            known_keys(section, known, sizeof known);
            return fail_at(r, v->line, v->key, "unknown key; expected one of %s", known);
        }
        *(si >= 0 ? &r->section_line[si] : &r->measured_line) = v->line;
        if (v->is_seq != MF_MAP) {
            char known[512];
            known_keys(name, known, sizeof known);
            return fail_at(r, v->line, v->key, "expected a map of keys (%s)", si >= 0 ? known : "ops, comms");
        }
        if (si >= 0 ? read_map(r, i + 1, subtree_end(r->m, i), name) : read_measured(r, i)) return -1;
    }
    return 0;
}

/* What the file must have given, once it is all read. */
static int check_complete(reader *r) {
    for (int i = 0; i < N_SECTIONS; i++) {
        if (r->section_line[i] || section_optional(sections[i])) continue;
        char known[512];
        known_keys(sections[i], known, sizeof known);
        return fail_at(r, 1, sections[i], "missing section; expected a map of %s", known);
    }
    for (int ki = 0; ki < K_N; ki++) {
        const hw_key *k = &keys[ki];
        if (r->line[ki] || k->optional || (k->alt && (r->line[k->alt] || k->alt < ki))) continue;
        int si = section_index(k->section), line = si >= 0 ? r->section_line[si] : 1;
        char expect[160], dotted[96];
        expect_text(k, expect, sizeof expect);
        snprintf(dotted, sizeof dotted, "%s%s%s", k->section, *k->section ? "." : "", k->key);
        if (k->alt)
            return fail_at(r, line, dotted, "missing (or %s.%s in %s); expected %s", k->section, keys[k->alt].key,
                           keys[k->alt].what, expect);
        return fail_at(r, line, dotted, "missing; expected %s", expect);
    }
    if (r->fp8_none) r->hw->peak_flops[PLAN_FP8] = r->hw->peak_flops[PLAN_BF16];
    if (r->hw->overhead_bytes >= r->hw->mem_bytes) {
        int ki = r->line[K_OVER_GIB] ? K_OVER_GIB : K_OVER_GB;
        char dotted[96];
        snprintf(dotted, sizeof dotted, "assumptions.%s", keys[ki].key);
        return fail_at(r, r->line[ki], dotted, "the runtime overhead is not less than the memory; expected less than "
                       "memory.size_gib");
    }
    return 0;
}

/* ---- measured ops and collectives ---- */

static const char *const op_keys[] = {"kind", "shape", "dtype", "forward_s", "backward_s"};
static const char *const comm_keys[] = {"kind", "ranks", "bytes", "seconds"};

static int find_name(const char *s, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

static void join_names(const char *const *names, int n, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < n && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "", names[i]);
}

/* A positive (or, with zero_ok, non-negative) measurement of at most `hi`. */
static int read_measure(reader *r, const mf_value *v, int zero_ok, double hi, const char *unit, double *out) {
    char expect[96];
    snprintf(expect, sizeof expect, "%s in %c0, %g]", unit, zero_ok ? '[' : '(', hi);
    const char *s = scalar(r, v, expect);
    if (!s) return -1;
    if (parse_scaled(s, 0, out)) return fail_at(r, v->line, v->key, "'%.40s' is not a number; expected %s", s, expect);
    if (!(zero_ok ? *out >= 0 : *out > 0) || *out > hi)
        return fail_at(r, v->line, v->key, "%s is out of range; expected %s", s, expect);
    return 0;
}

/* A name from a list: an op kind, a dtype or a collective. */
static int read_choice(reader *r, const mf_value *v, const char *const *names, int n, int *out) {
    char known[256];
    join_names(names, n, known, sizeof known);
    const char *s = scalar(r, v, known);
    if (!s) return -1;
    if ((*out = find_name(s, names, n)) < 0)
        return fail_at(r, v->line, v->key, "'%.40s' is unknown; expected one of %s", s, known);
    return 0;
}

/* shape: a list of 1 to 4 whole numbers (its items follow it in m->values); the rest are 0. */
static int read_shape(reader *r, const mf_value *v, int64_t shape[4]) {
    const char *expect = "a list of 1 to 4 whole numbers, as [m, k, n]";
    int64_t n;
    if (v->is_seq != MF_ITEMS || mf_parse_int(v->value, &n)) return fail_at(r, v->line, v->key, "expected %s", expect);
    if (n < 1 || n > 4) return fail_at(r, v->line, v->key, "%d numbers; expected %s", (int)n, expect);
    for (int i = 0, at = (int)(v - r->m->values) + 1; i < n; i++, at = subtree_end(r->m, at)) {
        const mf_value *item = &r->m->values[at];
        const char *s = scalar(r, item, expect);
        if (!s) return -1;
        if (parse_count(s, (int64_t)1 << 62, &shape[i]))
            return fail_at(r, item->line, v->key, "'%.40s' is not a whole number; expected %s", s, expect);
    }
    return 0;
}

/* Makes room for one more entry. */
static int grow(entry_line **lines, int n, int *cap) {
    if (n < *cap) return 0;
    int c = *cap ? *cap * 2 : 16;
    entry_line *g = realloc(*lines, (size_t)c * sizeof *g);
    if (!g) return -1;
    *lines = g;
    *cap = c;
    return 0;
}

/* The map at m->values[at] holding each key of `names` once, their entries into `values`; -1 for a key
 * that is unknown or missing (one given twice the reader refused). */
static int item_keys(reader *r, int at, const char *const *names, int n, const mf_value **values) {
    const mf_value *item = &r->m->values[at];
    char known[128];
    join_names(names, n, known, sizeof known);
    if (item->is_seq != MF_MAP) return fail_at(r, item->line, item->key, "expected a map of %s", known);
    for (int i = 0; i < n; i++) values[i] = NULL;
    size_t skip = strlen(item->key) + 1;
    for (int i = at + 1, end = subtree_end(r->m, at); i < end; i = subtree_end(r->m, i)) {
        const mf_value *v = &r->m->values[i];
        int j = find_name(v->key + skip, names, n);
        if (j < 0) return fail_at(r, v->line, v->key, "unknown key; expected one of %s", known);
        values[j] = v;
    }
    for (int i = 0; i < n; i++)
        if (!values[i]) return fail_at(r, item->line, item->key, "missing %s; expected each of %s", names[i], known);
    return 0;
}

static int read_op(reader *r, int at, int index) {
    const mf_value *v[5], *item = &r->m->values[at];
    if (item_keys(r, at, op_keys, 5, v)) return -1;
    if (r->n_ops >= HW_MAX_ENTRIES)
        return fail_at(r, item->line, item->key, "more than %d measured ops", HW_MAX_ENTRIES);
    if (grow(&r->op_lines, r->n_ops, &r->cap_ops)) return fail_at(r, item->line, item->key, "out of memory");
    entry_line *e = &r->op_lines[r->n_ops];
    memset(e, 0, sizeof *e);
    if (read_choice(r, v[0], op_names, RT_OP_NKINDS, &e->op.kind) || read_shape(r, v[1], e->op.shape) ||
        read_choice(r, v[2], dtype_names, PLAN_NDTYPES, &e->op.dtype) ||
        read_measure(r, v[3], 0, 1e6, "seconds", &e->op.seconds[0]) ||
        read_measure(r, v[4], 1, 1e6, "seconds", &e->op.seconds[1]))
        return -1;
    e->index = index;
    e->line = item->line;
    r->n_ops++;
    return 0;
}

static int read_comm(reader *r, int at, int index) {
    const char *known = "a whole number of ranks in [1, 1048576]";
    const mf_value *v[4], *item = &r->m->values[at];
    const char *names[N_COMM_NAMES];
    if (item_keys(r, at, comm_keys, 4, v)) return -1;
    for (int i = 0; i < N_COMM_NAMES; i++) names[i] = comm_names[i].name;
    if (r->n_comms >= HW_MAX_ENTRIES)
        return fail_at(r, item->line, item->key, "more than %d measured collectives", HW_MAX_ENTRIES);
    if (grow(&r->comm_lines, r->n_comms, &r->cap_comms)) return fail_at(r, item->line, item->key, "out of memory");
    entry_line *e = &r->comm_lines[r->n_comms];
    memset(e, 0, sizeof *e);
    int which;
    if (read_choice(r, v[0], names, N_COMM_NAMES, &which)) return -1;
    e->comm.kind = comm_names[which].kind;
    const char *s = scalar(r, v[1], known);
    int64_t ranks;
    if (!s) return -1;
    if (parse_count(s, 1048576, &ranks) || ranks < 1)
        return fail_at(r, v[1]->line, v[1]->key, "'%.40s' is out of range; expected %s", s, known);
    e->comm.ranks = (int)ranks;
    if (read_measure(r, v[2], 0, 1e18, "bytes", &e->comm.bytes) ||
        read_measure(r, v[3], 0, 1e6, "seconds", &e->comm.seconds))
        return -1;
    e->index = index;
    e->line = item->line;
    r->n_comms++;
    return 0;
}

/* measured (the map at m->values[at]): {ops: [...], comms: [...]}, both optional. */
static int read_measured(reader *r, int at) {
    static const char *const lists[] = {"ops", "comms"};
    for (int i = at + 1, end = subtree_end(r->m, at); i < end; i = subtree_end(r->m, i)) {
        const mf_value *v = &r->m->values[i];
        int j = find_name(v->key + strlen("measured."), lists, 2);
        if (j < 0) return fail_at(r, v->line, v->key, "unknown key; expected ops or comms");
        if (v->is_seq != MF_ITEMS)
            return fail_at(r, v->line, v->key, "expected a list of {%s}", j ? "kind, ranks, bytes, seconds"
                                                                            : "kind, shape, dtype, forward_s, backward_s");
        int index = 0;
        for (int it = i + 1, items = subtree_end(r->m, i); it < items; it = subtree_end(r->m, it))
            if (j ? read_comm(r, it, index++) : read_op(r, it, index++)) return -1;
    }
    return 0;
}

static int cmp_i64(int64_t a, int64_t b) { return (a > b) - (a < b); }
static int cmp_double(double a, double b) { return (a > b) - (a < b); }

/* Same key (kind, dtype, shape); then file order. */
static int cmp_op(const void *pa, const void *pb) {
    const entry_line *a = pa, *b = pb;
    int c = cmp_i64(a->op.kind, b->op.kind);
    if (!c) c = cmp_i64(a->op.dtype, b->op.dtype);
    for (int i = 0; !c && i < 4; i++) c = cmp_i64(a->op.shape[i], b->op.shape[i]);
    return c ? c : cmp_i64(a->index, b->index);
}

static int cmp_comm(const void *pa, const void *pb) {
    const entry_line *a = pa, *b = pb;
    int c = cmp_i64(a->comm.kind, b->comm.kind);
    if (!c) c = cmp_i64(a->comm.ranks, b->comm.ranks);
    if (!c) c = cmp_double(a->comm.bytes, b->comm.bytes);
    return c ? c : cmp_i64(a->index, b->index);
}

/* Two measurements of the same thing are ambiguous: the index of the later one, or -1. lines is
 * sorted in place (the profile has its own copy in file order). */
static int find_duplicate(entry_line *lines, int n, int ops, int *first) {
    if (n < 2) return -1;
    qsort(lines, (size_t)n, sizeof *lines, ops ? cmp_op : cmp_comm);
    for (int i = 1; i < n; i++) {
        entry_line a = lines[i - 1], b = lines[i];
        a.index = b.index = 0;
        if ((ops ? cmp_op : cmp_comm)(&a, &b)) continue;
        *first = i - 1;
        return i;
    }
    return -1;
}

/* Copies the measurements into the profile (file order), then refuses duplicates. */
static int take_measurements(reader *r) {
    hw_profile *hw = r->hw;
    if (r->n_ops && !(hw->ops = malloc((size_t)r->n_ops * sizeof *hw->ops)))
        return fail_at(r, r->measured_line, "measured", "out of memory");
    if (r->n_comms && !(hw->comms = malloc((size_t)r->n_comms * sizeof *hw->comms)))
        return fail_at(r, r->measured_line, "measured", "out of memory");
    for (int i = 0; i < r->n_ops; i++) hw->ops[i] = r->op_lines[i].op;
    for (int i = 0; i < r->n_comms; i++) hw->comms[i] = r->comm_lines[i].comm;
    hw->n_ops = r->n_ops;
    hw->n_comms = r->n_comms;
    int a, b = find_duplicate(r->op_lines, r->n_ops, 1, &a);
    char where[48];
    if (b >= 0) {
        snprintf(where, sizeof where, "measured.ops[%d]", r->op_lines[b].index);
        return fail_at(r, r->op_lines[b].line, where, "the same kind, shape and dtype as line %d; give each once",
                       r->op_lines[a].line);
    }
    if ((b = find_duplicate(r->comm_lines, r->n_comms, 0, &a)) >= 0) {
        snprintf(where, sizeof where, "measured.comms[%d]", r->comm_lines[b].index);
        return fail_at(r, r->comm_lines[b].line, where, "the same kind, ranks and bytes as line %d; give each once",
                       r->comm_lines[a].line);
    }
    return 0;
}

/* ---- the file ---- */

/* How config/'s reader takes a profile: no anchors or aliases (a profile has no use for them), nesting
 * no deeper than HW_MAX_DEPTH, and room for HW_MAX_ENTRIES of each measurement (an op is 10 entries:
 * its map, 5 keys, its shape's list and up to 4 numbers). */
static const mf_data_format profile_format = {
    "hardware profile",
    "expected a hardware profile: a map of name, source, gpus_per_node, compute, memory, intra_node, inter_node, "
    "assumptions (configs/hardware/README.md)",
    HW_MAX_DEPTH, 16 * HW_MAX_ENTRIES};

/* Reads the profile at `path` into hw (zeroed by the caller). */
static ct_status read_profile(const char *path, hw_profile *hw) {
    manifest *m = manifest_load_data(path, &profile_format);
    if (!m) return CT_ERR_INVALID;
    reader r = {.m = m, .path = path, .hw = hw};
    ct_status rc = CT_ERR_INVALID;
    if (!m->n_values) /* an empty document: no map at all */
        fail_at(&r, 1, NULL, "%s", profile_format.root);
    else if (!read_map(&r, 0, m->n_values, "") && !check_complete(&r) && !take_measurements(&r))
        rc = CT_OK;
    free(r.op_lines);
    free(r.comm_lines);
    manifest_free(m);
    return rc;
}

/* ---- finding a profile by name ---- */

/* The folders a NAME is looked up in, in order: $CTITAN_HARDWARE_PATH (':'-separated), the source
 * tree's configs/hardware beside the binary (build/ctitan, or build/tests/test_* for the tests),
 * then ./configs/hardware. */
static int search_dirs(char dirs[][PATH_MAX], int max) {
    int n = 0;
    const char *env = getenv("CTITAN_HARDWARE_PATH");
    while (env && *env && n < max) {
        size_t len = strcspn(env, ":");
        if (len && len < PATH_MAX) snprintf(dirs[n++], PATH_MAX, "%.*s", (int)len, env);
        env += len + (env[len] == ':');
    }
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash = len > 0 ? (exe[len] = 0, strrchr(exe, '/')) : NULL;
    if (slash) {
        *slash = 0;
        static const char *const up[] = {"/../configs/hardware", "/../../configs/hardware"};
        size_t a = strlen(exe);
        for (int i = 0; i < 2 && n < max; i++) {
            size_t b = strlen(up[i]);
            if (a + b >= PATH_MAX) continue;
            memcpy(dirs[n], exe, a);
            memcpy(dirs[n++] + a, up[i], b + 1);
        }
    }
    if (n < max) snprintf(dirs[n++], PATH_MAX, "configs/hardware");
    return n;
}

/* A NAME is letters, digits, '.', '_', '-' (no path); anything with a '/' or a .yaml/.yml ending is
 * a file. */
static int is_name(const char *s) {
    size_t n = strlen(s);
    if (strchr(s, '/') || (n > 5 && !strcmp(s + n - 5, ".yaml")) || (n > 4 && !strcmp(s + n - 4, ".yml"))) return 0;
    return 1;
}

static int valid_name(const char *s) {
    if (!*s || *s == '.' || strlen(s) > 100) return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("._-", *s)) return 0;
    return 1;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void hw_profile_list(char *out, size_t len) {
    char dirs[HW_MAX_DIRS][PATH_MAX];
    char *names[HW_MAX_NAMES];
    int n_dirs = search_dirs(dirs, HW_MAX_DIRS), n = 0;
    for (int d = 0; d < n_dirs; d++) {
        DIR *dir = opendir(dirs[d]);
        for (struct dirent *e; dir && (e = readdir(dir)) && n < HW_MAX_NAMES;) {
            size_t l = strlen(e->d_name);
            if (l <= 5 || strcmp(e->d_name + l - 5, ".yaml")) continue;
            char *name = strndup(e->d_name, l - 5);
            int dup = 0;
            for (int i = 0; name && i < n; i++) dup |= !strcmp(names[i], name);
            if (!name || dup || !valid_name(name)) free(name);
            else names[n++] = name;
        }
        if (dir) closedir(dir);
    }
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    size_t used = 0;
    if (len) out[0] = 0;
    for (int i = 0; i < n; i++) {
        if (len && used < len) used += (size_t)snprintf(out + used, len - used, "%s%s", i ? ", " : "", names[i]);
        free(names[i]);
    }
    if (len && !n) snprintf(out, len, "(none found)");
}

/* The file of NAME_OR_PATH into `path`: CT_OK, or CT_ERR_INVALID with the error saying where it looked. */
static ct_status resolve(const char *name_or_path, char *path, size_t len) {
    if (!is_name(name_or_path)) {
        if (strlen(name_or_path) < len) {
            snprintf(path, len, "%s", name_or_path);
            return CT_OK;
        }
        return ct_fail(CT_ERR_INVALID, "%.200s...: the path is longer than %zu bytes", name_or_path, len - 1);
    }
    char dirs[HW_MAX_DIRS][PATH_MAX], looked[1024] = "", known[1024];
    int n_dirs = valid_name(name_or_path) ? search_dirs(dirs, HW_MAX_DIRS) : 0;
    size_t used = 0;
    for (int d = 0; d < n_dirs; d++) {
        char candidate[PATH_MAX + 128], real[PATH_MAX];
        snprintf(candidate, sizeof candidate, "%.*s/%.100s.yaml", PATH_MAX - 1, dirs[d], name_or_path);
        const char *found = realpath(candidate, real) ? real : candidate; /* build/../configs -> configs */
        if (is_file(candidate) && strlen(found) < len) {
            snprintf(path, len, "%s", found);
            return CT_OK;
        }
        if (used < sizeof looked)
            used += (size_t)snprintf(looked + used, sizeof looked - used, "%s%s", d ? ", " : "", dirs[d]);
    }
    hw_profile_list(known, sizeof known);
    if (!n_dirs)
        ct_set_error("hardware '%.100s': neither a profile name (letters, digits, '.', '_', '-') nor a .yaml "
                     "file; known names: %s", name_or_path, known);
    else
        ct_set_error("hardware '%s': no profile by that name (looked in %s; $CTITAN_HARDWARE_PATH adds "
                     "folders); known names: %s; or give a path to a .yaml file", name_or_path, looked, known);
    return CT_ERR_INVALID;
}

ct_status hw_profile_load(const char *name_or_path, hw_profile *hw) {
    memset(hw, 0, sizeof *hw);
    char path[sizeof hw->path];
    if (!name_or_path || !*name_or_path)
        return ct_fail(CT_ERR_INVALID, "hardware: no profile given; expected a NAME (configs/hardware/NAME.yaml) or "
                       "a FILE");
    ct_status rc = resolve(name_or_path, path, sizeof path);
    if (rc != CT_OK) return rc;
    rc = read_profile(path, hw);
    if (rc != CT_OK) {
        hw_profile_free(hw);
        return rc;
    }
    snprintf(hw->path, sizeof hw->path, "%s", path);
    return CT_OK;
}

void hw_profile_free(hw_profile *hw) {
    if (!hw) return;
    free(hw->ops);
    free(hw->comms);
    memset(hw, 0, sizeof *hw);
}

/* ---- writing ---- */

/* The text of a measurement (seconds, bytes) that reads back as exactly x. */
static void format_plain(double x, char *buf, size_t len) {
    static const hw_key plain = {.section = "", .key = "", .type = T_NUM, .what = ""};
    format_key_value(&plain, x, buf, len);
}

static const char *comm_name(int kind) {
    for (int i = 0; i < N_COMM_NAMES; i++)
        if (comm_names[i].kind == kind) return comm_names[i].name;
    return NULL;
}

/* The keys the writer prints: of two spellings of one value, the first. */
static int writes_key(int ki) { return !keys[ki].alt || keys[ki].alt > ki; }

/* What hw_profile_load would refuse, refused before writing, so that what is written reads back. */
static ct_status check_fields(const hw_profile *hw, const char *path) {
    for (int ki = 0; ki < K_N; ki++) {
        const hw_key *k = &keys[ki];
        char expect[160], text[64];
        const char *bad = NULL;
        expect_text(k, expect, sizeof expect);
        if (k->type == T_STR) {
            const char *s = (const char *)hw + k->off;
            size_t cap = ki == K_NAME ? sizeof hw->name : sizeof hw->source;
            bad = !memchr(s, 0, cap) ? "is too long" : !*s ? "is empty" : text_problem(s);
        } else if (k->type == T_INT) {
            int v = *(const int *)((const char *)hw + k->off);
            bad = v < k->lo || v > k->hi ? "is out of range" : NULL;
        } else if (k->type == T_BOOL) {
            int v = *(const int *)((const char *)hw + k->off);
            bad = v != 0 && v != 1 ? "is neither 0 nor 1" : NULL;
        } else if (writes_key(ki) && !(k->optional && cfield(hw, k) == 0)) {
            /* the range is checked on the text to be written, as the loader will check it */
            double x = cfield(hw, k), human, base;
            if (isfinite(x)) format_key_value(k, x, text, sizeof text);
            bad = !isfinite(x) || parse_key_value(k, text, &human, &base) || !in_range(k, human) ? "is out of range"
                                                                                                : NULL;
        }
        if (bad) {
            return ct_fail(CT_ERR_INVALID, "%s: %s%s%s: the value %s; expected %s", path, k->section,
                           *k->section ? "." : "", k->key, bad, expect);
        }
    }
    if (hw->overhead_bytes >= hw->mem_bytes)
        return ct_fail(CT_ERR_INVALID, "%s: assumptions.runtime_overhead_gib: not less than memory.size_gib", path);
    return CT_OK;
}

static ct_status check_measured(const hw_profile *hw, const char *path) {
    if (hw->n_ops < 0 || hw->n_ops > HW_MAX_ENTRIES || hw->n_comms < 0 || hw->n_comms > HW_MAX_ENTRIES ||
        (hw->n_ops && !hw->ops) || (hw->n_comms && !hw->comms)) {
        return ct_fail(CT_ERR_INVALID, "%s: measured: %d ops and %d collectives; expected 0 to %d of each", path,
                       hw->n_ops, hw->n_comms, HW_MAX_ENTRIES);
    }
    for (int i = 0; i < hw->n_ops; i++) {
        const plan_measured_op *o = &hw->ops[i];
        int bad = o->kind < 0 || o->kind >= RT_OP_NKINDS || o->dtype < 0 || o->dtype >= PLAN_NDTYPES ||
                  !(o->seconds[0] > 0 && o->seconds[0] <= 1e6) || !(o->seconds[1] >= 0 && o->seconds[1] <= 1e6);
        for (int d = 0; d < 4; d++) bad |= o->shape[d] < 0 || o->shape[d] > (int64_t)1 << 62;
        if (!bad) continue;
        return ct_fail(CT_ERR_INVALID, "%s: measured.ops[%d]: kind %d, dtype %d, shape or seconds out of range", path,
                       i, o->kind, o->dtype);
    }
    for (int i = 0; i < hw->n_comms; i++) {
        const plan_measured_comm *c = &hw->comms[i];
        if (comm_name(c->kind) && c->ranks >= 1 && c->ranks <= 1048576 && c->bytes > 0 && c->bytes <= 1e18 &&
            c->seconds > 0 && c->seconds <= 1e6)
            continue;
        return ct_fail(CT_ERR_INVALID, "%s: measured.comms[%d]: kind %d (expected all_gather %d, reduce_scatter %d "
                       "or all_reduce %d), ranks, bytes or seconds out of range", path, i, c->kind, CT_COLL_ALL_GATHER,
                       CT_COLL_REDUCE_SCATTER, CT_COLL_ALL_REDUCE);
    }
    return CT_OK;
}

/* The loader refuses two measurements of one thing, so the writer does too. */
static ct_status check_unique(const hw_profile *hw, const char *path) {
    int n = hw->n_ops > hw->n_comms ? hw->n_ops : hw->n_comms, a, b;
    ct_status rc = CT_OK;
    entry_line *lines = n ? calloc((size_t)n, sizeof *lines) : NULL;
    if (n && !lines) return ct_fail(CT_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < hw->n_ops; i++) lines[i] = (entry_line){.index = i, .op = hw->ops[i]};
    if ((b = find_duplicate(lines, hw->n_ops, 1, &a)) >= 0) {
        rc = ct_fail(CT_ERR_INVALID, "%s: measured.ops[%d]: the same kind, shape and dtype as measured.ops[%d]", path,
                     lines[b].index, lines[a].index);
    }
    for (int i = 0; !rc && i < hw->n_comms; i++) lines[i] = (entry_line){.index = i, .comm = hw->comms[i]};
    if (!rc && (b = find_duplicate(lines, hw->n_comms, 0, &a)) >= 0) {
        rc = ct_fail(CT_ERR_INVALID, "%s: measured.comms[%d]: the same kind, ranks and bytes as measured.comms[%d]",
                     path, lines[b].index, lines[a].index);
    }
    free(lines);
    return rc;
}

static int section_optional(const char *section) {
    for (int ki = 0; ki < K_N; ki++)
        if (!strcmp(keys[ki].section, section) && !keys[ki].optional) return 0;
    return 1;
}

static void write_section(FILE *f, const hw_profile *hw, const char *section) {
    int any = 0;
    for (int ki = 0; ki < K_N; ki++)
        any |= !strcmp(keys[ki].section, section) && !(keys[ki].optional && keys[ki].type == T_NUM && cfield(hw, &keys[ki]) == 0);
    if (*section && !any) return; /* an optional section with nothing given */
    if (*section) fprintf(f, "%s:\n", section);
    for (int ki = 0; ki < K_N; ki++) {
        const hw_key *k = &keys[ki];
        if (strcmp(k->section, section) || !writes_key(ki)) continue;
        if (k->optional && k->type == T_NUM && cfield(hw, k) == 0) continue; /* not given: left out */
        fprintf(f, "%s%s: ", *section ? "  " : "", k->key);
        if (k->type == T_STR) write_quoted(f, (const char *)hw + k->off);
        else if (k->type == T_INT) fprintf(f, "%d", *(const int *)((const char *)hw + k->off));
        else if (k->type == T_BOOL) fputs(*(const int *)((const char *)hw + k->off) ? "true" : "false", f);
        else {
            char text[64];
            format_key_value(k, cfield(hw, k), text, sizeof text);
            fputs(text, f);
        }
        fputc('\n', f);
    }
}

static void write_measured(FILE *f, const hw_profile *hw) {
    char a[64], b[64];
    if (!hw->n_ops && !hw->n_comms) return;
    fprintf(f, "measured:           # seconds per call at exactly these shapes (ctitan plan --calibrate)\n");
    if (hw->n_ops) fprintf(f, "  ops:\n");
    for (int i = 0; i < hw->n_ops; i++) {
        const plan_measured_op *o = &hw->ops[i];
        format_plain(o->seconds[0], a, sizeof a);
        format_plain(o->seconds[1], b, sizeof b);
        fprintf(f, "    - {kind: %s, shape: [%lld, %lld, %lld, %lld], dtype: %s, forward_s: %s, backward_s: %s}\n",
                op_names[o->kind], (long long)o->shape[0], (long long)o->shape[1], (long long)o->shape[2],
                (long long)o->shape[3], dtype_names[o->dtype], a, b);
    }
    if (hw->n_comms) fprintf(f, "  comms:\n");
    for (int i = 0; i < hw->n_comms; i++) {
        const plan_measured_comm *c = &hw->comms[i];
        format_plain(c->bytes, a, sizeof a);
        format_plain(c->seconds, b, sizeof b);
        fprintf(f, "    - {kind: %s, ranks: %d, bytes: %s, seconds: %s}\n", comm_name(c->kind), c->ranks, a, b);
    }
}

static void write_profile(FILE *f, const hw_profile *hw) {
    fprintf(f, "# ctitan hardware profile: configs/hardware/README.md gives every key and its unit.\n");
    write_section(f, hw, "");
    for (int i = 0; i < N_SECTIONS; i++) write_section(f, hw, sections[i]);
    write_measured(f, hw);
}

/* Written to a temporary file beside `path`, flushed to disk, then renamed over it: a reader never
 * sees half a profile. */
ct_status hw_profile_write(const hw_profile *hw, const char *path) {
    ct_status st = check_fields(hw, path);
    if (st == CT_OK) st = check_measured(hw, path);
    if (st == CT_OK) st = check_unique(hw, path);
    if (st != CT_OK) return st;
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", path) >= (int)sizeof tmp)
        return ct_fail(CT_ERR_INVALID, "%.200s...: the path is too long", path);
    int fd = mkstemp(tmp);
    if (fd < 0) return ct_fail(CT_ERR_IO, "%s: cannot create %s: %s", path, tmp, strerror(errno));
    mode_t mask = umask(0);
    umask(mask);
    FILE *f = fchmod(fd, 0666 & ~mask) == 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        ct_set_error("%s: cannot write %s: %s", path, tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        return CT_ERR_IO;
    }
    write_profile(f, hw);
    int bad = fflush(f) || fsync(fileno(f)) || ferror(f);
    int saved = errno;
    bad |= fclose(f) != 0;
    if (!bad && rename(tmp, path) == 0) return CT_OK;
    ct_set_error("%s: cannot write hardware profile: %s", path, strerror(bad ? saved : errno));
    unlink(tmp);
    return CT_ERR_IO;
}

/* ---- measurements ---- */

double hw_measured_op(const hw_profile *hw, int kind, const int64_t shape[4], int dtype, int backward) {
    for (int i = 0; hw && i < hw->n_ops; i++) {
        const plan_measured_op *o = &hw->ops[i];
        if (o->kind == kind && o->dtype == dtype && !memcmp(o->shape, shape, sizeof o->shape))
            return o->seconds[backward != 0];
    }
    return -1;
}

/* A collective's time is close to latency + bytes / bandwidth: linear in bytes, so between two
 * measured sizes the line through them is the estimate; below the smallest, the smallest's time
 * (latency bounds it from below); above the largest, the largest's bandwidth. */
double hw_measured_comm(const hw_profile *hw, int kind, int ranks, double bytes) {
    const plan_measured_comm *below = NULL, *above = NULL, *largest = NULL;
    for (int i = 0; hw && i < hw->n_comms; i++) {
        const plan_measured_comm *c = &hw->comms[i];
        if (c->kind != kind || c->ranks != ranks) continue;
        if (c->bytes <= bytes && (!below || c->bytes > below->bytes)) below = c;
        if (c->bytes >= bytes && (!above || c->bytes < above->bytes)) above = c;
        if (!largest || c->bytes > largest->bytes) largest = c;
    }
    if (!largest || !(bytes >= 0)) return -1;
    if (bytes == 0) return 0;
    if (below && above)
        return below == above ? below->seconds
                              : below->seconds + (above->seconds - below->seconds) * (bytes - below->bytes) /
                                                     (above->bytes - below->bytes);
    if (above) return above->seconds;
    return largest->seconds * bytes / largest->bytes;
}
