/* cmd_config.c: `ctitan config import FILE.toml [--output FILE.yaml]`: torchtitan's TOML config as the
 * equivalent YAML manifest. Keys are written as read, torchtitan's mapped ones under ctitan's key; the
 * ones with no effect in ctitan become comments naming why; a refused one is an error line. */
#include "cmd/cmd_config.h"

#include "config/manifest.h"
#include "config/torchtitan_keys.h"
#include "base/error.h"
#include "base/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "usage: ctitan config import FILE.toml [--output FILE.yaml]\n"
    "  Writes torchtitan's TOML config (v0.2.2's keys) as a ctitan YAML manifest, on standard output or\n"
    "  into FILE.yaml: every key as given, torchtitan's keys that are not ctitan's mapped onto ctitan's\n"
    "  (debug.seed -> training.seed, [float8] -> [quantize.linear.float8]) or, where they have no effect\n"
    "  in ctitan, kept as comments saying why (docs/torchtitan_keys.md). A refused key or value is one\n"
    "  error line naming file:line: key. `ctitan train FILE.toml` reads the TOML file directly as well;\n"
    "  check the written manifest with `ctitan train FILE.yaml --dry-run` (plugins' keys are checked there).\n"
    "Exit status 0; 2 for bad usage or a config refused; 1 when the output cannot be written.\n";

static int by_key(const void *a, const void *b) {
    return strcmp((*(const mf_value *const *)a)->key, (*(const mf_value *const *)b)->key);
}

/* One scalar as YAML: plain when it is a simple word or number, else double-quoted. */
static void put_scalar(FILE *f, const char *s) {
    size_t n = strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./+-");
    if (*s && !s[n] && (*s != '-' || (s[1] >= '0' && s[1] <= '9')) && *s != '.') {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\x%02x", (unsigned char)*s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

/* A value: a scalar, a list of plain values ([a, b]) or a list of maps ([{path: a, weight: 2}, ...]). */
static void put_value(FILE *f, const manifest *m, const mf_value *v) {
    if (v->is_seq == 1) {
        fputc('[', f);
        for (const char *p = v->value; *p;) {
            size_t n = strcspn(p, ",");
            char *item = strndup(p, n);
            if (item) put_scalar(f, item);
            free(item);
            p += n + (p[n] == ',');
            if (*p) fputs(", ", f);
        }
        fputc(']', f);
        return;
    }
    if (v->is_seq != 2) {
        put_scalar(f, v->value);
        return;
    }
    int n = mf_list_len(m, v->key);
    fputc('[', f);
    for (int i = 0; i < n; i++) {
        char item[MF_MAX_KEY_LEN + 8];
        int il = snprintf(item, sizeof item, "%s[%d].", v->key, i), first = 1;
        fprintf(f, "%s{", i ? ", " : "");
        for (int j = 0; j < m->n_values; j++) {
            const mf_value *w = &m->values[j];
            if (strncmp(w->key, item, (size_t)il) || !w->value) continue;
            fprintf(f, "%s%s: ", first ? "" : ", ", w->key + il);
            put_scalar(f, w->value);
            first = 0;
        }
        fputc('}', f);
    }
    fputc(']', f);
}

/* The YAML: sections nested by the keys' dotted parts, in key order; then the comments. */
static void write_yaml(FILE *f, const manifest *m, const mf_value **vs, int n, const char *path) {
    fprintf(f, "# ctitan manifest from torchtitan's %s (ctitan config import)\n", path);
    const char *prev = "";
    for (int i = 0; i < n; i++) {
        const char *k = vs[i]->key;
        /* the dotted parts this key shares with the previous one are open already */
        int shared = 0;
        for (const char *a = k, *b = prev;;) {
            size_t la = strcspn(a, "."), lb = strcspn(b, ".");
            if (!a[la] || !b[lb] || la != lb || strncmp(a, b, la)) break;
            shared++;
            a += la + 1;
            b += lb + 1;
        }
        const char *p = k;
        for (int d = 0; strchr(p, '.'); d++) {
            size_t l = strcspn(p, ".");
            if (d >= shared) fprintf(f, "%*s%.*s:\n", 2 * d, "", (int)l, p);
            p += l + 1;
        }
        int depth = 0;
        for (const char *c = k; *c; c++) depth += *c == '.';
        fprintf(f, "%*s%s: ", 2 * depth, "", p);
        put_value(f, m, vs[i]);
        fputc('\n', f);
        prev = k;
    }
}

/* The keys to write: torchtitan's mapped ones renamed; no-effect ones and dataset names as comments. */
static ct_status import(const char *in, FILE *out) {
    manifest *m = manifest_load(in);
    if (!m) {
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        return CT_ERR_INVALID;
    }
    manifest_add_core_schema(m);
    ct_status st = CT_OK;
    const mf_value **vs = calloc((size_t)m->n_values + 1, sizeof *vs);
    char *notes = NULL;
    size_t notes_len = 0;
    FILE *nf = open_memstream(&notes, &notes_len);
    int n = 0;
    if (!vs || !nf) {
        fprintf(stderr, "ctitan: out of memory\n");
        st = CT_ERR_NOMEM;
        goto done;
    }
    if (manifest_torchtitan(m, 1) != CT_OK &&
        !strstr(ct_last_error(), "is a torchtitan dataset name")) { /* a dataset name is noted below instead */
        fprintf(stderr, "ctitan: %s\n", ct_last_error());
        st = CT_ERR_INVALID;
        goto done;
    }
    for (int i = 0; i < m->n_values; i++) {
        const mf_value *v = &m->values[i];
        const tt_key *t = tt_key_find(v->key);
        if (strchr(v->key, '[')) continue; /* an item of a list of maps: written with its list */
        if ((!strcmp(v->key, "training.dataset") || !strcmp(v->key, "validation.dataset")) && v->value && !v->is_seq &&
            (!strcmp(v->value, "c4") || !strcmp(v->value, "c4_test") || !strcmp(v->value, "c4_validation"))) {
            fprintf(nf, "# %s: %s  (line %d: a torchtitan dataset name; give %s_path a token shard from `ctitan "
                        "tokenize`)\n", v->key, v->value, v->line, v->key);
            continue;
        }
        if (t) {
            if (manifest_torchtitan_check(m, v) != CT_OK) {
                fprintf(stderr, "ctitan: %s\n", ct_last_error());
                st = CT_ERR_INVALID;
                goto done;
            }
            if (!t->maps_to) fprintf(nf, "# %s: %s  (line %d: no effect in ctitan: %s)\n", v->key, v->value, v->line,
                                     t->reason);
            continue; /* a mapped key: its value is at ctitan's key (manifest_torchtitan copied it) */
        }
        vs[n++] = v;
    }
    qsort(vs, (size_t)n, sizeof *vs, by_key);
    write_yaml(out, m, vs, n, in);
    fflush(nf);
    if (notes_len) fprintf(out, "\n# torchtitan's keys with no counterpart here (docs/torchtitan_keys.md):\n%s", notes);
done:
    if (nf) fclose(nf);
    free(notes);
    free(vs);
    manifest_free(m);
    return st;
}

ct_status cmd_config(int argc, char **argv) {
    const char *in = NULL, *output = NULL, *v;
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(usage, stdout);
        return CT_OK;
    }
    if (argc < 2 || strcmp(argv[1], "import")) {
        fprintf(stderr, "ctitan config: expected `import` (%.*s)\n", (int)strcspn(usage, "\n"), usage);
        return CT_ERR_INVALID;
    }
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage, stdout);
            return CT_OK;
        }
        if (ct_cli_opt(argc, argv, &i, "--output", &v)) {
            if (!v || !*v) {
                fprintf(stderr, "ctitan config import: --output needs a file name\n");
                return CT_ERR_INVALID;
            }
            output = v;
        } else if (!in && argv[i][0] != '-') in = argv[i];
        else {
            fprintf(stderr, "ctitan config import: unexpected argument '%s' (%.*s)\n", argv[i],
                    (int)strcspn(usage, "\n"), usage);
            return CT_ERR_INVALID;
        }
    }
    if (!in) {
        fprintf(stderr, "ctitan config import: no config given (%.*s)\n", (int)strcspn(usage, "\n"), usage);
        return CT_ERR_INVALID;
    }
    if (!output) return import(in, stdout);
    /* written beside its name, then renamed: never a half-written manifest */
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp-%d", output, (int)getpid()) >= (int)sizeof tmp) {
        fprintf(stderr, "ctitan config import: --output path too long\n");
        return CT_ERR_INVALID;
    }
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "ctitan config import: cannot write %s: %s\n", tmp, strerror(errno));
        return CT_ERR_IO;
    }
    ct_status st = import(in, f);
    int bad = ferror(f) | (fflush(f) != 0) | (fsync(fileno(f)) != 0);
    bad |= fclose(f) != 0;
    if (st == CT_OK && !bad && rename(tmp, output) == 0) return CT_OK;
    if (st == CT_OK) fprintf(stderr, "ctitan config import: cannot write %s: %s\n", output, strerror(errno));
    unlink(tmp);
    return st == CT_OK ? CT_ERR_IO : st;
}
