/* cmd_tokenize.c: `ctitan tokenize` (text -> token shard) and `ctitan tokenizer train|encode|decode`. */
#include "cmd/cmd_tokenize.h"
#include "base/error.h"
#include "base/util.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "data/shard.h"
#include "tokenizer/chat.h"
#include "io/instream.h"
#include "tokenizer/tokenizer.h"

#define CHUNK (1 << 16)   /* decompressed bytes handed to the line splitter at a time */

static const char tokenize_usage[] =
    "usage: ctitan tokenize --tokenizer PATH --input FILE [--input FILE ...] --output SHARD\n"
    "                       [--format text|jsonl] [--field NAME] [--skip-missing] [--split-on LINE]\n"
    "                       [--allow-special] [--quiet] [--progress SECONDS]\n"
    "       ctitan tokenize --format chat --tokenizer PATH --input FILE [--input FILE ...] --output SHARD\n"
    "                       --seq-len N [--chat-template llama3|chatml|FILE] [--quiet] [--progress SECONDS]\n"
    "       ctitan tokenize --check SHARD [--check SHARD ...]\n"
    "\n"
    "Encodes documents into a token shard: each document becomes BOS + its tokens + EOS\n"
    "(<|begin_of_text|>, <|end_of_text|> for Llama 3; a tokenizer with no BOS, or one equal to its EOS,\n"
    "as GPT-2's <|endoftext|>, writes only the EOS after each document).\n"
    "Input streams through a fixed buffer and one document at a time is held in memory.\n"
    "\n"
    "  --tokenizer PATH   tiktoken tokenizer.model (Llama 3's, or `tokenizer train`'s), a Hugging Face\n"
    "                     tokenizer.json, or a model folder holding tokenizer.json (+ tokenizer_config.json\n"
    "                     for BOS/EOS), tokenizer.model or original/tokenizer.model\n"
    "  --input FILE       a file of documents, or - for standard input; repeat for more files.\n"
    "                     gzip and zstd input is decompressed as it streams, told by its first bytes\n"
    "                     (1f 8b, 28 b5 2f fd), not by its name; gzip members or zstd frames one after\n"
    "                     another are one input; xz and bzip2 are refused (pipe them: xz -dc F | ...)\n"
    "  --output SHARD     the shard to write (atomically: SHARD.tmp, then rename; nothing on an error)\n"
    "  --format text      each file is one document, held whole in memory (default)\n"
    "  --format jsonl     one JSON object per line; its --field string is a document\n"
    "  --format chat      one conversation per line: {\"messages\": [{\"role\": ..., \"content\": ...}, ...]} or\n"
    "                     {\"prompt\": ..., \"completion\": ...} (a user turn and an assistant turn), rendered\n"
    "                     with the chat template and tokenized; only the assistant turns' tokens (content\n"
    "                     and end-of-turn token) count in the loss, the rest is masked (a version 4 shard,\n"
    "                     which also records where each conversation starts: block_causal's documents);\n"
    "                     conversations are packed first-fit into sequences of --seq-len tokens, EOS after\n"
    "                     each, EOS padding masked; one longer than a sequence is dropped and counted\n"
    "  --seq-len N        chat: training.seq_len of the runs that will read the shard\n"
    "  --chat-template T  chat: llama3 or chatml (built in, with generation blocks), or a file holding a\n"
    "                     Jinja template; default: chat_template of the tokenizer_config.json beside the\n"
    "                     tokenizer (the Jinja subset Llama 3 and Qwen2/2.5/3 templates use; anything\n"
    "                     else is refused naming the construct, its line and column)\n"
    "  --field NAME       jsonl: the field holding the text (default: text); a line without it, or\n"
    "                     with a value that is not a string, is an error naming the file and line\n"
    "  --skip-missing     jsonl: skip such lines instead, counted in the summary (invalid JSON is\n"
    "                     still an error)\n"
    "  --split-on LINE    text format: documents are separated by lines equal to LINE (fortune files: %)\n"
    "  --allow-special    special-token text in documents becomes the special token (default: plain text)\n"
    "  --quiet            no progress on stderr (the summary line on stdout stays)\n"
    "  --progress SECONDS seconds between progress lines when stderr is not a terminal (default 10; a\n"
    "                     terminal gets one line rewritten every 0.5 s); 0: after every document\n"
    "  --check SHARD      verify a shard (header, size, checksum) and print its version,\n"
    "                     token count and CRC-32; repeat for more\n"
    "  --help             this text\n"
    "\n"
    "Progress: bytes read (with the percentage and ETA when the size is known: files, not pipes;\n"
    "compressed files by their compressed bytes), MB of text and MB/s, documents, tokens.\n"
    "Exit status: 0; 2 for bad input (a missing file, invalid JSON, a missing field, corrupt or\n"
    "truncated gzip or zstd, a corrupt shard, a line that is not a conversation, a template error);\n"
    "1 for a failure to write.\n";

static const char tokenizer_usage[] =
    "usage: ctitan tokenizer train  --input FILE [--input FILE ...] --vocab-size N --output FILE\n"
    "                               [--format text|jsonl] [--field NAME] [--skip-missing] [--split-on LINE]\n"
    "       ctitan tokenizer encode --tokenizer PATH --text STR [--allow-special]\n"
    "       ctitan tokenizer decode --tokenizer PATH ID...\n"
    "\n"
    "  train    learns a byte-level BPE vocabulary on Llama 3's regex chunks and writes it in tiktoken\n"
    "           format; N counts the 256 special tokens, so the file holds N - 256 tokens\n"
    "  encode   prints the ids of STR (special-token text is plain text unless --allow-special)\n"
    "  decode   prints the bytes of the ids\n"
    "  PATH     a tokenizer.model, a tokenizer.json or a folder (as for `ctitan tokenize`)\n"
    "\n"
    "  --input FILE, --format, --field, --skip-missing, --split-on   as for `ctitan tokenize` (gzip,\n"
    "           zstd and - for standard input included; see ctitan tokenize --help)\n"
    "  --help   this text\n";

static ct_status usage_error(const char *cmd, const char *msg, const char *arg) {
    fprintf(stderr, "ctitan %s: %s%s%s (see ctitan %s --help)\n", cmd, msg, arg ? " " : "",
            arg ? arg : "", cmd);
    return CT_ERR_INVALID;
}

/* ---- documents ----------------------------------------------------------------------------------- */

typedef enum { FMT_TEXT, FMT_JSONL, FMT_CHAT } doc_format;

/* Called once per non-empty document; a failure stops the reading (a failure of the consumer). */
typedef ct_status (*doc_fn)(void *ctx, const char *text, size_t len);
/* --format chat: called once per conversation (a JSON value) with its FILE:LINE; its status is the
 * reading's (CT_ERR_INVALID: the input's fault). */
typedef ct_status (*conv_fn)(void *ctx, const json_t *conv, const char *where);

typedef struct doc_source {
    doc_format format;
    const char *split_on;   /* text format: separator line, or NULL for one document per file */
    const char *field;      /* jsonl: the string field that is the document */
    int skip_missing;       /* jsonl: lines without that string are counted in skipped, not errors */
    conv_fn on_conv;        /* chat: the consumer of each conversation (its ctx is the doc_fn's) */
    uint64_t documents, bytes, skipped;
    uint64_t read;          /* bytes read from the inputs already closed */
    instream *cur;          /* the input being read, for progress */
} doc_source;

static int parse_format(const char *s, doc_format *f) {
    if (strcmp(s, "text") == 0) *f = FMT_TEXT;
    else if (strcmp(s, "jsonl") == 0) *f = FMT_JSONL;
    else if (strcmp(s, "chat") == 0) *f = FMT_CHAT;
    else return -1;
    return 0;
}

/* Grows *buf to hold need bytes (doubling). */
static int grow(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 4096;
    while (c < need) c *= 2;
    char *b = realloc(*buf, c);
    if (!b) return -1;
    *buf = b;
    *cap = c;
    return 0;
}

static ct_status emit(doc_source *src, const char *text, size_t len, doc_fn fn, void *ctx) {
    if (len == 0) return CT_OK;
    src->documents++;
    src->bytes += len;
    return fn(ctx, text, len) != CT_OK ? CT_ERR_IO : CT_OK;
}

/* A line without its "\n" and one "\r" before it. */
static size_t chomp(const char *line, size_t n) {
    if (n && line[n - 1] == '\n') n--;
    if (n && line[n - 1] == '\r') n--;
    return n;
}

static ct_status jsonl_line(doc_source *src, const char *name, uint64_t lineno, const char *line,
                            size_t n, doc_fn fn, void *ctx) {
    size_t k = 0;
    while (k < n && strchr(" \t\r\n", line[k])) k++;
    if (k == n) return CT_OK;   /* blank lines are skipped */
    json_error_t je;
    json_t *obj = json_loadb(line, n, JSON_ALLOW_NUL, &je);
    if (!obj) return ct_fail(CT_ERR_INVALID, "%s:%llu: invalid JSON: %s", name, (unsigned long long)lineno, je.text);
    if (!json_is_object(obj)) {
        json_decref(obj);
        return ct_fail(CT_ERR_INVALID, "%s:%llu: expected a JSON object with a \"%s\" string", name,
                       (unsigned long long)lineno, src->field);
    }
    json_t *text = json_object_get(obj, src->field);
    if (!json_is_string(text)) {
        if (src->skip_missing) {
            src->skipped++;
            json_decref(obj);
            return CT_OK;
        }
        ct_set_error("%s:%llu: %s%s%s (name the text's field with --field NAME, or skip such lines with "
                     "--skip-missing)", name, (unsigned long long)lineno, text ? "\"" : "no \"", src->field,
                     text ? "\" is not a string" : "\" field");
        json_decref(obj);
        return CT_ERR_INVALID;
    }
    ct_status rc = emit(src, json_string_value(text), json_string_length(text), fn, ctx);
    json_decref(obj);
    return rc;
}

/* --format chat: one conversation per line (blank lines skipped). */
static ct_status chat_line(doc_source *src, const char *name, uint64_t lineno, const char *line, size_t n,
                           void *ctx) {
    size_t k = 0;
    while (k < n && strchr(" \t\r\n", line[k])) k++;
    if (k == n) return CT_OK;
    char where[PATH_MAX + 32];
    snprintf(where, sizeof where, "%s:%llu", name, (unsigned long long)lineno);
    json_error_t je;
    json_t *obj = json_loadb(line, n, 0, &je);
    if (!obj) return ct_fail(CT_ERR_INVALID, "%s: invalid JSON: %s", where, je.text);
    src->documents++;
    src->bytes += n;
    ct_status rc = src->on_conv(ctx, obj, where);
    json_decref(obj);
    return rc;
}

/* Lines of a decompressed stream, through a fixed buffer: only the current line is held. */
typedef struct line_reader {
    instream *in;
    char *buf;          /* CHUNK bytes; buf[pos, len) not yet split */
    size_t pos, len;
    int eof;
    char *line;         /* line[0, n): the current line, its "\n" included when it has one */
    size_t n, cap;
} line_reader;

/* The next line, *more 0 at the end. A failed read's status says whose fault it was: CT_ERR_INVALID
 * the input's, CT_ERR_IO or CT_ERR_NOMEM the system's. */
static ct_status next_line(line_reader *r, int *more) {
    r->n = 0;
    *more = 0;
    for (;;) {
        if (r->pos == r->len) {
            if (r->eof) {
                *more = r->n > 0;
                return CT_OK;
            }
            size_t got;
            ct_status st = instream_read(r->in, r->buf, CHUNK, &got);
            if (st != CT_OK) return st;
            r->pos = 0;
            r->len = got;
            r->eof = got == 0;
            continue;
        }
        char *start = r->buf + r->pos, *nl = memchr(start, '\n', r->len - r->pos);
        size_t k = nl ? (size_t)(nl - start) + 1 : r->len - r->pos;
        if (grow(&r->line, &r->cap, r->n + k))
            return ct_fail(CT_ERR_NOMEM, "%s: out of memory for a line of %zu bytes", instream_name(r->in), r->n + k);
        memcpy(r->line + r->n, start, k);
        r->n += k;
        r->pos += k;
        if (nl) {
            *more = 1;
            return CT_OK;
        }
    }
}

/* Line-oriented formats: jsonl, and text with a separator line (one document held at a time). */
static ct_status read_lines(doc_source *src, instream *in, doc_fn fn, void *ctx) {
    line_reader r = {.in = in, .buf = malloc(CHUNK)};
    const char *name = instream_name(in);
    char *doc = NULL;
    size_t doclen = 0, doccap = 0, seplen = src->split_on ? strlen(src->split_on) : 0;
    uint64_t lineno = 0;
    ct_status rc = CT_OK;
    int more;
    if (!r.buf) return ct_fail(CT_ERR_NOMEM, "%s: out of memory", name);
    while (rc == CT_OK && (rc = next_line(&r, &more)) == CT_OK && more) {
        lineno++;
        if (src->format == FMT_JSONL) {
            rc = jsonl_line(src, name, lineno, r.line, r.n, fn, ctx);
            continue;
        }
        if (src->format == FMT_CHAT) {
            rc = chat_line(src, name, lineno, r.line, r.n, ctx);
            continue;
        }
        if (chomp(r.line, r.n) == seplen && memcmp(r.line, src->split_on, seplen) == 0) {
            rc = emit(src, doc, doclen, fn, ctx);
            doclen = 0;
            continue;
        }
        if (grow(&doc, &doccap, doclen + r.n)) {
            rc = ct_fail(CT_ERR_NOMEM, "%s:%llu: out of memory for a document of %zu bytes", name,
                         (unsigned long long)lineno, doclen + r.n);
            break;
        }
        memcpy(doc + doclen, r.line, r.n);
        doclen += r.n;
    }
    if (rc == CT_OK && src->format == FMT_TEXT) rc = emit(src, doc, doclen, fn, ctx);
    free(r.buf);
    free(r.line);
    free(doc);
    return rc;
}

/* Text without --split-on: the whole input is one document. */
static ct_status read_whole(doc_source *src, instream *in, doc_fn fn, void *ctx) {
    char *buf = NULL;
    size_t len = 0, cap = 0;
    ct_status rc = CT_OK;
    for (;;) {
        if (grow(&buf, &cap, len + CHUNK)) {
            rc = ct_fail(CT_ERR_NOMEM, "%s: out of memory for a document of %zu bytes (the whole file is one "
                         "document without --split-on)", instream_name(in), len + CHUNK);
            break;
        }
        size_t got;
        if ((rc = instream_read(in, buf + len, cap - len, &got)) != CT_OK) break;   /* INVALID: the input's fault */
        if (got == 0) {
            rc = emit(src, buf, len, fn, ctx);
            break;
        }
        len += got;
    }
    free(buf);
    return rc;
}

static ct_status read_documents(doc_source *src, const char *path, doc_fn fn, void *ctx) {
    int bad = 0;
    instream *in = instream_open(path, &bad);
    if (!in) return bad ? CT_ERR_INVALID : CT_ERR_IO;
    src->cur = in;
    ct_status rc = src->format != FMT_TEXT || src->split_on ? read_lines(src, in, fn, ctx)
                                                              : read_whole(src, in, fn, ctx);
    src->cur = NULL;
    src->read += instream_offset(in);
    instream_close(in);
    return rc;
}

/* Options shared by `tokenize` and `tokenizer train`. Returns 1 if argv[*i] was one of them, 0 if
 * not, -1 after printing a usage error. */
typedef struct input_opts {
    const char **inputs;
    int ninputs;
    int field_given;
    doc_source src;
} input_opts;

static int input_opt(const char *cmd, int argc, char **argv, int *i, input_opts *o) {
    const char *v;
    if (ct_cli_opt(argc, argv, i, "--input", &v)) {
        if (!v) {
            usage_error(cmd, "--input needs a file (or - for standard input)", NULL);
            return -1;
        }
        if (strcmp(v, "-") == 0)
            for (int k = 0; k < o->ninputs; k++)
                if (strcmp(o->inputs[k], "-") == 0) {
                    usage_error(cmd, "--input - (standard input) can be given once", NULL);
                    return -1;
                }
        o->inputs[o->ninputs++] = v;
        return 1;
    }
    if (ct_cli_opt(argc, argv, i, "--format", &v)) {
        if (!v || parse_format(v, &o->src.format)) {
            usage_error(cmd, "--format must be text, jsonl or chat, got", v ? v : "nothing");
            return -1;
        }
        return 1;
    }
    if (ct_cli_opt(argc, argv, i, "--field", &v)) {
        if (!v || !*v) {
            usage_error(cmd, "--field needs the name of a JSON field", NULL);
            return -1;
        }
        o->src.field = v;
        o->field_given = 1;
        return 1;
    }
    if (strcmp(argv[*i], "--skip-missing") == 0) {
        o->src.skip_missing = 1;
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

/* What the options say together, after the command line is read. */
static int input_check(const char *cmd, input_opts *o) {
    if (o->src.split_on && o->src.format != FMT_TEXT) {
        usage_error(cmd, "--split-on applies to --format text only", NULL);
        return -1;
    }
    if ((o->field_given || o->src.skip_missing) && o->src.format != FMT_JSONL) {
        usage_error(cmd, o->field_given ? "--field applies to --format jsonl only"
                                     : "--skip-missing applies to --format jsonl only", NULL);
        return -1;
    }
    if (!o->src.field) o->src.field = "text";
    return 0;
}

static int wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return 1;
    return 0;
}

/* ---- progress ------------------------------------------------------------------------------------ */

typedef struct progress {
    int quiet, tty;
    double every;           /* seconds between lines */
    double t0, last;
    int64_t total;          /* bytes of all the inputs, -1 when one is not a regular file */
    int shown;              /* a terminal line is waiting to be cleared */
} progress;

static void fmt_eta(char *out, size_t n, double s) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(out, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(out, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(out, n, "%lds", t);
}

/* Bytes in kB, MB or GB (decimal), whichever reads best. */
static void fmt_bytes(char *out, size_t n, double b) {
    if (b < 1e6) snprintf(out, n, "%.1f kB", b / 1e3);
    else if (b < 1e9) snprintf(out, n, "%.1f MB", b / 1e6);
    else snprintf(out, n, "%.2f GB", b / 1e9);
}

/* One progress line: bytes read (percentage and ETA when the size is known), text, documents, tokens. */
static void progress_show(progress *p, const doc_source *src, uint64_t tokens, double now) {
    uint64_t read = src->read + (src->cur ? instream_offset(src->cur) : 0);
    double dt = now - p->t0;
    char got[32], all[32], text[32], where[96], eta[32] = "";
    fmt_bytes(got, sizeof got, (double)read);
    fmt_bytes(text, sizeof text, (double)src->bytes);
    if (p->total > 0) {
        double frac = (double)read / (double)p->total;
        if (frac > 1) frac = 1;
        fmt_bytes(all, sizeof all, (double)p->total);
        snprintf(where, sizeof where, "%s of %s read (%.0f%%)", got, all, 100 * frac);
        if (frac > 0) {
            char t[24];
            fmt_eta(t, sizeof t, dt * (1 - frac) / frac);
            snprintf(eta, sizeof eta, ", ETA %s", t);
        }
    } else {
        snprintf(where, sizeof where, "%s read", got);
    }
    fprintf(stderr, "%stokenize: %s, %s of text at %.2f MB/s, %llu documents, %llu tokens%s%s",
            p->tty ? "\r" : "", where, text, dt > 0 ? (double)src->bytes / 1e6 / dt : 0.0,
            (unsigned long long)src->documents, (unsigned long long)tokens, eta, p->tty ? "\033[K" : "\n");
    fflush(stderr);
    p->shown = p->tty;
}

static void progress_tick(progress *p, const doc_source *src, uint64_t tokens) {
    if (p->quiet) return;
    double now = ct_now();
    if (now - p->last < (p->tty ? 0.5 : p->every)) return;
    p->last = now;
    progress_show(p, src, tokens, now);
}

/* Clears a terminal's progress line before the summary. */
static void progress_end(progress *p) {
    if (p->shown) fputs("\r\033[K", stderr);
    p->shown = 0;
}

/* ---- ctitan tokenize ----------------------------------------------------------------------------- */

typedef struct tokenize_ctx {
    const ct_tokenizer *tok;
    shard_writer *out;
    int allow_special;
    const doc_source *src;
    progress *prog;
} tokenize_ctx;

static ct_status tokenize_doc(void *ctx, const char *text, size_t len) {
    tokenize_ctx *c = ctx;
    int32_t *ids = NULL;
    size_t n = 0;
    ct_status st = tokenizer_encode(c->tok, text, len, c->allow_special, &ids, &n);
    if (st != CT_OK) return st;
    /* GPT-2 style tokenizers have only <|endoftext|>: one between documents, not two */
    int32_t b = tokenizer_bos_id(c->tok), e = tokenizer_eos_id(c->tok);
    uint32_t bos = (uint32_t)b, eos = (uint32_t)e;
    int rc = (b >= 0 && b != e && shard_writer_append(c->out, &bos, 1) != CT_OK) ||
             shard_writer_append(c->out, (const uint32_t *)ids, n) != CT_OK ||
             (e >= 0 && shard_writer_append(c->out, &eos, 1) != CT_OK);
    free(ids);
    if (rc) return CT_ERR_IO;
    progress_tick(c->prog, c->src, shard_writer_count(c->out));
    return CT_OK;
}

/* ctitan tokenize --check SHARD...: every shard verified, one line each. */
static ct_status check_shards(const char **paths, int n) {
    ct_status rc = CT_OK;
    for (int i = 0; i < n; i++) {
        shard_info info;
        if (shard_verify(paths[i], &info) != CT_OK) {
            fprintf(stderr, "ctitan tokenize: %s\n", ct_last_error());
            rc = CT_ERR_INVALID;
            continue;
        }
        char docs[80] = "";
        if (info.version == SHARD_VERSION_DOCS)
            snprintf(docs, sizeof docs, ", %llu documents started", (unsigned long long)info.documents);
        printf("%s: token shard version %u, %llu tokens%s, CRC-32 0x%08x (%s)\n", paths[i], info.version,
               (unsigned long long)info.count, docs, info.checksum,
               info.version >= 3 ? "matches the header; targets masked as the flags say"
               : info.version == 2 ? "matches the header" : "version 1 stores none");
    }
    return rc;
}

/* The inputs' total size, or -1 when one is not a regular file (standard input, a pipe). */
static int64_t inputs_size(const char **paths, int n) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        struct stat st;
        if (strcmp(paths[i], "-") == 0 || stat(paths[i], &st) || !S_ISREG(st.st_mode)) return -1;
        total += (int64_t)st.st_size;
    }
    return total;
}

/* ---- ctitan tokenize --format chat: conversations packed first-fit into sequences ----------------- */

/* Each block is one training sequence's seq_len tokens: the loader's window b is block b and the first
 * token of block b + 1 (its last target), so a block holds whole conversations, each followed by the
 * EOS when room is left, then EOS padding; every word but an assistant token's carries SHARD_MASKED,
 * a conversation's first token always (it is the target of another conversation's last token), and
 * that first token carries SHARD_DOC_START: block-causal attention keeps to conversations, whatever
 * EOS tokens the template puts inside them (ChatML ends every turn with Qwen's EOS, <|im_end|>). */
typedef struct packer {
    int64_t seq;
    uint32_t *words;       /* nblocks * seq */
    int64_t *used;         /* tokens in each block */
    size_t nblocks, cap;
    int64_t *room;         /* a max tree over the blocks' free tokens: leaves room[cap + b], the root room[1] */
    uint32_t eos;
    uint64_t packed, too_long, no_assistant, counted, masked, conv_tokens;
} packer;

/* Block b's free tokens into the tree. */
static void room_set(packer *pk, size_t b) {
    size_t i = pk->cap + b;
    pk->room[i] = pk->seq - pk->used[b];
    for (i /= 2; i >= 1; i /= 2)
        pk->room[i] = pk->room[2 * i] > pk->room[2 * i + 1] ? pk->room[2 * i] : pk->room[2 * i + 1];
}

/* The first block with n free tokens (nblocks when none): down the tree, left when the left has room. */
static size_t first_fit(const packer *pk, int64_t n) {
    if (!pk->cap || pk->room[1] < n) return pk->nblocks;
    size_t i = 1;
    while (i < pk->cap) i = pk->room[2 * i] >= n ? 2 * i : 2 * i + 1;
    return i - pk->cap;
}

static ct_status pack(packer *pk, const int32_t *ids, const unsigned char *counted, size_t n) {
    size_t b = first_fit(pk, (int64_t)n);
    if (b == pk->nblocks) {
        if (pk->nblocks == pk->cap) { /* twice the blocks: the tree is rebuilt over them */
            size_t c = pk->cap ? 2 * pk->cap : 64;
            uint32_t *w = realloc(pk->words, c * (size_t)pk->seq * sizeof *w);
            if (w) pk->words = w;
            int64_t *u = w ? realloc(pk->used, c * sizeof *u) : NULL;
            if (u) pk->used = u;
            int64_t *r = u ? calloc(2 * c, sizeof *r) : NULL;
            if (!r) return ct_fail(CT_ERR_NOMEM, "out of memory for %zu sequences", c);
            free(pk->room);
            pk->room = r;
            pk->cap = c;
            for (size_t k = 0; k < pk->nblocks; k++) room_set(pk, k);
        }
        pk->used[pk->nblocks++] = 0;
    }
    uint32_t *w = pk->words + b * (size_t)pk->seq + pk->used[b];
    for (size_t i = 0; i < n; i++) {
        int masked = i == 0 || !counted[i];
        if ((uint32_t)ids[i] > SHARD_DOC_ID_MASK) /* the flags of version 4 take bits 30 and 31 */
            return ct_fail(CT_ERR_INVALID, "token id %d: a chat shard holds ids below 2^30", ids[i]);
        w[i] = (uint32_t)ids[i] | (masked ? SHARD_MASKED : 0) | (i == 0 ? SHARD_DOC_START : 0);
        pk->counted += !masked;
        pk->masked += masked;
    }
    pk->used[b] += (int64_t)n;
    if (pk->used[b] < pk->seq) { /* the separator, the conversation's last token */
        pk->words[b * (size_t)pk->seq + (size_t)pk->used[b]++] = pk->eos | SHARD_MASKED;
        pk->masked++;
    }
    room_set(pk, b);
    pk->packed++;
    pk->conv_tokens += n;
    return CT_OK;
}

typedef struct chat_ctx {
    const ct_tokenizer *tok;
    const chat_template *tpl;
    packer pk;
    const doc_source *src;
    progress *prog;
} chat_ctx;

static ct_status chat_conv(void *ctx, const json_t *conv, const char *where) {
    chat_ctx *c = ctx;
    int32_t *ids;
    unsigned char *counted;
    size_t n;
    ct_status rc = chat_encode(c->tpl, c->tok, conv, where, &ids, &counted, &n);
    if (rc != CT_OK) return rc;
    size_t k = 1;   /* the first token never counts */
    while (k < n && !counted[k]) k++;
    if ((int64_t)n > c->pk.seq) c->pk.too_long++;   /* dropped whole: a cut turn would teach a cut answer */
    else if (k >= n) c->pk.no_assistant++;          /* dropped: nothing in it counts */
    else rc = pack(&c->pk, ids, counted, n);
    free(ids);
    free(counted);
    if (rc == CT_OK) progress_tick(c->prog, c->src, c->pk.counted + c->pk.masked);
    return rc;
}

/* The packed blocks and one more EOS (the last window's last target), all masked padding after each
 * block's conversations. */
static ct_status write_packed(packer *pk, const char *path, uint64_t *padding) {
    *padding = 0;
    for (size_t b = 0; b < pk->nblocks; b++)
        for (int64_t i = pk->used[b]; i < pk->seq; i++) {
            pk->words[b * (size_t)pk->seq + (size_t)i] = pk->eos | SHARD_MASKED;
            (*padding)++;
        }
    shard_writer *w = shard_writer_open_docs(path);
    if (!w) return CT_ERR_IO;
    uint32_t last = pk->eos | SHARD_MASKED;
    if (shard_writer_append(w, pk->words, pk->nblocks * (size_t)pk->seq) != CT_OK ||
        shard_writer_append(w, &last, 1) != CT_OK) {
        shard_writer_abort(w);
        return CT_ERR_IO;
    }
    return shard_writer_close(w);
}

/* ctitan tokenize --format chat: read, render, pack, write; the summary line on stdout. */
static ct_status tokenize_chat(input_opts *in, const char *tok_path, const char *choice, long seq_len,
                               const char *out_path, progress *prog) {
    chat_ctx c = {.src = &in->src, .prog = prog, .pk = {.seq = seq_len}};
    chat_template *tpl = NULL;
    ct_status rc = CT_ERR_INVALID;
    ct_tokenizer *tok = tokenizer_load(tok_path);
    if (!tok) goto fail;
    if (tokenizer_notice(tok)) fprintf(stderr, "ctitan tokenize: note: %s\n", tokenizer_notice(tok));
    if (tokenizer_eos_id(tok) < 0) {
        ct_set_error("%s: the tokenizer has no EOS token to separate conversations with", tok_path);
        goto fail;
    }
    if ((rc = chat_template_load(tok_path, choice, tok, &tpl)) != CT_OK) goto fail;
    c.tok = tok;
    c.tpl = tpl;
    c.pk.eos = (uint32_t)tokenizer_eos_id(tok);
    in->src.on_conv = chat_conv;
    for (int i = 0; i < in->ninputs; i++)
        if ((rc = read_documents(&in->src, in->inputs[i], NULL, &c)) != CT_OK) goto fail;
    rc = CT_ERR_INVALID;
    if (c.pk.packed == 0) {
        ct_set_error("no conversation to write: %llu read, %llu longer than --seq-len %ld, %llu without assistant "
                     "tokens", (unsigned long long)in->src.documents, (unsigned long long)c.pk.too_long, seq_len,
                     (unsigned long long)c.pk.no_assistant);
        goto fail;
    }
    uint64_t padding;
    if ((rc = write_packed(&c.pk, out_path, &padding)) != CT_OK) goto fail;
    double dt = ct_now() - prog->t0;
    progress_end(prog);
    printf("tokenize: %llu conversations (%s): %llu packed into %zu sequences of %ld, %llu dropped longer than "
           "--seq-len, %llu dropped without assistant tokens; %llu tokens: %llu kept in the loss, %llu masked "
           "(%llu of them padding) in %.2f s -> %s\n", (unsigned long long)in->src.documents,
           chat_template_origin(tpl), (unsigned long long)c.pk.packed, c.pk.nblocks, seq_len,
           (unsigned long long)c.pk.too_long, (unsigned long long)c.pk.no_assistant,
           (unsigned long long)(c.pk.counted + c.pk.masked + padding + 1), (unsigned long long)c.pk.counted,
           (unsigned long long)(c.pk.masked + padding + 1), (unsigned long long)(padding + 1), dt, out_path);
    rc = CT_OK;
    goto done;
fail:
    progress_end(prog);
    fprintf(stderr, "ctitan tokenize: %s\n", ct_last_error());
done:
    free(c.pk.words);
    free(c.pk.used);
    free(c.pk.room);
    chat_template_free(tpl);
    tokenizer_free(tok);
    return rc;
}

static int parse_seconds(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0 && v <= 86400)) return -1;
    *out = v;
    return 0;
}

static int parse_int(const char *s, long lo, long hi, long *out);

ct_status cmd_tokenize(int argc, char **argv) {
    static const char cmd[] = "tokenize";
    if (wants_help(argc, argv)) {
        fputs(tokenize_usage, stdout);
        return CT_OK;
    }
    const char *tok_path = NULL, *out_path = NULL, *chat_choice = NULL;
    long seq_len = 0;
    input_opts in = {.inputs = calloc((size_t)argc + 1, sizeof(char *))};
    const char **checks = calloc((size_t)argc + 1, sizeof(char *));
    int nchecks = 0;
    progress prog = {.every = 10};
    tokenize_ctx c = {.src = &in.src, .prog = &prog};
    ct_tokenizer *tok = NULL;
    ct_status rc = CT_ERR_INVALID; /* until the command line is read */
    if (!in.inputs || !checks) {
        fprintf(stderr, "ctitan tokenize: out of memory\n");
        rc = CT_ERR_NOMEM;
        goto done;
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
        } else if (ct_cli_opt(argc, argv, &i, "--check", &v)) {
            if (!v) { usage_error(cmd, "--check needs a shard", NULL); goto done; }
            checks[nchecks++] = v;
        } else if (ct_cli_opt(argc, argv, &i, "--progress", &v)) {
            if (!v || parse_seconds(v, &prog.every)) {
                usage_error(cmd, "--progress must be a number of seconds in 0..86400, got", v ? v : "nothing");
                goto done;
            }
        } else if (ct_cli_opt(argc, argv, &i, "--chat-template", &v)) {
            if (!(chat_choice = v) || !*v) {
                usage_error(cmd, "--chat-template needs " CHAT_BUILTINS " or a file", NULL);
                goto done;
            }
        } else if (ct_cli_opt(argc, argv, &i, "--seq-len", &v)) {
            if (!v || parse_int(v, 2, 1L << 24, &seq_len)) {
                usage_error(cmd, "--seq-len must be an integer in 2..16777216, got", v ? v : "nothing");
                goto done;
            }
        } else if (strcmp(argv[i], "--allow-special") == 0) {
            c.allow_special = 1;
        } else if (strcmp(argv[i], "--quiet") == 0) {
            prog.quiet = 1;
        } else {
            usage_error(cmd, "unknown argument", argv[i]);
            goto done;
        }
    }
    if (nchecks) {
        if (in.ninputs || tok_path || out_path) {
            usage_error(cmd, "--check SHARD takes no --input, --tokenizer or --output", NULL);
            goto done;
        }
        rc = check_shards(checks, nchecks);
        goto done;
    }
    if (!tok_path) { usage_error(cmd, "--tokenizer FILE is required", NULL); goto done; }
    if (!in.ninputs) { usage_error(cmd, "at least one --input FILE is required", NULL); goto done; }
    if (!out_path) { usage_error(cmd, "--output SHARD is required", NULL); goto done; }
    if (input_check(cmd, &in)) goto done;
    if (in.src.format == FMT_CHAT) {
        if (!seq_len) { usage_error(cmd, "--format chat needs --seq-len N (training.seq_len)", NULL); goto done; }
        if (c.allow_special) {
            usage_error(cmd, "--allow-special applies to text and jsonl (a chat template's special tokens are "
                        "always special)", NULL);
            goto done;
        }
    } else if (chat_choice || seq_len) {
        usage_error(cmd, chat_choice ? "--chat-template applies to --format chat only"
                                     : "--seq-len applies to --format chat only", NULL);
        goto done;
    }

    rc = CT_ERR_IO;
    prog.t0 = prog.last = ct_now();
    prog.tty = isatty(STDERR_FILENO);
    prog.total = inputs_size(in.inputs, in.ninputs);
    if (in.src.format == FMT_CHAT) {
        rc = tokenize_chat(&in, tok_path, chat_choice, seq_len, out_path, &prog);
        goto done;
    }
    prog.tty = isatty(STDERR_FILENO);
    prog.total = inputs_size(in.inputs, in.ninputs);
    tok = tokenizer_load(tok_path);
    if (!tok) { rc = CT_ERR_INVALID; goto fail; } /* a tokenizer file it cannot read is bad input */
    if (tokenizer_notice(tok)) fprintf(stderr, "ctitan tokenize: note: %s\n", tokenizer_notice(tok));
    c.tok = tok;
    c.out = shard_writer_open(out_path);
    if (!c.out) {
        goto fail;
    }
    for (int i = 0; i < in.ninputs; i++)
        if ((rc = read_documents(&in.src, in.inputs[i], tokenize_doc, &c)) != CT_OK) goto fail;
    rc = CT_ERR_INVALID;
    if (in.src.documents == 0) {
        ct_set_error("no documents in the input%s (empty files%s?)", in.ninputs > 1 ? "s" : "",
                     in.src.split_on ? ", or only separator lines" : in.src.skipped ? ", or every line skipped" : "");
        goto fail;
    }
    rc = CT_ERR_IO;
    uint64_t ntok = shard_writer_count(c.out);
    shard_writer *w = c.out;
    c.out = NULL;
    if (shard_writer_close(w) != CT_OK) {
        goto fail;
    }
    double dt = ct_now() - prog.t0;
    progress_end(&prog);
    char skipped[96] = "";
    if (in.src.skipped)
        snprintf(skipped, sizeof skipped, ", %llu lines skipped (no \"%s\" string)",
                 (unsigned long long)in.src.skipped, in.src.field);
    printf("tokenize: %llu documents, %llu tokens from %.2f MB of text (%.2f MB read) in %.2f s (%.2f MB/s "
           "of text)%s -> %s\n", (unsigned long long)in.src.documents, (unsigned long long)ntok,
           (double)in.src.bytes / 1e6, (double)in.src.read / 1e6, dt,
           dt > 0 ? (double)in.src.bytes / 1e6 / dt : 0.0, skipped, out_path);
    rc = CT_OK;
    goto cleanup;
fail:
    progress_end(&prog);
    fprintf(stderr, "ctitan tokenize: %s\n", ct_last_error());
cleanup:
    shard_writer_abort(c.out);
    tokenizer_free(tok);
done:
    free(checks);
    free(in.inputs);
    return rc;
}

/* ---- ctitan tokenizer train | encode | decode ---------------------------------------------------- */

static ct_status train_doc(void *ctx, const char *text, size_t len) { return bpe_trainer_add(ctx, text, len); }

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
    if (input_check(cmd, &in)) goto done;
    if (in.src.format == FMT_CHAT) {
        usage_error(cmd, "--format chat applies to ctitan tokenize only", NULL);
        goto done;
    }

    rc = CT_ERR_IO;
    double t0 = ct_now();
    tr = bpe_trainer_create();
    if (!tr) goto fail;
    for (int i = 0; i < in.ninputs; i++)
        if ((rc = read_documents(&in.src, in.inputs[i], train_doc, tr)) != CT_OK) goto fail;
    rc = CT_ERR_IO;
    double t1 = ct_now();
    if (bpe_trainer_train(tr, (int)vocab) != CT_OK) goto fail;
    double t2 = ct_now();
    if (bpe_trainer_write(tr, out_path) != CT_OK) goto fail;
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
    fprintf(stderr, "ctitan tokenizer train: %s\n", ct_last_error());
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
    ct_tokenizer *tok = tokenizer_load(tok_path);
    int32_t *ids = NULL;
    size_t n = 0;
    if (!tok || tokenizer_encode(tok, text, strlen(text), allow_special, &ids, &n) != CT_OK) {
        fprintf(stderr, "ctitan %s: %s\n", cmd, ct_last_error());
        tokenizer_free(tok);
        return CT_ERR_INVALID; /* an unreadable tokenizer, or text it refuses (not NFC) */
    }
    if (tokenizer_notice(tok)) fprintf(stderr, "ctitan %s: note: %s\n", cmd, tokenizer_notice(tok));
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
    ct_tokenizer *tok = tokenizer_load(tok_path);
    size_t len = 0;
    char *bytes = tok ? tokenizer_decode(tok, ids, n, &len) : NULL;
    ct_status rc = CT_OK;
    if (!bytes) {
        fprintf(stderr, "ctitan %s: %s\n", cmd, ct_last_error());
        rc = CT_ERR_INVALID; /* an unreadable tokenizer, or an id it does not have */
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
