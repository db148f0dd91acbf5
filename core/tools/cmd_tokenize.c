/* cmd_tokenize.c: `ctitan tokenize` (text -> token shard) and `ctitan tokenizer train|encode|decode`. */
#include "tools/cmd_tokenize.h"
#include "host/util.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/shard.h"
#include "tools/tokenizer.h"

#define ERRLEN 512

static const char tokenize_usage[] =
    "usage: ctitan tokenize --tokenizer FILE --input FILE [--input FILE ...] --output SHARD\n"
    "                       [--format text|jsonl] [--split-on LINE] [--allow-special]\n"
    "\n"
    "Encodes documents into a token shard: each document becomes BOS + its tokens + EOS\n"
    "(<|begin_of_text|>, <|end_of_text|> for Llama 3; a tokenizer with no BOS, or one equal to its EOS,\n"
    "as GPT-2's <|endoftext|>, writes only the EOS after each document).\n"
    "\n"
    "  --tokenizer PATH   tiktoken tokenizer.model (Llama 3's, or `tokenizer train`'s), a Hugging Face\n"
    "                     tokenizer.json, or a model folder holding tokenizer.json (+ tokenizer_config.json\n"
    "                     for BOS/EOS), tokenizer.model or original/tokenizer.model\n"
    "  --input FILE       a file of documents; repeat for more files\n"
    "  --output SHARD     the shard to write (atomically: SHARD.tmp, then rename)\n"
    "  --format text      each file is one document (default)\n"
    "  --format jsonl     one JSON object per line; its \"text\" string is a document\n"
    "  --split-on LINE    text format: documents are separated by lines equal to LINE (fortune files: %)\n"
    "  --allow-special    special-token text in documents becomes the special token (default: plain text)\n"
    "  --help             this text\n";

static const char tokenizer_usage[] =
    "usage: ctitan tokenizer train  --input FILE [--input FILE ...] --vocab-size N --output FILE\n"
    "                               [--format text|jsonl] [--split-on LINE]\n"
    "       ctitan tokenizer encode --tokenizer PATH --text STR [--allow-special]\n"
    "       ctitan tokenizer decode --tokenizer PATH ID...\n"
    "\n"
    "  train    learns a byte-level BPE vocabulary on Llama 3's regex chunks and writes it in tiktoken\n"
    "           format; N counts the 256 special tokens, so the file holds N - 256 tokens\n"
    "  encode   prints the ids of STR (special-token text is plain text unless --allow-special)\n"
    "  decode   prints the bytes of the ids\n"
    "  PATH     a tokenizer.model, a tokenizer.json or a folder (as for `ctitan tokenize`)\n"
    "\n"
    "  --input FILE, --format, --split-on   as for `ctitan tokenize` (see ctitan tokenize --help)\n"
    "  --help   this text\n";

static ct_status usage_error(const char *cmd, const char *msg, const char *arg) {
    fprintf(stderr, "ctitan %s: %s%s%s (see ctitan %s --help)\n", cmd, msg, arg ? " " : "",
            arg ? arg : "", cmd);
    return CT_ERR_INVALID;
}

/* ---- documents ----------------------------------------------------------------------------------- */

typedef enum { FMT_TEXT, FMT_JSONL } doc_format;

/* Called once per non-empty document; non-zero stops the reading. */
typedef int (*doc_fn)(void *ctx, const char *text, size_t len, char *err, size_t errlen);

typedef struct doc_source {
    doc_format format;
    const char *split_on;   /* text format: separator line, or NULL for one document per file */
    uint64_t documents, bytes;
} doc_source;

static int parse_format(const char *s, doc_format *f) {
    if (strcmp(s, "text") == 0) *f = FMT_TEXT;
    else if (strcmp(s, "jsonl") == 0) *f = FMT_JSONL;
    else return -1;
    return 0;
}

static int emit(doc_source *src, const char *text, size_t len, doc_fn fn, void *ctx, char *err,
                size_t errlen) {
    if (len == 0) return 0;
    src->documents++;
    src->bytes += len;
    return fn(ctx, text, len, err, errlen);
}

/* A line without its "\n" and one "\r" before it. */
static size_t chomp(const char *line, size_t n) {
    if (n && line[n - 1] == '\n') n--;
    if (n && line[n - 1] == '\r') n--;
    return n;
}

static int jsonl_line(doc_source *src, const char *path, long lineno, const char *line, size_t n,
                      doc_fn fn, void *ctx, char *err, size_t errlen) {
    size_t k = 0;
    while (k < n && strchr(" \t\r\n", line[k])) k++;
    if (k == n) return 0;   /* blank lines are skipped */
    json_error_t je;
    json_t *obj = json_loadb(line, n, JSON_ALLOW_NUL, &je);
    if (!obj) {
        snprintf(err, errlen, "%s:%ld: invalid JSON: %s", path, lineno, je.text);
        return -1;
    }
    json_t *text = json_is_object(obj) ? json_object_get(obj, "text") : NULL;
    if (!json_is_string(text)) {
        snprintf(err, errlen, "%s:%ld: %s", path, lineno,
                 !json_is_object(obj) ? "expected a JSON object with a \"text\" string"
                 : text ? "\"text\" is not a string" : "no \"text\" field");
        json_decref(obj);
        return -1;
    }
    int rc = emit(src, json_string_value(text), json_string_length(text), fn, ctx, err, errlen);
    json_decref(obj);
    return rc;
}

/* Line-oriented formats: jsonl, and text with a separator line. */
static int read_lines(doc_source *src, const char *path, FILE *f, doc_fn fn, void *ctx, char *err,
                      size_t errlen) {
    char *line = NULL, *doc = NULL;
    size_t linecap = 0, doclen = 0, doccap = 0, seplen = src->split_on ? strlen(src->split_on) : 0;
    long lineno = 0;
    int rc = 0;
    ssize_t got;
    while (rc == 0 && (got = getline(&line, &linecap, f)) >= 0) {
        lineno++;
        size_t n = (size_t)got;
        if (src->format == FMT_JSONL) {
            rc = jsonl_line(src, path, lineno, line, n, fn, ctx, err, errlen);
            continue;
        }
        if (chomp(line, n) == seplen && memcmp(line, src->split_on, seplen) == 0) {
            rc = emit(src, doc, doclen, fn, ctx, err, errlen);
            doclen = 0;
            continue;
        }
        if (doclen + n > doccap) {
            size_t cap = doccap ? doccap : 4096;
            while (cap < doclen + n) cap *= 2;
            char *d = realloc(doc, cap);
            if (!d) {
                snprintf(err, errlen, "%s:%ld: out of memory", path, lineno);
                rc = -1;
                break;
            }
            doc = d;
            doccap = cap;
        }
        memcpy(doc + doclen, line, n);
        doclen += n;
    }
    if (rc == 0 && ferror(f)) {
        snprintf(err, errlen, "%s: read error: %s", path, strerror(errno));
        rc = -1;
    }
    if (rc == 0 && src->format == FMT_TEXT) rc = emit(src, doc, doclen, fn, ctx, err, errlen);
    free(line);
    free(doc);
    return rc;
}

static int read_whole(doc_source *src, const char *path, FILE *f, doc_fn fn, void *ctx, char *err,
                      size_t errlen) {
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? 2 * cap : 1 << 16;
            char *b = realloc(buf, cap);
            if (!b) {
                snprintf(err, errlen, "%s: out of memory reading the file", path);
                free(buf);
                return -1;
            }
            buf = b;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    int rc;
    if (ferror(f)) {
        snprintf(err, errlen, "%s: read error: %s", path, strerror(errno));
        rc = -1;
    } else {
        rc = emit(src, buf, len, fn, ctx, err, errlen);
    }
    free(buf);
    return rc;
}

static int read_documents(doc_source *src, const char *path, doc_fn fn, void *ctx, char *err,
                          size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    int rc = src->format == FMT_JSONL || src->split_on
                 ? read_lines(src, path, f, fn, ctx, err, errlen)
                 : read_whole(src, path, f, fn, ctx, err, errlen);
    fclose(f);
    return rc;
}

/* Options shared by `tokenize` and `tokenizer train`. Returns 1 if argv[*i] was one of them, 0 if
 * not, -1 after printing a usage error. */
typedef struct input_opts {
    const char **inputs;
    int ninputs;
    doc_source src;
} input_opts;

static int input_opt(const char *cmd, int argc, char **argv, int *i, input_opts *o) {
    const char *v;
    if (ct_cli_opt(argc, argv, i, "--input", &v)) {
        if (!v) {
            usage_error(cmd, "--input needs a file", NULL);
            return -1;
        }
        o->inputs[o->ninputs++] = v;
        return 1;
    }
    if (ct_cli_opt(argc, argv, i, "--format", &v)) {
        if (!v || parse_format(v, &o->src.format)) {
            usage_error(cmd, "--format must be text or jsonl, got", v ? v : "nothing");
            return -1;
        }
        return 1;
    }
    if (ct_cli_opt(argc, argv, i, "--split-on", &v)) {
        if (!v) {
            usage_error(cmd, "--split-on needs a line", NULL);
            return -1;
        }
        o->src.split_on = v;
        return 1;
    }
    return 0;
}

static int wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return 1;
    return 0;
}

/* ---- ctitan tokenize ----------------------------------------------------------------------------- */

typedef struct tokenize_ctx {
    const ct_tokenizer *tok;
    shard_writer *out;
    int allow_special;
} tokenize_ctx;

static int tokenize_doc(void *ctx, const char *text, size_t len, char *err, size_t errlen) {
    tokenize_ctx *c = ctx;
    int32_t *ids = NULL;
    size_t n = 0;
    if (tokenizer_encode(c->tok, text, len, c->allow_special, &ids, &n, err, errlen)) return -1;
    /* GPT-2 style tokenizers have only <|endoftext|>: one between documents, not two */
    int32_t b = tokenizer_bos_id(c->tok), e = tokenizer_eos_id(c->tok);
    uint32_t bos = (uint32_t)b, eos = (uint32_t)e;
    int rc = (b >= 0 && b != e && shard_writer_append(c->out, &bos, 1, err, errlen)) ||
             shard_writer_append(c->out, (const uint32_t *)ids, n, err, errlen) ||
             (e >= 0 && shard_writer_append(c->out, &eos, 1, err, errlen));
    free(ids);
    return rc ? -1 : 0;
}

ct_status cmd_tokenize(int argc, char **argv) {
    static const char cmd[] = "tokenize";
    if (wants_help(argc, argv)) {
        fputs(tokenize_usage, stdout);
        return CT_OK;
    }
    const char *tok_path = NULL, *out_path = NULL;
    input_opts in = {.inputs = calloc((size_t)argc + 1, sizeof(char *))};
    tokenize_ctx c = {0};
    ct_tokenizer *tok = NULL;
    char err[ERRLEN] = "";
    ct_status rc = CT_ERR_INVALID; /* until the command line is read */
    if (!in.inputs) {
        fprintf(stderr, "ctitan tokenize: out of memory\n");
        return CT_ERR_NOMEM;
    }
    for (int i = 1; i < argc; i++) {
        const char *v;
        int r = input_opt(cmd, argc, argv, &i, &in);
        if (r < 0) goto done;
        if (r == 1) continue;
        if (ct_cli_opt(argc, argv, &i, "--tokenizer", &v)) {
            if (!(tok_path = v)) { usage_error(cmd, "--tokenizer needs a file", NULL); goto done; }
        } else if (ct_cli_opt(argc, argv, &i, "--output", &v)) {
            if (!(out_path = v)) { usage_error(cmd, "--output needs a file", NULL); goto done; }
        } else if (strcmp(argv[i], "--allow-special") == 0) {
            c.allow_special = 1;
        } else {
            usage_error(cmd, "unknown argument", argv[i]);
            goto done;
        }
    }
    if (!tok_path) { usage_error(cmd, "--tokenizer FILE is required", NULL); goto done; }
    if (!in.ninputs) { usage_error(cmd, "at least one --input FILE is required", NULL); goto done; }
    if (!out_path) { usage_error(cmd, "--output SHARD is required", NULL); goto done; }
    if (in.src.split_on && in.src.format == FMT_JSONL) {
        usage_error(cmd, "--split-on applies to --format text only", NULL);
        goto done;
    }

    rc = CT_ERR_IO;
    double t0 = ct_now();
    tok = tokenizer_load(tok_path, err, sizeof err);
    if (!tok) goto fail;
    c.tok = tok;
    c.out = shard_writer_open(out_path, err, sizeof err);
    if (!c.out) goto fail;
    for (int i = 0; i < in.ninputs; i++)
        if (read_documents(&in.src, in.inputs[i], tokenize_doc, &c, err, sizeof err)) goto fail;
    if (in.src.documents == 0) {
        snprintf(err, sizeof err, "no documents in the input%s (empty files%s?)",
                 in.ninputs > 1 ? "s" : "", in.src.split_on ? ", or only separator lines" : "");
        goto fail;
    }
    uint64_t ntok = shard_writer_count(c.out);
    shard_writer *w = c.out;
    c.out = NULL;
    if (shard_writer_close(w, err, sizeof err)) goto fail;
    double dt = ct_now() - t0;
    printf("tokenize: %llu documents, %llu tokens from %.2f MB of text in %.2f s (%.2f MB/s) -> %s\n",
           (unsigned long long)in.src.documents, (unsigned long long)ntok, (double)in.src.bytes / 1e6,
           dt, dt > 0 ? (double)in.src.bytes / 1e6 / dt : 0.0, out_path);
    rc = CT_OK;
    goto cleanup;
fail:
    fprintf(stderr, "ctitan tokenize: %s\n", err);
cleanup:
    shard_writer_abort(c.out);
    tokenizer_free(tok);
done:
    free(in.inputs);
    return rc;
}

/* ---- ctitan tokenizer train | encode | decode ---------------------------------------------------- */

static int train_doc(void *ctx, const char *text, size_t len, char *err, size_t errlen) {
    return bpe_trainer_add(ctx, text, len, err, errlen);
}

static int parse_int(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static ct_status tokenizer_train(int argc, char **argv) {
    static const char cmd[] = "tokenizer train";
    const char *out_path = NULL;
    long vocab = 0;
    input_opts in = {.inputs = calloc((size_t)argc + 1, sizeof(char *))};
    ct_bpe_trainer *tr = NULL;
    char err[ERRLEN] = "";
    ct_status rc = CT_ERR_INVALID; /* until the command line is read */
    if (!in.inputs) {
        fprintf(stderr, "ctitan tokenizer: out of memory\n");
        return CT_ERR_NOMEM;
    }
    for (int i = 2; i < argc; i++) {
        const char *v;
        int r = input_opt(cmd, argc, argv, &i, &in);
        if (r < 0) goto done;
        if (r == 1) continue;
        if (ct_cli_opt(argc, argv, &i, "--output", &v)) {
            if (!(out_path = v)) { usage_error(cmd, "--output needs a file", NULL); goto done; }
        } else if (ct_cli_opt(argc, argv, &i, "--vocab-size", &v)) {
            if (!v || parse_int(v, 2 * TOKENIZER_N_SPECIAL, TOKENIZER_MAX_BASE, &vocab)) {
                fprintf(stderr, "ctitan %s: --vocab-size must be an integer in %d..%d, got %s (see "
                        "ctitan tokenizer --help)\n", cmd, 2 * TOKENIZER_N_SPECIAL, TOKENIZER_MAX_BASE,
                        v ? v : "nothing");
                goto done;
            }
        } else {
            usage_error(cmd, "unknown argument", argv[i]);
            goto done;
        }
    }
    if (!in.ninputs) { usage_error(cmd, "at least one --input FILE is required", NULL); goto done; }
    if (!vocab) { usage_error(cmd, "--vocab-size N is required", NULL); goto done; }
    if (!out_path) { usage_error(cmd, "--output FILE is required", NULL); goto done; }
    if (in.src.split_on && in.src.format == FMT_JSONL) {
        usage_error(cmd, "--split-on applies to --format text only", NULL);
        goto done;
    }

    rc = CT_ERR_IO;
    double t0 = ct_now();
    tr = bpe_trainer_create(err, sizeof err);
    if (!tr) goto fail;
    for (int i = 0; i < in.ninputs; i++)
        if (read_documents(&in.src, in.inputs[i], train_doc, tr, err, sizeof err)) goto fail;
    double t1 = ct_now();
    if (bpe_trainer_train(tr, (int)vocab, err, sizeof err)) goto fail;
    double t2 = ct_now();
    if (bpe_trainer_write(tr, out_path, err, sizeof err)) goto fail;
    ct_bpe_stats st;
    bpe_trainer_stats(tr, &st);
    printf("tokenizer train: %llu documents, %.2f MB, %llu chunks (%llu distinct); %d merges in "
           "%.2f s (counting %.2f s) -> %s: %d tokens + 256 specials = vocab %d\n",
           (unsigned long long)st.documents, (double)st.bytes / 1e6, (unsigned long long)st.chunks,
           (unsigned long long)st.unique_chunks, st.merges, t2 - t1, t1 - t0, out_path, st.n_base,
           st.n_base + TOKENIZER_N_SPECIAL);
    if (st.n_base + TOKENIZER_N_SPECIAL < vocab)
        fprintf(stderr, "ctitan tokenizer train: warning: the text ran out of pairs to merge; the "
                "vocabulary has %d tokens, not the %ld asked for\n", st.n_base + TOKENIZER_N_SPECIAL,
                vocab);
    rc = CT_OK;
    goto cleanup;
fail:
    fprintf(stderr, "ctitan tokenizer train: %s\n", err);
cleanup:
    bpe_trainer_free(tr);
done:
    free(in.inputs);
    return rc;
}

static ct_status tokenizer_encode_cmd(int argc, char **argv) {
    static const char cmd[] = "tokenizer encode";
    const char *tok_path = NULL, *text = NULL;
    int allow_special = 0;
    for (int i = 2; i < argc; i++) {
        const char *v;
        if (ct_cli_opt(argc, argv, &i, "--tokenizer", &v)) {
            if (!(tok_path = v)) return usage_error(cmd, "--tokenizer needs a file", NULL);
        } else if (ct_cli_opt(argc, argv, &i, "--text", &v)) {
            if (!(text = v)) return usage_error(cmd, "--text needs a string", NULL);
        } else if (strcmp(argv[i], "--allow-special") == 0) {
            allow_special = 1;
        } else {
            return usage_error(cmd, "unknown argument", argv[i]);
        }
    }
    if (!tok_path) return usage_error(cmd, "--tokenizer FILE is required", NULL);
    if (!text) return usage_error(cmd, "--text STR is required", NULL);
    char err[ERRLEN];
    ct_tokenizer *tok = tokenizer_load(tok_path, err, sizeof err);
    int32_t *ids = NULL;
    size_t n = 0;
    if (!tok || tokenizer_encode(tok, text, strlen(text), allow_special, &ids, &n, err, sizeof err)) {
        fprintf(stderr, "ctitan %s: %s\n", cmd, err);
        tokenizer_free(tok);
        return CT_ERR_IO;
    }
    for (size_t i = 0; i < n; i++) printf("%s%ld", i ? " " : "", (long)ids[i]);
    printf("\n");
    free(ids);
    tokenizer_free(tok);
    return CT_OK;
}

static ct_status tokenizer_decode_cmd(int argc, char **argv) {
    static const char cmd[] = "tokenizer decode";
    const char *tok_path = NULL;
    int32_t *ids = malloc(((size_t)argc + 1) * sizeof *ids);
    size_t n = 0;
    if (!ids) {
        fprintf(stderr, "ctitan %s: out of memory\n", cmd);
        return CT_ERR_NOMEM;
    }
    for (int i = 2; i < argc; i++) {
        const char *v;
        long id;
        if (ct_cli_opt(argc, argv, &i, "--tokenizer", &v)) {
            if (!(tok_path = v)) { free(ids); return usage_error(cmd, "--tokenizer needs a file", NULL); }
        } else if (parse_int(argv[i], 0, INT32_MAX, &id) == 0) {
            ids[n++] = (int32_t)id;
        } else {
            free(ids);
            return usage_error(cmd, "expected a token id (a non-negative integer), got", argv[i]);
        }
    }
    if (!tok_path) { free(ids); return usage_error(cmd, "--tokenizer FILE is required", NULL); }
    char err[ERRLEN];
    ct_tokenizer *tok = tokenizer_load(tok_path, err, sizeof err);
    size_t len = 0;
    char *bytes = tok ? tokenizer_decode(tok, ids, n, &len, err, sizeof err) : NULL;
    ct_status rc = CT_OK;
    if (!bytes) {
        fprintf(stderr, "ctitan %s: %s\n", cmd, err);
        rc = CT_ERR_IO;
    } else {
        fwrite(bytes, 1, len, stdout);
        printf("\n");
    }
    free(bytes);
    free(ids);
    tokenizer_free(tok);
    return rc;
}

ct_status cmd_tokenizer(int argc, char **argv) {
    const char *sub = argc > 1 ? argv[1] : NULL;
    if (!sub) return usage_error("tokenizer", "missing subcommand (train, encode or decode)", NULL);
    if (wants_help(argc, argv)) {
        fputs(tokenizer_usage, stdout);
        return CT_OK;
    }
    if (strcmp(sub, "train") == 0) return tokenizer_train(argc, argv);
    if (strcmp(sub, "encode") == 0) return tokenizer_encode_cmd(argc, argv);
    if (strcmp(sub, "decode") == 0) return tokenizer_decode_cmd(argc, argv);
    return usage_error("tokenizer", "unknown subcommand (expected train, encode or decode):", sub);
}
