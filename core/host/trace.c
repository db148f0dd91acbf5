/* trace.c: the profiler's events, kept in memory while a window is open and written as Chrome trace
 * JSON per rank; the merge of ranks into one file; the memory ledger and its peak snapshot. */
#include "host/trace.h"

#include "host/host.h"
#include "base/util.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* One event; its name and args are offsets into the string pool (args SIZE_MAX: none). */
typedef struct trace_event {
    size_t name, cat, args;
    double ts_us, dur_us;
    char ph; /* 'B', 'E', 'X' or 'C' */
    int tid;
} trace_event;

#define TRACE_MAX_EVENTS ((size_t)1 << 22)  /* bounded: events past 4M in one window are dropped */
#define TRACE_MAX_STRINGS ((size_t)1 << 28) /* and names and args past 256 MiB */
#define NONE SIZE_MAX

static struct {
    int enabled; /* profiling.enable_profiling */
    int on;      /* a window is open */
    pthread_mutex_t lock;
    trace_event *ev;
    size_t n, cap;
    char *str;
    size_t str_n, str_cap;
    struct timespec t0;
    double base_us; /* wall clock at t0: ranks' timestamps line up in the merged file */
    int64_t last_mem[CT_MEM_NCATEGORIES];
    int mem_sampled;
} g_trace = {.lock = PTHREAD_MUTEX_INITIALIZER};

static atomic_int next_tid;
static _Thread_local int my_tid = -1;

void trace_enable(int on) {
    struct timespec wall;
    g_trace.enabled = on;
    clock_gettime(CLOCK_MONOTONIC, &g_trace.t0);
    clock_gettime(CLOCK_REALTIME, &wall);
    g_trace.base_us = (double)wall.tv_sec * 1e6 + (double)(wall.tv_nsec / 1000);
}

int trace_set_on(int on) {
    int was = g_trace.on;
    g_trace.on = on && g_trace.enabled;
    if (g_trace.on && !was) g_trace.mem_sampled = 0; /* a window starts with its counters */
    return was;
}

int trace_active(void) { return g_trace.on; }

double trace_now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return g_trace.base_us + (double)(t.tv_sec - g_trace.t0.tv_sec) * 1e6 +
           (double)(t.tv_nsec - g_trace.t0.tv_nsec) / 1e3;
}

/* A copy of s in the pool (lock held); NONE when full. */
static size_t pool_put(const char *s) {
    if (!s) return NONE;
    size_t len = strlen(s) + 1;
    if (g_trace.str_n + len > g_trace.str_cap) {
        size_t cap = g_trace.str_cap ? g_trace.str_cap * 2 : 1 << 16;
        while (cap < g_trace.str_n + len) cap *= 2;
        if (cap > TRACE_MAX_STRINGS) return NONE;
        char *p = realloc(g_trace.str, cap);
        if (!p) return NONE;
        g_trace.str = p;
        g_trace.str_cap = cap;
    }
    memcpy(g_trace.str + g_trace.str_n, s, len);
    g_trace.str_n += len;
    return g_trace.str_n - len;
}

static void push(const char *name, const char *cat, char ph, double ts, double dur, const char *args) {
    if (!g_trace.on) return;
    if (my_tid < 0) my_tid = atomic_fetch_add(&next_tid, 1);
    pthread_mutex_lock(&g_trace.lock);
    if (g_trace.n == g_trace.cap) {
        size_t cap = g_trace.cap ? g_trace.cap * 2 : 4096;
        trace_event *e = cap > TRACE_MAX_EVENTS ? NULL : realloc(g_trace.ev, cap * sizeof *e);
        if (!e) goto out;
        g_trace.ev = e;
        g_trace.cap = cap;
    }
    /* names are copied: a model pack may hand out one buffer for every unit's name */
    size_t n = pool_put(name ? name : "?"), c = pool_put(cat), a = pool_put(args);
    if (n == NONE || (cat && c == NONE) || (args && a == NONE)) goto out;
    g_trace.ev[g_trace.n++] = (trace_event){n, c, a, ts, dur, ph, my_tid};
out:
    pthread_mutex_unlock(&g_trace.lock);
}

void trace_begin(const char *name) {
    if (!g_trace.on) return;
    trace_mem_sample();
    push(name, NULL, 'B', trace_now_us(), 0, NULL);
}

void trace_end(const char *name) {
    if (!g_trace.on) return;
    push(name, NULL, 'E', trace_now_us(), 0, NULL);
    trace_mem_sample();
}

void trace_complete(const char *name, const char *cat, double t0_us, const char *args) {
    if (!g_trace.on) return;
    push(name, cat, 'X', t0_us, trace_now_us() - t0_us, args);
}

void trace_mem_sample(void) {
    if (!g_trace.on) return;
    int64_t cur[CT_MEM_NCATEGORIES];
    pthread_mutex_lock(&g_trace.lock); /* a plugin's thread may count memory too */
    memcpy(cur, g_mem.cur, sizeof cur);
    int same = g_trace.mem_sampled && !memcmp(g_trace.last_mem, cur, sizeof cur);
    memcpy(g_trace.last_mem, cur, sizeof cur);
    g_trace.mem_sampled = 1;
    pthread_mutex_unlock(&g_trace.lock);
    if (same) return;
    char args[512];
    int k = snprintf(args, sizeof args, "{");
    for (int c = 0; c < CT_MEM_NCATEGORIES; c++)
        k += snprintf(args + k, sizeof args - (size_t)k, "%s\"%s\":%lld", c ? "," : "",
                      mem_category_name((ct_mem_category)c), (long long)cur[c]);
    snprintf(args + k, sizeof args - (size_t)k, "}");
    push("memory", NULL, 'C', trace_now_us(), 0, args);
}

void trace_discard(void) {
    free(g_trace.ev);
    free(g_trace.str);
    g_trace.ev = NULL;
    g_trace.str = NULL;
    g_trace.n = g_trace.cap = g_trace.str_n = g_trace.str_cap = 0;
}

/* A name as a JSON string body: a plugin's unit name may hold a quote or a control character. */
static void put_json_str(FILE *f, const char *s) {
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
        else if (*c < 0x20) fprintf(f, "\\u%04x", *c);
        else fputc(*c, f);
    }
}

/* Closes a file written under a temporary name and renames it into place. */
static ct_status finish_file(FILE *f, const char *tmp, const char *path) {
    int bad = ferror(f);
    bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        ct_set_error("%s: cannot write: %s", path, strerror(errno ? errno : EIO));
        unlink(tmp);
        return CT_ERR_IO;
    }
    return CT_OK;
}

static FILE *open_tmp(const char *path, char *tmp, size_t tmplen) {
    snprintf(tmp, tmplen, "%s.tmp", path);
    FILE *f = ct_fopen_nofollow(tmp, "w");
    if (!f) ct_set_error("%s: cannot write: %s", tmp, ct_open_strerror(errno));
    return f;
}

/* The file's first line opens traceEvents and its last closes it, so the merge joins the lines
 * between without parsing JSON. */
ct_status trace_write_rank(const char *path, int rank) {
    char tmp[PATH_MAX];
    FILE *f = open_tmp(path, tmp, sizeof tmp);
    if (!f) {
        g_trace.n = g_trace.str_n = 0; /* the window is lost; the next starts empty */
        return CT_ERR_IO;
    }
    fprintf(f, "{\"traceEvents\":[\n");
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"ts\":0,\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank %d\"}},\n"
               "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"ts\":0,\"pid\":%d,\"tid\":0,\"args\":{\"sort_index\":%d}}",
            rank, rank, rank, rank);
    for (size_t i = 0; i < g_trace.n; i++) {
        const trace_event *e = &g_trace.ev[i];
        fprintf(f, ",\n{\"name\":\"");
        put_json_str(f, g_trace.str + e->name);
        fprintf(f, "\",\"ph\":\"%c\",\"ts\":%.3f,\"pid\":%d,\"tid\":%d", e->ph, e->ts_us, rank, e->tid);
        if (e->ph == 'X') fprintf(f, ",\"dur\":%.3f", e->dur_us);
        if (e->cat != NONE) {
            fprintf(f, ",\"cat\":\"");
            put_json_str(f, g_trace.str + e->cat);
            fputc('"', f);
        }
        if (e->args != NONE) fprintf(f, ",\"args\":%s", g_trace.str + e->args); /* built by us: valid JSON */
        fputc('}', f);
    }
    fprintf(f, "\n]}\n");
    g_trace.n = g_trace.str_n = 0; /* the buffers stay for the next window: no page faults inside it */
    return finish_file(f, tmp, path);
}

ct_status trace_merge(const char *path, const char *dir, int world) {
    char tmp[PATH_MAX], in[PATH_MAX];
    char *buf = NULL;
    FILE *f = open_tmp(path, tmp, sizeof tmp), *r = NULL;
    ct_status st = CT_ERR_IO;
    if (!f) return CT_ERR_IO;
    fprintf(f, "{\"traceEvents\":[\n");
    for (int rank = 0; rank < world; rank++) {
        snprintf(in, sizeof in, "%s/rank%d_trace.json", dir, rank);
        size_t len = 0;
        r = fopen(in, "rb");
        if (!r || fseek(r, 0, SEEK_END) || (long)(len = (size_t)ftell(r)) < 0 || fseek(r, 0, SEEK_SET)) {
            ct_set_error("%s: cannot read: %s", in, strerror(errno));
            goto fail;
        }
        free(buf);
        buf = malloc(len + 1);
        if (!buf || fread(buf, 1, len, r) != len) {
            ct_set_error("%s: cannot read", in);
            goto fail;
        }
        fclose(r);
        r = NULL;
        buf[len] = 0;
        static const char head[] = "{\"traceEvents\":[\n", tail[] = "\n]}\n";
        if (len < sizeof head + sizeof tail || memcmp(buf, head, sizeof head - 1) ||
            strcmp(buf + len - (sizeof tail - 1), tail)) {
            st = ct_fail(CT_ERR_INVALID, "%s: not a trace this version wrote", in);
            goto fail;
        }
        buf[len - (sizeof tail - 1)] = 0;
        fprintf(f, "%s%s", rank ? ",\n" : "", buf + sizeof head - 1);
    }
    free(buf);
    fprintf(f, "\n]}\n");
    return finish_file(f, tmp, path);
fail:
    free(buf);
    if (r) fclose(r);
    fclose(f);
    unlink(tmp);
    return st;
}

/* ---- the memory ledger ---- */
#define LEDGER_MAX 512
typedef struct ledger_entry {
    int cat;
    const char *owner; /* interned */
    int64_t bytes;
} ledger_entry;
typedef struct ledger {
    ledger_entry e[LEDGER_MAX];
    int n;
    int64_t cur[CT_MEM_NCATEGORIES], total;
} ledger;
static ledger g_ledger, g_peak;
static int g_armed, g_paused;
static pthread_mutex_t ledger_lock = PTHREAD_MUTEX_INITIALIZER;

/* Interned owner names: few (a name per plugin, unit and category), kept for the process. */
static struct {
    char **s;
    int n, cap;
} g_names;

static const char *mem_owner_intern(const char *owner) {
    for (int i = 0; i < g_names.n; i++)
        if (!strcmp(g_names.s[i], owner)) return g_names.s[i];
    if (g_names.n == g_names.cap) {
        int cap = g_names.cap ? g_names.cap * 2 : 64;
        char **p = realloc(g_names.s, (size_t)cap * sizeof *p);
        if (!p) return "?";
        g_names.s = p;
        g_names.cap = cap;
    }
    char *c = strdup(owner);
    if (!c) return "?";
    return g_names.s[g_names.n++] = c;
}

static const char *default_owner(ct_mem_category cat) {
    static const char *names[CT_MEM_NCATEGORIES] = {"parameters", "gradients", "optimizer states", "activations",
                                                    "comm buffers", "tape and tensor descriptors", "master weights"};
    return (unsigned)cat < CT_MEM_NCATEGORIES ? names[cat] : "other";
}

int memledger_pause(int paused) {
    int was = g_paused;
    g_paused = paused;
    return was;
}

void memledger_note(ct_mem_category cat, const char *owner, int64_t delta) {
    if (g_paused) return;
    if ((unsigned)cat >= CT_MEM_NCATEGORIES) cat = CT_MEM_OTHER;
    owner = owner ? owner : default_owner(cat);
    pthread_mutex_lock(&ledger_lock);
    ledger *l = &g_ledger;
    int i = 0;
    while (i < l->n && !(l->e[i].cat == (int)cat && !strcmp(l->e[i].owner, owner))) i++;
    if (i == l->n && l->n < LEDGER_MAX) l->e[l->n++] = (ledger_entry){(int)cat, mem_owner_intern(owner), 0};
    else if (i == l->n) /* full (never so far): an entry of the category takes the bytes, keeping the sums */
        for (i = 0; i < l->n - 1 && l->e[i].cat != (int)cat; i++) {
        }
    l->e[i].bytes += delta;
    l->cur[cat] += delta;
    l->total += delta;
    if (g_armed && l->total > g_peak.total) g_peak = *l;
    pthread_mutex_unlock(&ledger_lock);
}

void memsnap_arm(void) {
    pthread_mutex_lock(&ledger_lock);
    g_peak = g_ledger;
    g_armed = 1;
    pthread_mutex_unlock(&ledger_lock);
}

void memsnap_freeze(void) {
    pthread_mutex_lock(&ledger_lock);
    g_armed = 0;
    pthread_mutex_unlock(&ledger_lock);
}

static void put_entry(FILE *f, int *first, int cat, const char *owner, int64_t bytes) {
    fprintf(f, "%s\n  {\"category\": \"%s\", \"owner\": \"", *first ? "" : ",", mem_category_name((ct_mem_category)cat));
    put_json_str(f, owner);
    fprintf(f, "\", \"bytes\": %lld}", (long long)bytes);
    *first = 0;
}

ct_status memsnap_write(const char *path, int rank, int64_t step, const char *const *names, const int64_t *bytes,
                        int n) {
    pthread_mutex_lock(&ledger_lock);
    ledger *snap = malloc(sizeof *snap);
    if (snap) *snap = g_peak;
    pthread_mutex_unlock(&ledger_lock);
    if (!snap) return ct_fail(CT_ERR_NOMEM, "%s: out of memory", path);
    char tmp[PATH_MAX];
    FILE *f = open_tmp(path, tmp, sizeof tmp);
    if (!f) {
        free(snap);
        return CT_ERR_IO;
    }
    fprintf(f, "{\"rank\": %d, \"step\": %lld, \"total_bytes\": %lld, \"counters\": {", rank, (long long)step,
            (long long)snap->total);
    for (int c = 0; c < CT_MEM_NCATEGORIES; c++)
        fprintf(f, "%s\"%s\": %lld", c ? ", " : "", mem_category_name((ct_mem_category)c), (long long)snap->cur[c]);
    fprintf(f, "},\n \"live\": [");
    int first = 1;
    for (int i = 0; i < snap->n; i++) {
        const ledger_entry *e = &snap->e[i];
        if (!e->bytes) continue;
        int params = e->cat == CT_MEM_PARAMS && !strcmp(e->owner, "parameters"),
            grads = e->cat == CT_MEM_GRADS && !strcmp(e->owner, "gradients");
        int64_t left = e->bytes;
        if (params || grads) /* one entry per tensor; what is left is alignment padding */
            for (int j = 0; j < n && bytes[j] <= left; j++) {
                put_entry(f, &first, e->cat, names[j], bytes[j]);
                left -= bytes[j];
            }
        if (left) put_entry(f, &first, e->cat, params || grads ? (params ? "parameters (alignment padding)" : "gradients (alignment padding)") : e->owner, left);
    }
    fprintf(f, "\n]}\n");
    free(snap);
    return finish_file(f, tmp, path);
}
