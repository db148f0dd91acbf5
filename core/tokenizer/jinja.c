/* jinja.c: the chat-template subset of Jinja (what is read: jinja.h). A template is cut into text and
 * tags (whitespace control applied as Jinja's lexer does with trim_blocks and lstrip_blocks), each tag
 * into tokens, then parsed into a tree that rendering walks. Every value of a render lives in one
 * arena, freed at its end, and bounded. */
#include "tokenizer/jinja.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#define MAX_DEPTH 64
#define MAX_BYTES ((size_t)64 << 20)
#define MAX_STEPS (1L << 22)   /* statements and expressions one render may evaluate */
#define MAX_NEST 128           /* lists, dicts and namespaces printed or compared inside each other (a
                                  namespace may even hold itself) */

/* ---- arena --------------------------------------------------------------------------------------- */

typedef struct ablock {
    struct ablock *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} ablock;

typedef struct arena {
    ablock *head;
    size_t total;
} arena;

static void *arena_alloc(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n > MAX_BYTES || a->total + n > MAX_BYTES) return NULL;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        ablock *b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    a->total += n;
    memset(p, 0, n);
    return p;
}

static void arena_free(arena *a) {
    while (a->head) {
        ablock *b = a->head;
        a->head = b->next;
        free(b);
    }
    a->total = 0;
}

/* ---- values -------------------------------------------------------------------------------------- */

typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS } vkind;

typedef struct jv {
    vkind k;
    long long i;       /* BOOL, INT */
    double f;          /* FLOAT */
    const char *s;     /* STR: s[0, n) */
    size_t n;          /* STR: bytes; LIST: items; DICT/NS: pairs */
    struct jv **items; /* LIST: n items; DICT/NS: key, value, key, value, ... */
    size_t cap;        /* NS: pairs allocated */
    int tuple;         /* LIST: a Python tuple (items' pairs), for str() */
} jv;

static jv v_undef = {.k = V_UNDEF}, v_none = {.k = V_NONE}, v_true = {.k = V_BOOL, .i = 1},
          v_false = {.k = V_BOOL, .i = 0};

/* ---- tokens and tree ----------------------------------------------------------------------------- */

typedef enum { T_END, T_NAME, T_STR, T_INT, T_FLOAT, T_OP } tkind;

typedef struct tok {
    tkind k;
    size_t off, len;   /* in the source */
    char *s;           /* T_STR: the decoded string (slen bytes) */
    size_t slen;
    long long i;
    double f;
} tok;

enum {
    E_LIT, E_NAME, E_ATTR, E_INDEX, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NEG, E_NOT, E_AND, E_OR, E_BIN,
    E_COND, E_LIST, E_DICT,
    S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_BREAK, S_CONTINUE, S_GEN, S_BODY
};
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_CAT, OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE,
       OP_IN, OP_NOTIN };

typedef struct node node;
struct node {
    int kind, op, neg;
    size_t off;           /* where in the source, for messages */
    node *a, *b, *c;      /* operands; S_IF: a condition, c the elif/else; E_SLICE: a b c */
    node **args;          /* call, filter, test arguments; list items; dict keys and values; body */
    size_t nargs;
    char **kwn;           /* keyword argument names; S_FOR: its targets when it has several */
    node **kwv;
    size_t nkw;
    const char *name;     /* names, attributes, filters, tests; S_SET: the variable */
    size_t nlen;
    const char *attr;     /* S_SET of NAME.ATTR */
    size_t alen;
    jv *lit;              /* E_LIT, S_TEXT */
};

struct jinja_template {
    char *src;
    size_t len;
    char *name;
    arena mem;            /* the tree */
    node *root;
    int has_generation;
};

/* Line and column (from 1) of a source offset. */
static void line_col(const char *src, size_t off, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off; i++) {
        if (src[i] == '\n') {
            (*line)++;
            *col = 1;
        } else if (((unsigned char)src[i] & 0xC0) != 0x80) {
            (*col)++;
        }
    }
}

/* ---- parser -------------------------------------------------------------------------------------- */

typedef enum { P_TEXT, P_VAR, P_BLOCK } pkind;

typedef struct part {
    pkind k;
    size_t off, len;      /* P_TEXT: the text after whitespace control */
    size_t t0, t1;        /* tags: tokens [t0, t1) */
} part;

typedef struct parser {
    jinja_template *t;
    const char *src;
    size_t len;
    tok *toks;
    size_t ntoks, tcap;
    part *parts;
    size_t nparts, pcap;
    size_t pi;            /* the part being parsed */
    size_t ti, tend;      /* the token being parsed, and the tag's end */
    int depth;
    int failed;
} parser;

#define PFAIL(p, off, ...) (perr((p), (off), __VA_ARGS__), (void *)NULL)

static void perr(parser *p, size_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void perr(parser *p, size_t off, const char *fmt, ...) {
    if (p->failed) return;
    p->failed = 1;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    line_col(p->src, off < p->len ? off : p->len, &line, &col);
    ct_set_error("%s:%d:%d: %s", p->t->name, line, col, msg);
}

static void *palloc(parser *p, size_t n) {
    void *m = arena_alloc(&p->t->mem, n);
    if (!m) perr(p, 0, "out of memory");
    return m;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static int is_name0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

static tok *push_tok(parser *p, tkind k, size_t off, size_t len) {
    if (p->ntoks == p->tcap) {
        size_t c = p->tcap ? 2 * p->tcap : 256;
        tok *g = realloc(p->toks, c * sizeof *g);
        if (!g) return PFAIL(p, off, "out of memory");
        p->toks = g;
        p->tcap = c;
    }
    tok *t = &p->toks[p->ntoks++];
    *t = (tok){.k = k, .off = off, .len = len};
    return t;
}

static int push_part(parser *p, part pt) {
    if (p->nparts == p->pcap) {
        size_t c = p->pcap ? 2 * p->pcap : 64;
        part *g = realloc(p->parts, c * sizeof *g);
        if (!g) {
            perr(p, pt.off, "out of memory");
            return -1;
        }
        p->parts = g;
        p->pcap = c;
    }
    p->parts[p->nparts++] = pt;
    return 0;
}

/* A quoted string at src[i] (the quote): decoded into the token; returns the offset after it. */
static size_t lex_string(parser *p, size_t i, size_t end) {
    char q = p->src[i];
    size_t j = i + 1;
    tok *t = push_tok(p, T_STR, i, 0);
    if (!t) return end;
    char *s = palloc(p, end - i + 1);
    if (!s) return end;
    size_t n = 0;
    while (j < end && p->src[j] != q) {
        char c = p->src[j];
        if (c == '\\' && j + 1 < end) {
            char e = p->src[++j];
            switch (e) {
            case 'n': s[n++] = '\n'; break;
            case 't': s[n++] = '\t'; break;
            case 'r': s[n++] = '\r'; break;
            case '\\': s[n++] = '\\'; break;
            case '\'': s[n++] = '\''; break;
            case '"': s[n++] = '"'; break;
            default: s[n++] = '\\'; s[n++] = e; break;   /* Python keeps an unknown escape whole */
            }
            j++;
            continue;
        }
        s[n++] = c;
        j++;
    }
    if (j >= end) {
        perr(p, i, "unterminated string");
        return end;
    }
    t = &p->toks[p->ntoks - 1];
    t->s = s;
    t->slen = n;
    t->len = j + 1 - i;
    return j + 1;
}

/* The tokens of a tag whose content starts at i; stops at its closing delimiter (close: "}}" or "%}"),
 * returning the offset after it; *minus: the closing had '-', *plus: it had '+'. */
static size_t lex_tag(parser *p, size_t i, const char *close, int *minus, int *plus) {
    int depth = 0;
    *minus = *plus = 0;
    while (i < p->len && !p->failed) {
        char c = p->src[i];
        if (is_ws(c)) {
            i++;
            continue;
        }
        if (depth == 0) {
            if ((c == '-' || c == '+') && i + 2 < p->len && p->src[i + 1] == close[0] &&
                p->src[i + 2] == close[1]) {
                *minus = c == '-';
                *plus = c == '+';
                return i + 3;
            }
            if (c == close[0] && i + 1 < p->len && p->src[i + 1] == close[1]) return i + 2;
        }
        if (c == '\'' || c == '"') {
            i = lex_string(p, i, p->len);
            continue;
        }
        if (is_name0(c)) {
            size_t j = i;
            while (j < p->len && (is_name0(p->src[j]) || is_digit(p->src[j]))) j++;
            push_tok(p, T_NAME, i, j - i);
            i = j;
            continue;
        }
        if (is_digit(c)) {
            size_t j = i;
            while (j < p->len && is_digit(p->src[j])) j++;
            int fl = j + 1 < p->len && p->src[j] == '.' && is_digit(p->src[j + 1]);
            if (fl) {
                j++;
                while (j < p->len && is_digit(p->src[j])) j++;
            }
            if (j < p->len && (p->src[j] == 'e' || p->src[j] == 'E')) {   /* 1e3, 2.5e-4 */
                size_t k = j + 1;
                if (k < p->len && (p->src[k] == '+' || p->src[k] == '-')) k++;
                if (k < p->len && is_digit(p->src[k])) {
                    while (k < p->len && is_digit(p->src[k])) k++;
                    j = k;
                    fl = 1;
                }
            }
            tok *t = push_tok(p, fl ? T_FLOAT : T_INT, i, j - i);
            if (!t) break;
            char buf[64];
            size_t n = j - i < sizeof buf - 1 ? j - i : sizeof buf - 1;
            memcpy(buf, p->src + i, n);
            buf[n] = 0;
            if (fl) t->f = strtod(buf, NULL);
            else if (n > 18) perr(p, i, "integer literal too large");
            else t->i = strtoll(buf, NULL, 10);
            i = j;
            continue;
        }
        static const char *ops2[] = {"//", "==", "!=", "<=", ">=", "**"};
        size_t oplen = 0;
        for (size_t k = 0; k < sizeof ops2 / sizeof *ops2; k++)
            if (i + 1 < p->len && c == ops2[k][0] && p->src[i + 1] == ops2[k][1]) oplen = 2;
        if (!oplen && strchr("()[]{}.,:|~+-*/%<>=", c)) oplen = 1;
        if (!oplen) {
            perr(p, i, "unexpected character '%c'", c);
            break;
        }
        if (c == '(' || c == '[' || c == '{') depth++;
        if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
        push_tok(p, T_OP, i, oplen);
        i += oplen;
    }
    if (!p->failed) perr(p, i, "a tag is not closed (expected '%s')", close);
    return p->len;
}

/* Cuts the source into parts, applying whitespace control: '-' strips all whitespace on its side;
 * trim_blocks drops the newline after a block or comment tag; lstrip_blocks drops spaces and tabs
 * from the start of a line to a block or comment tag (unless '+'). */
static int cut_parts(parser *p) {
    size_t i = 0, text_start = 0;
    int line_start = 1;   /* the pending text began at the start of a line */
    while (!p->failed) {
        const char *open = NULL;
        size_t j = i;
        for (; j + 1 < p->len; j++)
            if (p->src[j] == '{' && (p->src[j + 1] == '{' || p->src[j + 1] == '%' || p->src[j + 1] == '#')) {
                open = p->src + j;
                break;
            }
        size_t text_end = open ? j : p->len;
        if (!open) {
            if (text_end > text_start && push_part(p, (part){P_TEXT, text_start, text_end - text_start, 0, 0}))
                return -1;
            return 0;
        }
        char kind = open[1];
        size_t after = j + 2;
        int lminus = after < p->len && p->src[after] == '-', lplus = after < p->len && p->src[after] == '+';
        if (lminus || lplus) after++;
        /* the pending text, trimmed on its right */
        size_t te = text_end;
        if (lminus) {
            while (te > text_start && is_ws(p->src[te - 1])) te--;
        } else if (kind != '{' && !lplus) {
            size_t l = te;
            while (l > text_start && p->src[l - 1] != '\n') l--;
            int at_line = l > text_start || (l == text_start && line_start);
            size_t k = l;
            while (k < te && (p->src[k] == ' ' || p->src[k] == '\t' || p->src[k] == '\r' || p->src[k] == '\f' ||
                              p->src[k] == '\v'))
                k++;
            if (at_line && k == te) te = l;
        }
        if (te > text_start && push_part(p, (part){P_TEXT, text_start, te - text_start, 0, 0})) return -1;
        size_t end;
        int rminus = 0, rplus = 0;
        if (kind == '#') {
            const char *close = NULL;
            for (size_t k = after; k + 1 < p->len; k++)
                if (p->src[k] == '#' && p->src[k + 1] == '}') {
                    close = p->src + k;
                    break;
                }
            if (!close) {
                perr(p, j, "a comment is not closed (expected '#}')");
                return -1;
            }
            size_t k = (size_t)(close - p->src);
            rminus = k > after && p->src[k - 1] == '-';
            rplus = k > after && p->src[k - 1] == '+';
            end = k + 2;
        } else {
            size_t t0 = p->ntoks;
            end = lex_tag(p, after, kind == '{' ? "}}" : "%}", &rminus, &rplus);
            if (p->failed) return -1;
            if (push_part(p, (part){kind == '{' ? P_VAR : P_BLOCK, j, end - j, t0, p->ntoks})) return -1;
        }
        if (rminus) {
            while (end < p->len && is_ws(p->src[end])) end++;
        } else if (kind != '{' && !rplus && end < p->len && p->src[end] == '\n') {
            end++;
        }
        line_start = end > 0 && p->src[end - 1] == '\n';
        i = text_start = end;
    }
    return -1;
}

/* -- expressions -- */

static tok *peek(parser *p) {
    static tok end = {.k = T_END};
    if (p->ti < p->tend) return &p->toks[p->ti];
    end.off = p->ti < p->ntoks ? p->toks[p->ti].off : p->len;
    if (p->ti == p->tend && p->tend > 0) end.off = p->toks[p->tend - 1].off + p->toks[p->tend - 1].len;
    return &end;
}
static int tok_is(parser *p, const tok *t, tkind k, const char *s) {
    return t->k == k && t->len == strlen(s) && memcmp(p->src + t->off, s, t->len) == 0;
}
static int at_op(parser *p, const char *s) { return tok_is(p, peek(p), T_OP, s); }
static int at_name(parser *p, const char *s) { return tok_is(p, peek(p), T_NAME, s); }
static int accept_op(parser *p, const char *s) {
    if (!at_op(p, s)) return 0;
    p->ti++;
    return 1;
}
static int expect_op(parser *p, const char *s) {
    if (accept_op(p, s)) return 1;
    tok *t = peek(p);
    if (t->k == T_END) perr(p, t->off, "expected '%s', found the end of the tag", s);
    else perr(p, t->off, "expected '%s', found '%.*s'", s, (int)t->len, p->src + t->off);
    return 0;
}

static node *mk(parser *p, int kind, size_t off) {
    node *n = palloc(p, sizeof *n);
    if (n) {
        n->kind = kind;
        n->off = off;
    }
    return n;
}

static int add_arg(parser *p, node *n, node *a) {
    if (!a) return -1;
    node **g = palloc(p, (n->nargs + 1) * sizeof *g);
    if (!g) return -1;
    if (n->nargs) memcpy(g, n->args, n->nargs * sizeof *g);
    g[n->nargs++] = a;
    n->args = g;
    return 0;
}

static int add_kw(parser *p, node *n, const tok *name, node *v) {
    if (!v) return -1;
    char **kn = palloc(p, (n->nkw + 1) * sizeof *kn);
    node **kv = palloc(p, (n->nkw + 1) * sizeof *kv);
    char *s = palloc(p, name->len + 1);
    if (!kn || !kv || !s) return -1;
    if (n->nkw) {
        memcpy(kn, n->kwn, n->nkw * sizeof *kn);
        memcpy(kv, n->kwv, n->nkw * sizeof *kv);
    }
    memcpy(s, p->src + name->off, name->len);
    kn[n->nkw] = s;
    kv[n->nkw++] = v;
    n->kwn = kn;
    n->kwv = kv;
    return 0;
}

static node *parse_expr(parser *p);

/* (args, name=value, ...) after the '(' */
static int parse_args(parser *p, node *n) {
    while (!p->failed && !accept_op(p, ")")) {
        if (n->nargs + n->nkw && !expect_op(p, ",")) return -1;
        if (accept_op(p, ")")) break;   /* a trailing comma */
        tok *t = peek(p);
        if (t->k == T_NAME && p->ti + 1 < p->tend && tok_is(p, &p->toks[p->ti + 1], T_OP, "=")) {
            p->ti += 2;
            if (add_kw(p, n, t, parse_expr(p))) return -1;
        } else {
            if (n->nkw) {
                perr(p, t->off, "a positional argument after a keyword argument");
                return -1;
            }
            if (add_arg(p, n, parse_expr(p))) return -1;
        }
    }
    return p->failed ? -1 : 0;
}

static int name_in(const char *s, size_t n, const char *const *list) {
    for (; *list; list++)
        if (strlen(*list) == n && memcmp(*list, s, n) == 0) return 1;
    return 0;
}

static const char *const FILTERS[] = {"trim", "length", "count", "tojson", "upper", "lower", "capitalize", "title",
                                      "first", "last", "join", "default", "d", "string", "list", "reject", "select",
                                      "replace", "int", "float", "abs", "items", NULL};
static const char *const TESTS[] = {"defined", "undefined", "none", "string", "number", "integer", "float",
                                    "boolean", "true", "false", "mapping", "iterable", "sequence", "odd", "even",
                                    "equalto", "eq", "ne", NULL};
static const char *const METHODS[] = {"strip", "lstrip", "rstrip", "startswith", "endswith", "split", "upper",
                                      "lower", "replace", "title", "capitalize", "get", "items", "keys", "values",
                                      NULL};
static const char *const FUNCS[] = {"raise_exception", "namespace", "range", NULL};

static node *parse_primary(parser *p) {
    tok *t = peek(p);
    if (t->k == T_END) return PFAIL(p, t->off, "expected an expression, found the end of the tag");
    p->ti++;
    node *n;
    switch (t->k) {
    case T_STR:
    case T_INT:
    case T_FLOAT:
        if (!(n = mk(p, E_LIT, t->off)) || !(n->lit = palloc(p, sizeof(jv)))) return NULL;
        if (t->k == T_STR) *n->lit = (jv){.k = V_STR, .s = t->s, .n = t->slen};
        else if (t->k == T_INT) *n->lit = (jv){.k = V_INT, .i = t->i};
        else *n->lit = (jv){.k = V_FLOAT, .f = t->f};
        /* adjacent string literals concatenate, as in Python */
        while (t->k == T_STR && peek(p)->k == T_STR) {
            tok *u = peek(p);
            p->ti++;
            char *s = palloc(p, n->lit->n + u->slen + 1);
            if (!s) return NULL;
            memcpy(s, n->lit->s, n->lit->n);
            memcpy(s + n->lit->n, u->s, u->slen);
            n->lit->s = s;
            n->lit->n += u->slen;
        }
        return n;
    case T_NAME: {
        const char *s = p->src + t->off;
        static const struct { const char *w; jv *v; } consts[] = {
            {"true", &v_true}, {"True", &v_true}, {"false", &v_false}, {"False", &v_false},
            {"none", &v_none}, {"None", &v_none}};
        for (size_t k = 0; k < sizeof consts / sizeof *consts; k++)
            if (tok_is(p, t, T_NAME, consts[k].w)) {
                if ((n = mk(p, E_LIT, t->off))) n->lit = consts[k].v;
                return n;
            }
        if (!(n = mk(p, E_NAME, t->off))) return NULL;
        n->name = s;
        n->nlen = t->len;
        return n;
    }
    case T_OP:
        if (tok_is(p, t, T_OP, "(")) {
            if (++p->depth > MAX_DEPTH) return PFAIL(p, t->off, "expressions nested deeper than %d", MAX_DEPTH);
            n = parse_expr(p);
            p->depth--;
            if (n && at_op(p, ",")) return PFAIL(p, peek(p)->off, "unsupported construct 'tuple'");
            return n && expect_op(p, ")") ? n : NULL;
        }
        if (tok_is(p, t, T_OP, "[")) {
            if (!(n = mk(p, E_LIST, t->off))) return NULL;
            while (!p->failed && !accept_op(p, "]")) {
                if (n->nargs && !expect_op(p, ",")) return NULL;
                if (accept_op(p, "]")) break;
                if (add_arg(p, n, parse_expr(p))) return NULL;
            }
            return p->failed ? NULL : n;
        }
        if (tok_is(p, t, T_OP, "{")) {
            if (!(n = mk(p, E_DICT, t->off))) return NULL;
            while (!p->failed && !accept_op(p, "}")) {
                if (n->nargs && !expect_op(p, ",")) return NULL;
                if (accept_op(p, "}")) break;
                if (add_arg(p, n, parse_expr(p)) || !expect_op(p, ":") || add_arg(p, n, parse_expr(p))) return NULL;
            }
            return p->failed ? NULL : n;
        }
        break;
    default:
        break;
    }
    return PFAIL(p, t->off, "unexpected '%.*s' in an expression", (int)t->len, p->src + t->off);
}

/* .attr, [index], [a:b:c], (args) */
static node *parse_postfix(parser *p, node *n) {
    while (n && !p->failed) {
        tok *t = peek(p);
        if (accept_op(p, ".")) {
            tok *a = peek(p);
            if (a->k != T_NAME && a->k != T_INT) return PFAIL(p, a->off, "expected an attribute name after '.'");
            p->ti++;
            node *m = mk(p, E_ATTR, a->off);
            if (!m) return NULL;
            m->a = n;
            m->name = p->src + a->off;
            m->nlen = a->len;
            n = m;
        } else if (accept_op(p, "[")) {
            node *m = mk(p, E_INDEX, t->off);
            if (!m) return NULL;
            m->a = n;
            node *parts[3] = {NULL, NULL, NULL};
            int k = 0, slice = 0;
            while (!p->failed) {
                if (at_op(p, ":")) {
                    if (++k > 2) return PFAIL(p, peek(p)->off, "a slice takes at most start:stop:step");
                    slice = 1;
                    p->ti++;
                    continue;
                }
                if (accept_op(p, "]")) break;
                if (parts[k]) return PFAIL(p, peek(p)->off, "expected ':' or ']' in a subscript");
                if (!(parts[k] = parse_expr(p))) return NULL;
            }
            if (p->failed) return NULL;
            if (slice) {
                m->kind = E_SLICE;
                m->b = parts[0];
                m->c = parts[1];
                m->args = palloc(p, sizeof(node *));
                if (!m->args) return NULL;
                m->args[0] = parts[2];
            } else {
                if (!parts[0]) return PFAIL(p, t->off, "an empty subscript");
                m->b = parts[0];
            }
            n = m;
        } else if (accept_op(p, "(")) {
            if (n->kind == E_NAME && !name_in(n->name, n->nlen, FUNCS))
                return PFAIL(p, n->off, "unsupported function '%.*s'", (int)n->nlen, n->name);
            if (n->kind == E_ATTR && !name_in(n->name, n->nlen, METHODS))
                return PFAIL(p, n->off, "unsupported method '%.*s'", (int)n->nlen, n->name);
            if (n->kind != E_NAME && n->kind != E_ATTR) return PFAIL(p, t->off, "unsupported call");
            node *m = mk(p, E_CALL, n->kind == E_NAME ? n->off : t->off);   /* messages name the function */
            if (!m) return NULL;
            m->a = n;
            if (parse_args(p, m)) return NULL;
            n = m;
        } else {
            break;
        }
    }
    return p->failed ? NULL : n;
}

/* | filter(args) and is [not] test(args), after a primary and its postfixes */
static node *parse_filters(parser *p, node *n) {
    while (n && !p->failed) {
        tok *t = peek(p);
        int filter = accept_op(p, "|");
        if (!filter) {
            if (!at_name(p, "is")) break;
            p->ti++;
        }
        node *m = mk(p, filter ? E_FILTER : E_TEST, t->off);
        if (!m) return NULL;
        if (!filter && at_name(p, "not")) {
            p->ti++;
            m->neg = 1;
        }
        tok *f = peek(p);
        if (f->k != T_NAME && !(f->k == T_OP && !filter && (tok_is(p, f, T_OP, "==") || tok_is(p, f, T_OP, "!="))))
            return PFAIL(p, f->off, "expected a %s name", filter ? "filter" : "test");
        p->ti++;
        m->name = p->src + f->off;
        m->nlen = f->len;
        if (filter && !name_in(m->name, m->nlen, FILTERS))
            return PFAIL(p, f->off, "unsupported filter '%.*s'", (int)f->len, m->name);
        if (!filter && f->k == T_NAME && !name_in(m->name, m->nlen, TESTS))
            return PFAIL(p, f->off, "unsupported test '%.*s'", (int)f->len, m->name);
        if (f->k == T_OP) m->name = tok_is(p, f, T_OP, "==") ? "eq" : "ne", m->nlen = 2;
        m->a = n;
        if (accept_op(p, "(")) {
            if (parse_args(p, m)) return NULL;
        } else if (!filter) {
            /* a test's single argument may follow without parentheses: `x is equalto 3` */
            tok *u = peek(p);
            if (u->k == T_STR || u->k == T_INT || u->k == T_FLOAT ||
                (u->k == T_NAME && !tok_is(p, u, T_NAME, "and") && !tok_is(p, u, T_NAME, "or") &&
                 !tok_is(p, u, T_NAME, "else") && !tok_is(p, u, T_NAME, "if") && !tok_is(p, u, T_NAME, "in") &&
                 !tok_is(p, u, T_NAME, "is") && !tok_is(p, u, T_NAME, "not"))) {
                node *a = parse_postfix(p, parse_primary(p));
                if (add_arg(p, m, a)) return NULL;
            }
        }
        n = m;
    }
    return p->failed ? NULL : n;
}

/* As Jinja's: a sign applies to what follows it without its filters, which then apply to the signed
 * value (-3 | abs is 3). */
static node *parse_unary(parser *p, int with_filters) {
    tok *t = peek(p);
    node *n;
    if (accept_op(p, "-") || accept_op(p, "+")) {
        if (++p->depth > MAX_DEPTH) return PFAIL(p, t->off, "expressions nested deeper than %d", MAX_DEPTH);
        node *a = parse_unary(p, 0);
        p->depth--;
        if (!a) return NULL;
        if (tok_is(p, t, T_OP, "+")) {
            n = a;
        } else if ((n = mk(p, E_NEG, t->off))) {
            n->a = a;
        }
    } else {
        n = parse_postfix(p, parse_primary(p));
    }
    return with_filters ? parse_filters(p, n) : n;
}

static node *bin(parser *p, int op, size_t off, node *a, node *b) {
    if (!a || !b) return NULL;
    node *n = mk(p, E_BIN, off);
    if (n) {
        n->op = op;
        n->a = a;
        n->b = b;
    }
    return n;
}

static node *parse_mul(parser *p) {
    node *n = parse_unary(p, 1);
    while (n && !p->failed) {
        tok *t = peek(p);
        int op = tok_is(p, t, T_OP, "*") ? OP_MUL : tok_is(p, t, T_OP, "/") ? OP_DIV
                 : tok_is(p, t, T_OP, "//") ? OP_FLOORDIV : tok_is(p, t, T_OP, "%") ? OP_MOD : -1;
        if (tok_is(p, t, T_OP, "**")) return PFAIL(p, t->off, "unsupported operator '**'");
        if (op < 0) break;
        p->ti++;
        n = bin(p, op, t->off, n, parse_unary(p, 1));
    }
    return n;
}

static node *parse_cat(parser *p) {
    node *n = parse_mul(p);
    while (n && !p->failed && at_op(p, "~")) {
        size_t off = peek(p)->off;
        p->ti++;
        n = bin(p, OP_CAT, off, n, parse_mul(p));
    }
    return n;
}

static node *parse_add(parser *p) {
    node *n = parse_cat(p);
    while (n && !p->failed) {
        tok *t = peek(p);
        int op = tok_is(p, t, T_OP, "+") ? OP_ADD : tok_is(p, t, T_OP, "-") ? OP_SUB : -1;
        if (op < 0) break;
        p->ti++;
        n = bin(p, op, t->off, n, parse_cat(p));
    }
    return n;
}

static node *parse_compare(parser *p) {
    node *n = parse_add(p);
    while (n && !p->failed) {
        tok *t = peek(p);
        static const struct { const char *s; int op; } cmp[] = {
            {"==", OP_EQ}, {"!=", OP_NE}, {"<", OP_LT}, {"<=", OP_LE}, {">", OP_GT}, {">=", OP_GE}};
        int op = -1;
        for (size_t k = 0; k < sizeof cmp / sizeof *cmp; k++)
            if (tok_is(p, t, T_OP, cmp[k].s)) op = cmp[k].op;
        if (op < 0 && tok_is(p, t, T_NAME, "in")) op = OP_IN;
        if (op < 0 && tok_is(p, t, T_NAME, "not") && p->ti + 1 < p->tend &&
            tok_is(p, &p->toks[p->ti + 1], T_NAME, "in")) {
            op = OP_NOTIN;
            p->ti++;
        }
        if (op < 0) break;
        p->ti++;
        n = bin(p, op, t->off, n, parse_add(p));
    }
    return n;
}

static node *parse_not(parser *p) {
    tok *t = peek(p);
    if (tok_is(p, t, T_NAME, "not")) {
        p->ti++;
        if (++p->depth > MAX_DEPTH) return PFAIL(p, t->off, "expressions nested deeper than %d", MAX_DEPTH);
        node *a = parse_not(p);
        p->depth--;
        if (!a) return NULL;
        node *n = mk(p, E_NOT, t->off);
        if (n) n->a = a;
        return n;
    }
    return parse_compare(p);
}

/* operand (word operand)*: a left-associative chain of the keyword operator `word` */
static node *parse_chain(parser *p, node *(*operand)(parser *), const char *word, int kind) {
    node *n = operand(p);
    while (n && !p->failed && at_name(p, word)) {
        size_t off = peek(p)->off;
        p->ti++;
        node *b = operand(p), *m = b ? mk(p, kind, off) : NULL;
        if (!m) return NULL;
        m->a = n;
        m->b = b;
        n = m;
    }
    return n;
}

static node *parse_and(parser *p) { return parse_chain(p, parse_not, "and", E_AND); }

static node *parse_or(parser *p) { return parse_chain(p, parse_and, "or", E_OR); }

/* a if cond else b (else optional: undefined) */
static node *parse_expr(parser *p) {
    if (++p->depth > MAX_DEPTH) return PFAIL(p, peek(p)->off, "expressions nested deeper than %d", MAX_DEPTH);
    node *n = parse_or(p);
    while (n && !p->failed && at_name(p, "if")) {
        size_t off = peek(p)->off;
        p->ti++;
        node *m = mk(p, E_COND, off);
        if (!m) break;
        m->a = n;
        if (!(m->b = parse_or(p))) {
            n = NULL;
            break;
        }
        if (at_name(p, "else")) {
            p->ti++;
            if (!(m->c = parse_or(p))) {
                n = NULL;
                break;
            }
        }
        n = m;
    }
    p->depth--;
    return p->failed ? NULL : n;
}

/* -- statements -- */

static int tag_done(parser *p) {
    tok *t = peek(p);
    if (t->k == T_END) return 1;
    perr(p, t->off, "unexpected '%.*s' at the end of the tag", (int)t->len, p->src + t->off);
    return 0;
}

/* The body up to one of the end keywords (NULL-terminated); *ended: which one (index), or -1 at the
 * end of the template (an error unless ends is NULL). */
static node *parse_body(parser *p, const char *const *ends, int *ended);

static const char *const UNSUPPORTED[] = {"macro", "call", "filter", "block", "extends", "include", "import", "from",
                                          "raw", "with", "autoescape", "do", "endset", "trans", NULL};

static node *parse_stmt(parser *p, part *pt) {
    tok *t = peek(p);
    if (t->k != T_NAME) return PFAIL(p, pt->off, "expected a statement name after '{%%'");
    p->ti++;
    if (tok_is(p, t, T_NAME, "if")) {
        node *n = mk(p, S_IF, t->off), *cur = n;
        if (!n || !(n->a = parse_expr(p)) || !tag_done(p)) return NULL;
        for (;;) {
            static const char *const ends[] = {"elif", "else", "endif", NULL};
            int e;
            node *body = parse_body(p, ends, &e);
            if (!body) return NULL;
            cur->b = body;
            if (e == 2) break;
            if (e == 1) {
                if (!tag_done(p)) return NULL;
                static const char *const end_only[] = {"endif", NULL};
                if (!(cur->c = parse_body(p, end_only, &e))) return NULL;
                break;
            }
            node *elif = mk(p, S_IF, p->toks[p->ti - 1].off);
            if (!elif || !(elif->a = parse_expr(p)) || !tag_done(p)) return NULL;
            cur->c = elif;
            cur = elif;
        }
        return tag_done(p) ? n : NULL;
    }
    if (tok_is(p, t, T_NAME, "for")) {
        node *n = mk(p, S_FOR, t->off);
        tok *v = peek(p);
        if (!n) return NULL;
        if (v->k != T_NAME) return PFAIL(p, v->off, "expected a loop variable after 'for'");
        p->ti++;
        n->name = p->src + v->off;
        n->nlen = v->len;
        /* for a, b in pairs: the targets, kept in kwn (nkw of them, 2 or more) */
        if (at_op(p, ",")) {
            char **names = palloc(p, 16 * sizeof *names);
            if (!names) return NULL;
            n->kwn = names;
            tok *cur = v;
            do {
                if (n->nkw == 16) return PFAIL(p, cur->off, "more than 16 loop targets");
                char *nm = palloc(p, cur->len + 1);
                if (!nm) return NULL;
                memcpy(nm, p->src + cur->off, cur->len);
                names[n->nkw++] = nm;
                if (!accept_op(p, ",")) break;
                cur = peek(p);
                if (cur->k != T_NAME) return PFAIL(p, cur->off, "expected a loop variable after ','");
                p->ti++;
            } while (1);
        }
        if (!at_name(p, "in")) return PFAIL(p, peek(p)->off, "expected 'in' after the loop variable");
        p->ti++;
        if (!(n->a = parse_or(p))) return NULL;
        if (at_name(p, "if")) return PFAIL(p, peek(p)->off, "unsupported construct 'for ... if'");
        if (at_name(p, "recursive")) return PFAIL(p, peek(p)->off, "unsupported construct 'recursive'");
        if (!tag_done(p)) return NULL;
        static const char *const ends[] = {"endfor", "else", NULL};
        int e;
        if (!(n->b = parse_body(p, ends, &e))) return NULL;
        if (e == 1) return PFAIL(p, p->toks[p->ti - 1].off, "unsupported construct 'for ... else'");
        return tag_done(p) ? n : NULL;
    }
    if (tok_is(p, t, T_NAME, "set")) {
        node *n = mk(p, S_SET, t->off);
        tok *v = peek(p);
        if (!n) return NULL;
        if (v->k != T_NAME) return PFAIL(p, v->off, "expected a variable name after 'set'");
        p->ti++;
        n->name = p->src + v->off;
        n->nlen = v->len;
        if (accept_op(p, ".")) {
            tok *a = peek(p);
            if (a->k != T_NAME) return PFAIL(p, a->off, "expected an attribute name after '.'");
            p->ti++;
            n->attr = p->src + a->off;
            n->alen = a->len;
        }
        if (at_op(p, ",")) return PFAIL(p, peek(p)->off, "unsupported construct 'set with several targets'");
        if (peek(p)->k == T_END) return PFAIL(p, t->off, "unsupported construct 'set block'");
        if (!expect_op(p, "=") || !(n->a = parse_expr(p))) return NULL;
        return tag_done(p) ? n : NULL;
    }
    if (tok_is(p, t, T_NAME, "break") || tok_is(p, t, T_NAME, "continue")) {
        node *n = mk(p, tok_is(p, t, T_NAME, "break") ? S_BREAK : S_CONTINUE, t->off);
        return n && tag_done(p) ? n : NULL;
    }
    if (tok_is(p, t, T_NAME, "generation")) {
        node *n = mk(p, S_GEN, t->off);
        static const char *const ends[] = {"endgeneration", NULL};
        int e;
        if (!n || !tag_done(p) || !(n->b = parse_body(p, ends, &e)) || !tag_done(p)) return NULL;
        p->t->has_generation = 1;
        return n;
    }
    if (name_in(p->src + t->off, t->len, UNSUPPORTED))
        return PFAIL(p, t->off, "unsupported statement '%.*s'", (int)t->len, p->src + t->off);
    return PFAIL(p, t->off, "unexpected statement '%.*s'", (int)t->len, p->src + t->off);
}

static node *parse_body(parser *p, const char *const *ends, int *ended) {
    node *body = mk(p, S_BODY, p->pi < p->nparts ? p->parts[p->pi].off : p->len);
    if (!body) return NULL;
    if (++p->depth > MAX_DEPTH) return PFAIL(p, body->off, "statements nested deeper than %d", MAX_DEPTH);
    *ended = -1;
    while (p->pi < p->nparts && !p->failed) {
        part *pt = &p->parts[p->pi++];
        node *n = NULL;
        if (pt->k == P_TEXT) {
            if ((n = mk(p, S_TEXT, pt->off)) && (n->lit = palloc(p, sizeof(jv))))
                *n->lit = (jv){.k = V_STR, .s = p->t->src + pt->off, .n = pt->len};
        } else {
            p->ti = pt->t0;
            p->tend = pt->t1;
            if (pt->k == P_VAR) {
                if ((n = mk(p, S_OUT, pt->off)) && (!(n->a = parse_expr(p)) || !tag_done(p))) n = NULL;
            } else {
                tok *t = peek(p);
                for (int k = 0; ends && ends[k]; k++)
                    if (tok_is(p, t, T_NAME, ends[k])) {
                        p->ti++;
                        *ended = k;
                        p->depth--;
                        return body;
                    }
                static const char *const closers[] = {"endif", "endfor", "elif", "else", "endgeneration", NULL};
                if (t->k == T_NAME && name_in(p->src + t->off, t->len, closers))
                    return PFAIL(p, t->off, "'%.*s' without its opening statement", (int)t->len, p->src + t->off);
                n = parse_stmt(p, pt);
            }
        }
        if (add_arg(p, body, n)) return NULL;
    }
    p->depth--;
    if (p->failed) return NULL;
    if (ends) return PFAIL(p, p->len, "the template ends inside a block (expected '%s')", ends[0]);
    return body;
}

ct_status jinja_parse(const char *src, size_t len, const char *name, jinja_template **out) {
    *out = NULL;
    jinja_template *t = calloc(1, sizeof *t);
    if (!t || !(t->src = malloc(len + 1)) || !(t->name = strdup(name))) {
        jinja_free(t);
        return ct_fail(CT_ERR_NOMEM, "%s: out of memory", name);
    }
    /* as Jinja reads a source: line ends made "\n", one trailing newline dropped */
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            t->src[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            t->src[n++] = src[i];
        }
    }
    if (n && t->src[n - 1] == '\n') n--;
    t->src[n] = 0;
    t->len = len = n;
    parser p = {.t = t, .src = t->src, .len = len};
    if (cut_parts(&p) == 0) {
        int e;
        t->root = parse_body(&p, NULL, &e);
    }
    free(p.toks);
    free(p.parts);
    if (p.failed || !t->root) {
        if (!p.failed) ct_set_error("%s: out of memory", name);
        jinja_free(t);
        return CT_ERR_INVALID;
    }
    *out = t;
    return CT_OK;
}

void jinja_free(jinja_template *t) {
    if (!t) return;
    arena_free(&t->mem);
    free(t->src);
    free(t->name);
    free(t);
}

int jinja_has_generation(const jinja_template *t) { return t->has_generation; }

/* ---- rendering ----------------------------------------------------------------------------------- */

typedef struct frame {
    struct frame *parent;
    const char **names;
    size_t *lens;
    jv **vals;
    size_t n, cap;
} frame;

typedef struct render {
    const jinja_template *t;
    arena mem;
    char *out;
    size_t len, cap;
    jinja_span *spans;
    size_t nspans, scap;
    frame *top;
    int failed;
    int brk, cont;   /* a break or continue is unwinding to its loop */
    long steps;
} render;

static void rerr(render *r, size_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void rerr(render *r, size_t off, const char *fmt, ...) {
    if (r->failed) return;
    r->failed = 1;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    line_col(r->t->src, off, &line, &col);
    ct_set_error("%s:%d:%d: %s", r->t->name, line, col, msg);
}

#define RFAIL(r, off, ...) (rerr((r), (off), __VA_ARGS__), (jv *)NULL)

static void *ralloc(render *r, size_t n) {
    void *m = arena_alloc(&r->mem, n);
    if (!m) rerr(r, 0, "rendering needs more than %zu MiB", MAX_BYTES >> 20);
    return m;
}

static jv *mkval(render *r, vkind k) {
    jv *v = ralloc(r, sizeof *v);
    if (v) v->k = k;
    return v;
}
static jv *mkint(render *r, long long i) {
    jv *v = mkval(r, V_INT);
    if (v) v->i = i;
    return v;
}
static jv *mkstr(render *r, const char *s, size_t n) {
    jv *v = mkval(r, V_STR);
    char *c = v ? ralloc(r, n + 1) : NULL;
    if (!c) return NULL;
    if (n) memcpy(c, s, n);
    v->s = c;
    v->n = n;
    return v;
}
static jv *mkbool(int b) { return b ? &v_true : &v_false; }

/* A growing byte buffer in the arena (its old copies stay until the render ends: bounded by the cap). */
typedef struct sbuf {
    render *r;
    char *s;
    size_t n, cap;
} sbuf;
static int sb_put(sbuf *b, const char *s, size_t n) {
    if (b->n + n > b->cap) {
        size_t c = b->cap ? 2 * b->cap : 64;
        while (c < b->n + n) c *= 2;
        char *g = ralloc(b->r, c);
        if (!g) return -1;
        if (b->n) memcpy(g, b->s, b->n);
        b->s = g;
        b->cap = c;
    }
    if (n) memcpy(b->s + b->n, s, n);
    b->n += n;
    return 0;
}
static int sb_str(sbuf *b, const char *s) { return sb_put(b, s, strlen(s)); }

static jv *list_new(render *r, size_t n) {
    jv *v = mkval(r, V_LIST);
    if (v && n && !(v->items = ralloc(r, n * sizeof(jv *)))) return NULL;
    if (v) v->n = n;
    return v;
}

static jv *from_json(render *r, const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jv *v = mkval(r, V_DICT);
        size_t n = json_object_size(j);
        if (!v || (n && !(v->items = ralloc(r, 2 * n * sizeof(jv *))))) return NULL;
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)j, k, x) {
            jv *key = mkstr(r, k, strlen(k)), *val = from_json(r, x);
            if (!key || !val) return NULL;
            v->items[2 * v->n] = key;
            v->items[2 * v->n++ + 1] = val;
        }
        return v;
    }
    case JSON_ARRAY: {
        jv *v = list_new(r, json_array_size(j));
        for (size_t i = 0; v && i < v->n; i++)
            if (!(v->items[i] = from_json(r, json_array_get(j, i)))) return NULL;
        return v;
    }
    case JSON_STRING: return mkstr(r, json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return mkint(r, (long long)json_integer_value(j));
    case JSON_REAL: {
        jv *v = mkval(r, V_FLOAT);
        if (v) v->f = json_real_value(j);
        return v;
    }
    case JSON_TRUE: return &v_true;
    case JSON_FALSE: return &v_false;
    default: return &v_none;
    }
}

static const char *kind_name(const jv *v) {
    static const char *names[] = {"undefined", "none", "boolean", "integer", "float", "string", "list", "dict",
                                  "namespace"};
    return names[v->k];
}

static int truthy(const jv *v) {
    switch (v->k) {
    case V_UNDEF: case V_NONE: return 0;
    case V_BOOL: case V_INT: return v->i != 0;
    case V_FLOAT: return v->f != 0;
    case V_STR: case V_LIST: case V_DICT: return v->n > 0;
    default: return 1;
    }
}

static jv *dict_get(const jv *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->n; i++) {
        jv *key = d->items[2 * i];
        if (key->k == V_STR && key->n == n && memcmp(key->s, k, n) == 0) return d->items[2 * i + 1];
    }
    return NULL;
}

static int dict_set(render *r, jv *d, jv *key, jv *val) {
    for (size_t i = 0; i < d->n; i++) {
        jv *k = d->items[2 * i];
        if (k->k == V_STR && k->n == key->n && memcmp(k->s, key->s, key->n) == 0) {
            d->items[2 * i + 1] = val;
            return 0;
        }
    }
    if (d->n == d->cap) {
        size_t c = d->cap ? 2 * d->cap : 8;
        jv **g = ralloc(r, 2 * c * sizeof *g);
        if (!g) return -1;
        if (d->n) memcpy(g, d->items, 2 * d->n * sizeof *g);
        d->items = g;
        d->cap = c;
    }
    d->items[2 * d->n] = key;
    d->items[2 * d->n++ + 1] = val;
    return 0;
}

/* Python's repr of a float: the shortest digits that read back. */
static void fmt_float(char *buf, size_t n, double f) {
    if (isnan(f)) { snprintf(buf, n, "nan"); return; }
    if (isinf(f)) { snprintf(buf, n, f < 0 ? "-inf" : "inf"); return; }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, f);
        if (strtod(buf, NULL) == f) break;
    }
    if (!strpbrk(buf, ".enN")) strncat(buf, ".0", n - strlen(buf) - 1);
    char *e = strchr(buf, 'e');
    if (e && (e[1] == '+' || e[1] == '-') && e[2] == '0' && e[3]) memmove(e + 2, e + 3, strlen(e + 3) + 1);
}

static int to_str_at(sbuf *b, const jv *v, int repr, int depth);
static int to_str(sbuf *b, const jv *v, int repr) { return to_str_at(b, v, repr, 0); }

static int repr_str(sbuf *b, const char *s, size_t n) {
    if (sb_put(b, "'", 1)) return -1;
    for (size_t i = 0; i < n; i++) {
        const char *e = s[i] == '\'' ? "\\'" : s[i] == '\\' ? "\\\\" : s[i] == '\n' ? "\\n" : s[i] == '\t' ? "\\t"
                        : s[i] == '\r' ? "\\r" : NULL;
        if (e ? sb_str(b, e) : sb_put(b, s + i, 1)) return -1;
    }
    return sb_put(b, "'", 1);
}

/* Python's str() (repr for the items of lists and dicts). */
static int to_str_at(sbuf *b, const jv *v, int repr, int depth) {
    char num[64];
    if (depth > MAX_NEST && (v->k == V_LIST || v->k == V_DICT || v->k == V_NS)) {
        rerr(b->r, 0, "a value nested deeper than %d (or holding itself) cannot be printed", MAX_NEST);
        return -1;
    }
    switch (v->k) {
    case V_UNDEF: return 0;
    case V_NONE: return sb_str(b, "None");
    case V_BOOL: return sb_str(b, v->i ? "True" : "False");
    case V_INT: snprintf(num, sizeof num, "%lld", v->i); return sb_str(b, num);
    case V_FLOAT: fmt_float(num, sizeof num, v->f); return sb_str(b, num);
    case V_STR: return repr ? repr_str(b, v->s, v->n) : sb_put(b, v->s, v->n);
    case V_LIST:
        if (sb_str(b, v->tuple ? "(" : "[")) return -1;
        for (size_t i = 0; i < v->n; i++)
            if ((i && sb_str(b, ", ")) || to_str_at(b, v->items[i], 1, depth + 1)) return -1;
        return sb_str(b, !v->tuple ? "]" : v->n == 1 ? ",)" : ")");
    case V_DICT:
    case V_NS:
        if (sb_str(b, v->k == V_NS ? "<Namespace {" : "{")) return -1;
        for (size_t i = 0; i < v->n; i++)
            if ((i && sb_str(b, ", ")) || to_str_at(b, v->items[2 * i], 1, depth + 1) || sb_str(b, ": ") ||
                to_str_at(b, v->items[2 * i + 1], 1, depth + 1))
                return -1;
        return sb_str(b, v->k == V_NS ? "}>" : "}");
    }
    return 0;
}

static jv *str_of(render *r, jv *v) {
    if (v->k == V_STR) return v;
    sbuf b = {.r = r};
    if (to_str(&b, v, 0)) return NULL;
    jv *s = mkval(r, V_STR);
    if (s) {
        s->s = b.s ? b.s : "";
        s->n = b.n;
    }
    return s;
}

/* json.dumps(v, ensure_ascii, indent, sort_keys=False) with Python's default separators. */
static int to_json(render *r, sbuf *b, const jv *v, int indent, int level, int ascii, size_t off) {
    char num[64];
    switch (v->k) {
    case V_NONE: return sb_str(b, "null");
    case V_BOOL: return sb_str(b, v->i ? "true" : "false");
    case V_INT: snprintf(num, sizeof num, "%lld", v->i); return sb_str(b, num);
    case V_FLOAT:
        if (isnan(v->f)) return sb_str(b, "NaN");
        if (isinf(v->f)) return sb_str(b, v->f < 0 ? "-Infinity" : "Infinity");
        fmt_float(num, sizeof num, v->f);
        return sb_str(b, num);
    case V_STR: {
        if (sb_put(b, "\"", 1)) return -1;
        for (size_t i = 0; i < v->n; i++) {
            unsigned char c = (unsigned char)v->s[i];
            const char *e = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                            : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
            if (e) {
                if (sb_str(b, e)) return -1;
            } else if (c < 0x20) {
                snprintf(num, sizeof num, "\\u%04x", c);
                if (sb_str(b, num)) return -1;
            } else if (c >= 0x80 && ascii) {
                /* a UTF-8 sequence as \uXXXX (surrogate pairs above U+FFFF) */
                unsigned code = 0;
                int k = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
                code = c & (0x3F >> k);
                for (int m = 0; m < k && i + 1 < v->n; m++) code = code << 6 | ((unsigned char)v->s[++i] & 0x3F);
                if (code >= 0x10000) {
                    code -= 0x10000;
                    snprintf(num, sizeof num, "\\u%04x\\u%04x", 0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF));
                } else {
                    snprintf(num, sizeof num, "\\u%04x", code);
                }
                if (sb_str(b, num)) return -1;
            } else if (sb_put(b, v->s + i, 1)) {
                return -1;
            }
        }
        return sb_put(b, "\"", 1);
    }
    case V_LIST:
    case V_DICT: {
        int dict = v->k == V_DICT;
        if (level > MAX_NEST) {
            rerr(r, off, "tojson: a value nested deeper than %d", MAX_NEST);
            return -1;
        }
        if (sb_str(b, dict ? "{" : "[")) return -1;
        for (size_t i = 0; i < v->n; i++) {
            if (i && sb_str(b, indent >= 0 ? "," : ", ")) return -1;
            if (indent >= 0) {
                if (sb_str(b, "\n")) return -1;
                for (int s = 0; s < indent * (level + 1); s++)
                    if (sb_put(b, " ", 1)) return -1;
            }
            if (dict) {
                if (v->items[2 * i]->k != V_STR) {
                    rerr(r, off, "tojson: a dict key that is not a string");
                    return -1;
                }
                if (to_json(r, b, v->items[2 * i], indent, level + 1, ascii, off) || sb_str(b, ": ")) return -1;
            }
            if (to_json(r, b, dict ? v->items[2 * i + 1] : v->items[i], indent, level + 1, ascii, off)) return -1;
        }
        if (indent >= 0 && v->n) {
            if (sb_str(b, "\n")) return -1;
            for (int s = 0; s < indent * level; s++)
                if (sb_put(b, " ", 1)) return -1;
        }
        return sb_str(b, dict ? "}" : "]");
    }
    default:
        rerr(r, off, "tojson: a %s value is not JSON", kind_name(v));
        return -1;
    }
}

/* -- unicode helpers: Python's str.isspace and code point offsets -- */

static unsigned utf8_at(const char *s, size_t n, size_t i, size_t *len) {
    unsigned char c = (unsigned char)s[i];
    int k = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    unsigned code = k ? c & (0x3Fu >> k) : c;
    size_t m = 1;
    for (; m <= (size_t)k && i + m < n && ((unsigned char)s[i + m] & 0xC0) == 0x80; m++)
        code = code << 6 | ((unsigned char)s[i + m] & 0x3F);
    *len = m;
    return code;
}

/* The start of the code point that ends at byte i (exclusive). */
static size_t utf8_back(const char *s, size_t i) {
    size_t j = i - 1;
    while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80 && i - j < 4) j--;
    return j;
}

static int py_space(unsigned code) {
    return (code >= 9 && code <= 13) || (code >= 0x1C && code <= 0x20) || code == 0x85 || code == 0xA0 || code == 0x1680 ||
           (code >= 0x2000 && code <= 0x200A) || code == 0x2028 || code == 0x2029 || code == 0x202F || code == 0x205F ||
           code == 0x3000;
}

static int in_chars(unsigned code, const jv *chars) {
    if (!chars) return py_space(code);
    for (size_t i = 0; i < chars->n;) {
        size_t l;
        if (utf8_at(chars->s, chars->n, i, &l) == code) return 1;
        i += l;
    }
    return 0;
}

/* str.strip / lstrip / rstrip (which: 1 left, 2 right, 3 both); chars NULL: whitespace. */
static jv *strip(render *r, const jv *s, const jv *chars, int which) {
    size_t a = 0, b = s->n, l;
    while ((which & 1) && a < b && in_chars(utf8_at(s->s, s->n, a, &l), chars)) a += l;
    while ((which & 2) && b > a) {
        size_t j = utf8_back(s->s, b);
        if (!in_chars(utf8_at(s->s, s->n, j, &l), chars)) break;
        b = j;
    }
    jv *v = mkval(r, V_STR);
    if (v) {
        v->s = s->s + a;
        v->n = b - a;
    }
    return v;
}

static size_t n_chars(const jv *s) {
    size_t c = 0;
    for (size_t i = 0; i < s->n; i++) c += ((unsigned char)s->s[i] & 0xC0) != 0x80;
    return c;
}

/* Byte offset of code point k (k <= n_chars). */
static size_t char_off(const jv *s, size_t k) {
    size_t i = 0;
    for (; i < s->n && k; i++)
        if (i + 1 >= s->n || ((unsigned char)s->s[i + 1] & 0xC0) != 0x80) k--;
    return i;
}

static jv *substr(render *r, const jv *s, size_t a, size_t b) {
    jv *v = mkval(r, V_STR);
    if (v) {
        v->s = s->s + a;
        v->n = b > a ? b - a : 0;
    }
    return v;
}

static jv *ascii_case(render *r, const jv *s, int mode) { /* 0 upper, 1 lower, 2 capitalize, 3 title */
    jv *v = mkstr(r, s->s, s->n);
    if (!v) return NULL;
    char *c = (char *)v->s;
    int word = 0;
    for (size_t i = 0; i < v->n; i++) {
        int alpha = (c[i] >= 'a' && c[i] <= 'z') || (c[i] >= 'A' && c[i] <= 'Z');
        int up = mode == 0 || (mode == 2 && i == 0) || (mode == 3 && !word);
        if (up && c[i] >= 'a' && c[i] <= 'z') c[i] = (char)(c[i] - 32);
        else if (!up && c[i] >= 'A' && c[i] <= 'Z') c[i] = (char)(c[i] + 32);
        word = alpha;
    }
    return v;
}

static jv *replace(render *r, const jv *s, const jv *old, const jv *new, long long count) {
    sbuf b = {.r = r};
    size_t i = 0;
    long long done = 0;
    while (i <= s->n) {
        if ((count < 0 || done < count) && old->n == 0) {
            if (sb_put(&b, new->s, new->n) || (i < s->n && sb_put(&b, s->s + i, 1))) return NULL;
            done++;
            i++;
            continue;
        }
        if ((count < 0 || done < count) && old->n && i + old->n <= s->n && memcmp(s->s + i, old->s, old->n) == 0) {
            if (sb_put(&b, new->s, new->n)) return NULL;
            i += old->n;
            done++;
            continue;
        }
        if (i < s->n && sb_put(&b, s->s + i, 1)) return NULL;
        i++;
    }
    jv *v = mkval(r, V_STR);
    if (v) {
        v->s = b.s ? b.s : "";
        v->n = b.n;
    }
    return v;
}

static jv *split(render *r, const jv *s, const jv *sep, long long maxsplit, size_t off) {
    jv *out = list_new(r, 0);
    if (!out) return NULL;
    jv **items = NULL;
    size_t n = 0, cap = 0;
#define PUSH(a, b)                                                                   \
    do {                                                                             \
        if (n == cap) {                                                              \
            size_t c_ = cap ? 2 * cap : 8;                                           \
            jv **g_ = ralloc(r, c_ * sizeof *g_);                                     \
            if (!g_) return NULL;                                                    \
            if (n) memcpy(g_, items, n * sizeof *g_);                                \
            items = g_;                                                              \
            cap = c_;                                                                \
        }                                                                            \
        if (!(items[n++] = substr(r, s, (a), (b)))) return NULL;                     \
    } while (0)
    if (sep) {
        if (sep->n == 0) return RFAIL(r, off, "split: empty separator");
        size_t start = 0;
        for (size_t i = 0; i + sep->n <= s->n;) {
            if ((maxsplit < 0 || (long long)n < maxsplit) && memcmp(s->s + i, sep->s, sep->n) == 0) {
                PUSH(start, i);
                i += sep->n;
                start = i;
            } else {
                i++;
            }
        }
        PUSH(start, s->n);
    } else {
        size_t i = 0, l;
        while (i < s->n) {
            while (i < s->n && py_space(utf8_at(s->s, s->n, i, &l))) i += l;
            if (i >= s->n) break;
            size_t start = i;
            if (maxsplit >= 0 && (long long)n >= maxsplit) {
                size_t e = s->n;
                while (e > start) {
                    size_t j = utf8_back(s->s, e);
                    if (!py_space(utf8_at(s->s, s->n, j, &l))) break;
                    e = j;
                }
                PUSH(start, e);
                break;
            }
            while (i < s->n && !py_space(utf8_at(s->s, s->n, i, &l))) i += l;
            PUSH(start, i);
        }
    }
#undef PUSH
    out->items = items;
    out->n = n;
    return out;
}

static int num(const jv *v) { return v->k == V_INT || v->k == V_BOOL || v->k == V_FLOAT; }
static double fnum(const jv *v) { return v->k == V_FLOAT ? v->f : (double)v->i; }

static int equal_at(const jv *a, const jv *b, int depth);
static int equal(const jv *a, const jv *b) { return equal_at(a, b, 0); }

/* Python's ==; past MAX_NEST levels (a namespace holding itself) unequal unless the same value. */
static int equal_at(const jv *a, const jv *b, int depth) {
    if (a == b) return 1;
    if (depth > MAX_NEST) return 0;
    if (num(a) && num(b)) return a->k == V_FLOAT || b->k == V_FLOAT ? fnum(a) == fnum(b) : a->i == b->i;
    if (a->k != b->k) return 0;
    switch (a->k) {
    case V_UNDEF: case V_NONE: return 1;
    case V_STR: return a->n == b->n && memcmp(a->s, b->s, a->n) == 0;
    case V_LIST:
        if (a->n != b->n) return 0;
        for (size_t i = 0; i < a->n; i++)
            if (!equal_at(a->items[i], b->items[i], depth + 1)) return 0;
        return 1;
    case V_DICT:
        if (a->n != b->n) return 0;
        for (size_t i = 0; i < a->n; i++) {
            jv *k = a->items[2 * i], *o = k->k == V_STR ? dict_get(b, k->s, k->n) : NULL;
            if (!o || !equal_at(a->items[2 * i + 1], o, depth + 1)) return 0;
        }
        return 1;
    default: return a == b;
    }
}

static jv *eval(render *r, const node *n);

static jv *arg(render *r, const node *n, size_t i, const char *kw) {
    if (i < n->nargs) return eval(r, n->args[i]);
    for (size_t k = 0; kw && k < n->nkw; k++)
        if (strcmp(n->kwn[k], kw) == 0) return eval(r, n->kwv[k]);
    return NULL;
}

static jv *need(render *r, const node *n, jv *v, vkind k, const char *what) {
    if (r->failed) return NULL;
    if (!v) return RFAIL(r, n->off, "%.*s: missing %s", (int)n->nlen, n->name, what);
    if (v->k != k && !(k == V_INT && v->k == V_BOOL))
        return RFAIL(r, n->off, "%.*s: %s must be a %s, got a %s", (int)n->nlen, n->name, what,
                     kind_name(&(jv){.k = k}), kind_name(v));
    return v;
}

static int test(render *r, const node *n, jv *v) {
    const char *t = n->name;
    size_t l = n->nlen;
#define IS(s) (l == strlen(s) && memcmp(t, s, l) == 0)
    if (IS("defined")) return v->k != V_UNDEF;
    if (IS("undefined")) return v->k == V_UNDEF;
    if (IS("none")) return v->k == V_NONE;
    if (IS("string")) return v->k == V_STR;
    if (IS("number")) return num(v);
    if (IS("integer")) return v->k == V_INT;
    if (IS("float")) return v->k == V_FLOAT;
    if (IS("boolean")) return v->k == V_BOOL;
    if (IS("true")) return v->k == V_BOOL && v->i;
    if (IS("false")) return v->k == V_BOOL && !v->i;
    if (IS("mapping")) return v->k == V_DICT;
    if (IS("iterable") || IS("sequence")) return v->k == V_STR || v->k == V_LIST || v->k == V_DICT;
    if (IS("odd") || IS("even")) {
        if (v->k != V_INT) return rerr(r, n->off, "test '%.*s' of a %s", (int)l, t, kind_name(v)), 0;
        return (int)(v->i & 1) == IS("odd");
    }
    jv *o = arg(r, n, 0, "value");
    if (!o) return rerr(r, n->off, "test '%.*s' needs a value to compare with", (int)l, t), 0;
    return IS("ne") ? !equal(v, o) : equal(v, o);
#undef IS
}

/* Items of a value being iterated: a list's items, a dict's keys, a string's characters. */
static jv *as_list(render *r, jv *v, size_t off) {
    if (v->k == V_LIST) return v;
    if (v->k == V_UNDEF) return list_new(r, 0);
    if (v->k == V_DICT) {
        jv *l = list_new(r, v->n);
        for (size_t i = 0; l && i < v->n; i++) l->items[i] = v->items[2 * i];
        return l;
    }
    if (v->k == V_STR) {
        jv *l = list_new(r, n_chars(v));
        size_t i = 0, k = 0, len;
        while (l && i < v->n) {
            utf8_at(v->s, v->n, i, &len);
            if (!(l->items[k++] = substr(r, v, i, i + len))) return NULL;
            i += len;
        }
        return l;
    }
    return RFAIL(r, off, "a %s value is not iterable", kind_name(v));
}

static jv *filter(render *r, const node *n, jv *v) {
    const char *f = n->name;
    size_t l = n->nlen;
#define IS(s) (l == strlen(s) && memcmp(f, s, l) == 0)
    if (IS("default") || IS("d")) {
        jv *d = arg(r, n, 0, "default_value"), *bo = arg(r, n, 1, "boolean");
        if (r->failed) return NULL;
        int use = v->k == V_UNDEF || (bo && truthy(bo) && !truthy(v));
        return use ? (d ? d : mkstr(r, "", 0)) : v;
    }
    if (IS("length") || IS("count")) {
        if (v->k == V_STR) return mkint(r, (long long)n_chars(v));
        if (v->k == V_LIST || v->k == V_DICT || v->k == V_UNDEF) return mkint(r, (long long)v->n);
        return RFAIL(r, n->off, "filter 'length' of a %s", kind_name(v));
    }
    if (IS("tojson")) {
        jv *ind = arg(r, n, 0, "indent"), *asc = arg(r, n, 1, "ensure_ascii");
        if (r->failed) return NULL;
        if (ind && ind->k != V_INT && ind->k != V_NONE) return RFAIL(r, n->off, "tojson: indent must be an integer");
        sbuf b = {.r = r};
        if (to_json(r, &b, v, ind && ind->k == V_INT ? (int)(ind->i < 0 ? 0 : ind->i > 64 ? 64 : ind->i) : -1, 0,
                    asc && truthy(asc), n->off))
            return NULL;
        jv *s = mkval(r, V_STR);
        if (s) {
            s->s = b.s ? b.s : "";
            s->n = b.n;
        }
        return s;
    }
    if (IS("first") || IS("last")) {
        jv *list = as_list(r, v, n->off);
        if (!list) return NULL;
        return list->n ? list->items[IS("first") ? 0 : list->n - 1] : &v_undef;
    }
    if (IS("join")) {
        jv *sep = arg(r, n, 0, "d"), *list = as_list(r, v, n->off);
        if (!list || (sep && !(sep = str_of(r, sep)))) return NULL;
        sbuf b = {.r = r};
        for (size_t i = 0; i < list->n; i++)
            if ((i && sep && sb_put(&b, sep->s, sep->n)) || to_str(&b, list->items[i], 0)) return NULL;
        jv *s = mkval(r, V_STR);
        if (s) {
            s->s = b.s ? b.s : "";
            s->n = b.n;
        }
        return s;
    }
    if (IS("list")) return as_list(r, v, n->off);
    if (IS("items")) {
        if (v->k != V_DICT) return RFAIL(r, n->off, "filter 'items' of a %s", kind_name(v));
        jv *list = list_new(r, v->n);
        for (size_t i = 0; list && i < v->n; i++) {
            jv *pair = list_new(r, 2);
            if (!pair) return NULL;
            pair->items[0] = v->items[2 * i];
            pair->items[1] = v->items[2 * i + 1];
            pair->tuple = 1;
            list->items[i] = pair;
        }
        return list;
    }
    if (IS("reject") || IS("select")) {
        jv *list = as_list(r, v, n->off), *tn = need(r, n, arg(r, n, 0, NULL), V_STR, "the test name");
        if (!list || !tn) return NULL;
        if (!name_in(tn->s, tn->n, TESTS)) return RFAIL(r, n->off, "unsupported test '%.*s'", (int)tn->n, tn->s);
        node t = {.kind = E_TEST, .off = n->off, .name = tn->s, .nlen = tn->n};
        if (n->nargs > 1) {
            t.args = n->args + 1;
            t.nargs = n->nargs - 1;
        }
        jv *out = list_new(r, list->n);
        if (!out) return NULL;
        out->n = 0;
        for (size_t i = 0; i < list->n; i++) {
            int ok = test(r, &t, list->items[i]);
            if (r->failed) return NULL;
            if (ok == IS("select")) out->items[out->n++] = list->items[i];
        }
        return out;
    }
    if (IS("int") || IS("float") || IS("abs")) {
        if (IS("abs")) {
            if (v->k == V_FLOAT) {
                jv *o = mkval(r, V_FLOAT);
                if (o) o->f = fabs(v->f);
                return o;
            }
            if (v->k != V_INT && v->k != V_BOOL) return RFAIL(r, n->off, "filter 'abs' of a %s", kind_name(v));
            return mkint(r, v->i < 0 ? -v->i : v->i);
        }
        double d = 0;
        if (num(v)) d = fnum(v);
        else if (v->k == V_STR) {
            char buf[64];
            size_t k = v->n < sizeof buf - 1 ? v->n : sizeof buf - 1;
            memcpy(buf, v->s, k);
            buf[k] = 0;
            d = strtod(buf, NULL);
        }
        if (IS("int")) return mkint(r, isfinite(d) && fabs(d) < 9e18 ? (long long)d : 0);
        jv *o = mkval(r, V_FLOAT);
        if (o) o->f = d;
        return o;
    }
    /* string filters */
    jv *s = str_of(r, v);
    if (!s) return NULL;
    if (IS("string")) return s;
    if (IS("trim")) {
        jv *chars = arg(r, n, 0, "chars");
        if (chars && !(chars = need(r, n, chars, V_STR, "chars"))) return NULL;
        return r->failed ? NULL : strip(r, s, chars, 3);
    }
    if (IS("upper")) return ascii_case(r, s, 0);
    if (IS("lower")) return ascii_case(r, s, 1);
    if (IS("capitalize")) return ascii_case(r, s, 2);
    if (IS("title")) return ascii_case(r, s, 3);
    if (IS("replace")) {
        jv *o = need(r, n, arg(r, n, 0, "old"), V_STR, "old"), *w = need(r, n, arg(r, n, 1, "new"), V_STR, "new");
        jv *c = arg(r, n, 2, "count");
        if (!o || !w || r->failed) return NULL;
        return replace(r, s, o, w, c && c->k == V_INT ? c->i : -1);
    }
#undef IS
    return RFAIL(r, n->off, "unsupported filter '%.*s'", (int)l, f);
}

static jv *call_method(render *r, const node *call, jv *obj) {
    const node *m = call->a;
    const char *f = m->name;
    size_t l = m->nlen;
    node nm = *call;   /* for messages: the method's name */
    nm.name = f;
    nm.nlen = l;
#define IS(s) (l == strlen(s) && memcmp(f, s, l) == 0)
    if (obj->k == V_DICT) {
        if (IS("get")) {
            jv *k = arg(r, call, 0, NULL), *d = arg(r, call, 1, NULL);
            if (r->failed) return NULL;
            if (!k) return RFAIL(r, call->off, "get: missing the key");
            jv *v = k->k == V_STR ? dict_get(obj, k->s, k->n) : NULL;
            return v ? v : d ? d : &v_none;
        }
        if (IS("items")) {
            node f2 = nm;
            f2.name = "items";
            f2.nlen = 5;
            return filter(r, &f2, obj);
        }
        if (IS("keys") || IS("values")) {
            jv *list = list_new(r, obj->n);
            for (size_t i = 0; list && i < obj->n; i++) list->items[i] = obj->items[2 * i + IS("values")];
            return list;
        }
    }
    if (obj->k == V_STR) {
        if (IS("strip") || IS("lstrip") || IS("rstrip")) {
            jv *chars = arg(r, call, 0, "chars");
            if (r->failed) return NULL;
            if (chars && chars->k == V_NONE) chars = NULL;
            if (chars && !need(r, &nm, chars, V_STR, "chars")) return NULL;
            return strip(r, obj, chars, IS("strip") ? 3 : IS("lstrip") ? 1 : 2);
        }
        if (IS("startswith") || IS("endswith")) {
            jv *x = need(r, &nm, arg(r, call, 0, NULL), V_STR, "the prefix");
            if (!x) return NULL;
            if (x->n > obj->n) return &v_false;
            return mkbool(memcmp(IS("startswith") ? obj->s : obj->s + obj->n - x->n, x->s, x->n) == 0);
        }
        if (IS("split")) {
            jv *sep = arg(r, call, 0, "sep"), *mx = arg(r, call, 1, "maxsplit");
            if (r->failed) return NULL;
            if (sep && sep->k == V_NONE) sep = NULL;
            if (sep && !need(r, &nm, sep, V_STR, "sep")) return NULL;
            if (mx && !need(r, &nm, mx, V_INT, "maxsplit")) return NULL;
            return split(r, obj, sep, mx ? mx->i : -1, call->off);
        }
        if (IS("upper")) return ascii_case(r, obj, 0);
        if (IS("lower")) return ascii_case(r, obj, 1);
        if (IS("capitalize")) return ascii_case(r, obj, 2);
        if (IS("title")) return ascii_case(r, obj, 3);
        if (IS("replace")) {
            jv *o = need(r, &nm, arg(r, call, 0, NULL), V_STR, "old");
            jv *w = need(r, &nm, arg(r, call, 1, NULL), V_STR, "new");
            jv *c = arg(r, call, 2, NULL);
            if (!o || !w || r->failed) return NULL;
            return replace(r, obj, o, w, c && c->k == V_INT ? c->i : -1);
        }
    }
#undef IS
    if (obj->k == V_UNDEF) return RFAIL(r, call->off, "'%.*s' of an undefined value", (int)l, f);
    return RFAIL(r, call->off, "a %s has no method '%.*s'", kind_name(obj), (int)l, f);
}

static jv *call(render *r, const node *n) {
    const node *c = n->a;
    if (c->kind == E_ATTR) {
        jv *obj = eval(r, c->a);
        return obj ? call_method(r, n, obj) : NULL;
    }
#define IS(s) (c->nlen == strlen(s) && memcmp(c->name, s, c->nlen) == 0)
    if (IS("raise_exception")) {
        jv *m = arg(r, n, 0, NULL);
        if (m && !(m = str_of(r, m))) return NULL;
        return RFAIL(r, n->off, "the template raised an exception: %.*s", m ? (int)m->n : 0, m ? m->s : "");
    }
    if (IS("namespace")) {
        jv *ns = mkval(r, V_NS);
        if (!ns) return NULL;
        if (n->nargs) return RFAIL(r, n->off, "namespace() takes keyword arguments only");
        for (size_t k = 0; k < n->nkw; k++) {
            jv *key = mkstr(r, n->kwn[k], strlen(n->kwn[k])), *val = eval(r, n->kwv[k]);
            if (!key || !val || dict_set(r, ns, key, val)) return NULL;
        }
        return ns;
    }
    if (IS("range")) {
        long long a[3] = {0, 0, 1};
        if (n->nargs < 1 || n->nargs > 3 || n->nkw) return RFAIL(r, n->off, "range() takes 1 to 3 integers");
        for (size_t i = 0; i < n->nargs; i++) {
            jv *v = eval(r, n->args[i]);
            if (!v) return NULL;
            if (v->k != V_INT) return RFAIL(r, n->off, "range() takes integers, got a %s", kind_name(v));
            a[n->nargs == 1 ? 1 : i] = v->i;
        }
        if (a[2] == 0) return RFAIL(r, n->off, "range() step must not be zero");
        long long cnt = a[2] > 0 ? (a[1] - a[0] + a[2] - 1) / a[2] : (a[0] - a[1] - a[2] - 1) / -a[2];
        if (cnt < 0) cnt = 0;
        if (cnt > 1000000) return RFAIL(r, n->off, "range() of %lld items; at most 1000000", cnt);
        jv *l = list_new(r, (size_t)cnt);
        for (long long i = 0; l && i < cnt; i++)
            if (!(l->items[i] = mkint(r, a[0] + i * a[2]))) return NULL;
        return l;
    }
#undef IS
    return RFAIL(r, n->off, "unsupported function '%.*s'", (int)c->nlen, c->name);
}

static jv *lookup(render *r, const char *s, size_t n) {
    for (frame *f = r->top; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (f->lens[i] == n && memcmp(f->names[i], s, n) == 0) return f->vals[i];
    return &v_undef;
}

static int assign(render *r, frame *f, const char *s, size_t n, jv *v) {
    for (size_t i = 0; i < f->n; i++)
        if (f->lens[i] == n && memcmp(f->names[i], s, n) == 0) {
            f->vals[i] = v;
            return 0;
        }
    if (f->n == f->cap) {
        size_t c = f->cap ? 2 * f->cap : 16;
        const char **nn = ralloc(r, c * sizeof *nn);
        size_t *ll = ralloc(r, c * sizeof *ll);
        jv **vv = ralloc(r, c * sizeof *vv);
        if (!nn || !ll || !vv) return -1;
        if (f->n) {
            memcpy(nn, f->names, f->n * sizeof *nn);
            memcpy(ll, f->lens, f->n * sizeof *ll);
            memcpy(vv, f->vals, f->n * sizeof *vv);
        }
        f->names = nn;
        f->lens = ll;
        f->vals = vv;
        f->cap = c;
    }
    f->names[f->n] = s;
    f->lens[f->n] = n;
    f->vals[f->n++] = v;
    return 0;
}

static jv *subscript(render *r, const node *n, jv *obj, jv *key) {
    if (obj->k == V_DICT || obj->k == V_NS) {
        jv *v = key->k == V_STR ? dict_get(obj, key->s, key->n) : NULL;
        return v ? v : &v_undef;
    }
    if ((obj->k == V_LIST || obj->k == V_STR) && (key->k == V_INT || key->k == V_BOOL)) {
        long long len = obj->k == V_LIST ? (long long)obj->n : (long long)n_chars(obj), i = key->i;
        if (i < 0) i += len;
        if (i < 0 || i >= len) return &v_undef;   /* as Jinja's getitem: undefined, not an error */
        if (obj->k == V_LIST) return obj->items[i];
        return substr(r, obj, char_off(obj, (size_t)i), char_off(obj, (size_t)i + 1));
    }
    if (obj->k == V_UNDEF) return RFAIL(r, n->off, "a subscript of an undefined value");
    return &v_undef;
}

static jv *slice(render *r, const node *n) {
    jv *obj = eval(r, n->a);
    if (!obj) return NULL;
    long long part[3] = {0, 0, 1};
    int given[3] = {0, 0, 0};
    const node *pn[3] = {n->b, n->c, n->args[0]};
    for (int k = 0; k < 3; k++)
        if (pn[k]) {
            jv *v = eval(r, pn[k]);
            if (!v) return NULL;
            if (v->k == V_NONE) continue;
            if (v->k != V_INT) return RFAIL(r, n->off, "slice indices must be integers, got a %s", kind_name(v));
            part[k] = v->i;
            given[k] = 1;
        }
    if (obj->k != V_LIST && obj->k != V_STR) return RFAIL(r, n->off, "a slice of a %s", kind_name(obj));
    long long len = obj->k == V_LIST ? (long long)obj->n : (long long)n_chars(obj), st = part[2];
    if (st == 0) return RFAIL(r, n->off, "slice step must not be zero");
    long long a, b;
    /* Python's slice.indices */
    if (!given[0]) a = st > 0 ? 0 : len - 1;
    else {
        a = part[0] < 0 ? part[0] + len : part[0];
        if (a < 0) a = st > 0 ? 0 : -1;
        if (a >= len) a = st > 0 ? len : len - 1;
    }
    if (!given[1]) b = st > 0 ? len : -1;
    else {
        b = part[1] < 0 ? part[1] + len : part[1];
        if (b < 0) b = st > 0 ? 0 : -1;
        if (b >= len) b = st > 0 ? len : len - 1;
    }
    long long cnt = st > 0 ? (b > a ? (b - a + st - 1) / st : 0) : (a > b ? (a - b - st - 1) / -st : 0);
    if (obj->k == V_LIST) {
        jv *l = list_new(r, (size_t)cnt);
        for (long long i = 0; l && i < cnt; i++) l->items[i] = obj->items[a + i * st];
        return l;
    }
    if (st == 1) return substr(r, obj, char_off(obj, (size_t)a), char_off(obj, (size_t)b));
    sbuf sb = {.r = r};
    for (long long i = 0; i < cnt; i++) {
        size_t x = char_off(obj, (size_t)(a + i * st)), y = char_off(obj, (size_t)(a + i * st + 1));
        if (sb_put(&sb, obj->s + x, y - x)) return NULL;
    }
    jv *s = mkval(r, V_STR);
    if (s) {
        s->s = sb.s ? sb.s : "";
        s->n = sb.n;
    }
    return s;
}

static jv *binop(render *r, const node *n, jv *a, jv *b) {
    switch (n->op) {
    case OP_EQ: return mkbool(equal(a, b));
    case OP_NE: return mkbool(!equal(a, b));
    case OP_IN:
    case OP_NOTIN: {
        int in = 0;
        if (b->k == V_STR) {
            if (a->k != V_STR) return RFAIL(r, n->off, "'in <string>' needs a string on the left, got a %s",
                                            kind_name(a));
            for (size_t i = 0; !in && i + a->n <= b->n; i++) in = memcmp(b->s + i, a->s, a->n) == 0;
        } else if (b->k == V_LIST) {
            for (size_t i = 0; !in && i < b->n; i++) in = equal(a, b->items[i]);
        } else if (b->k == V_DICT || b->k == V_NS) {
            in = a->k == V_STR && dict_get(b, a->s, a->n) != NULL;
        } else if (b->k != V_UNDEF) {
            return RFAIL(r, n->off, "'in' a %s", kind_name(b));
        }
        return mkbool(n->op == OP_IN ? in : !in);
    }
    case OP_CAT: {
        jv *x = str_of(r, a), *y = x ? str_of(r, b) : NULL;
        if (!y) return NULL;
        jv *s = mkval(r, V_STR);
        char *c = s ? ralloc(r, x->n + y->n + 1) : NULL;
        if (!c) return NULL;
        if (x->n) memcpy(c, x->s, x->n);
        if (y->n) memcpy(c + x->n, y->s, y->n);
        s->s = c;
        s->n = x->n + y->n;
        return s;
    }
    default: break;
    }
    if (n->op == OP_ADD && a->k == V_STR && b->k == V_STR) {
        jv *s = mkval(r, V_STR);
        char *c = s ? ralloc(r, a->n + b->n + 1) : NULL;
        if (!c) return NULL;
        if (a->n) memcpy(c, a->s, a->n);
        if (b->n) memcpy(c + a->n, b->s, b->n);
        s->s = c;
        s->n = a->n + b->n;
        return s;
    }
    if (n->op == OP_ADD && a->k == V_LIST && b->k == V_LIST) {
        jv *l = list_new(r, a->n + b->n);
        if (!l) return NULL;
        if (a->n) memcpy(l->items, a->items, a->n * sizeof(jv *));
        if (b->n) memcpy(l->items + a->n, b->items, b->n * sizeof(jv *));
        return l;
    }
    if ((a->k == V_STR && b->k == V_STR) && n->op >= OP_LT && n->op <= OP_GE) {
        size_t m = a->n < b->n ? a->n : b->n;
        int c = memcmp(a->s, b->s, m);
        if (c == 0) c = a->n < b->n ? -1 : a->n > b->n;
        return mkbool(n->op == OP_LT ? c < 0 : n->op == OP_LE ? c <= 0 : n->op == OP_GT ? c > 0 : c >= 0);
    }
    static const char *opname[] = {"+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", "<=", ">", ">=", "in",
                                   "not in"};
    if (!num(a) || !num(b))
        return RFAIL(r, n->off, "unsupported operand types for %s: %s and %s", opname[n->op], kind_name(a),
                     kind_name(b));
    int fl = a->k == V_FLOAT || b->k == V_FLOAT;
    double x = fnum(a), y = fnum(b);
    long long i = a->i, j = b->i;
    switch (n->op) {
    case OP_LT: return mkbool(fl ? x < y : i < j);
    case OP_LE: return mkbool(fl ? x <= y : i <= j);
    case OP_GT: return mkbool(fl ? x > y : i > j);
    case OP_GE: return mkbool(fl ? x >= y : i >= j);
    default: break;
    }
    if ((n->op == OP_DIV || n->op == OP_FLOORDIV || n->op == OP_MOD) && (fl ? y == 0 : j == 0))
        return RFAIL(r, n->off, "division by zero");
    jv *v = mkval(r, fl || n->op == OP_DIV ? V_FLOAT : V_INT);
    if (!v) return NULL;
    switch (n->op) {
    case OP_ADD: if (fl) v->f = x + y; else v->i = (long long)((unsigned long long)i + (unsigned long long)j); break;
    case OP_SUB: if (fl) v->f = x - y; else v->i = (long long)((unsigned long long)i - (unsigned long long)j); break;
    case OP_MUL: if (fl) v->f = x * y; else v->i = (long long)((unsigned long long)i * (unsigned long long)j); break;
    case OP_DIV: v->f = x / y; break;
    case OP_FLOORDIV:
        if (fl) v->f = floor(x / y);
        else if (i == LLONG_MIN && j == -1) v->i = i;
        else v->i = i / j - ((i % j != 0) && ((i < 0) != (j < 0)));
        break;
    case OP_MOD:
        if (fl) v->f = x - y * floor(x / y);
        else if (j == -1) v->i = 0;
        else v->i = ((i % j) + j) % j;
        break;
    default: break;
    }
    return v;
}

static jv *eval(render *r, const node *n) {
    if (r->failed) return NULL;
    if (++r->steps > MAX_STEPS) return RFAIL(r, n->off, "the template takes more than %ld steps", MAX_STEPS);
    switch (n->kind) {
    case E_LIT: return n->lit;
    case E_NAME: return lookup(r, n->name, n->nlen);
    case E_ATTR: {
        jv *o = eval(r, n->a);
        if (!o) return NULL;
        if (o->k == V_DICT || o->k == V_NS) {
            jv *v = dict_get(o, n->name, n->nlen);
            return v ? v : &v_undef;
        }
        if (o->k == V_UNDEF) return RFAIL(r, n->off, "'.%.*s' of an undefined value", (int)n->nlen, n->name);
        return &v_undef;
    }
    case E_INDEX: {
        jv *o = eval(r, n->a), *k = o ? eval(r, n->b) : NULL;
        return k ? subscript(r, n, o, k) : NULL;
    }
    case E_SLICE: return slice(r, n);
    case E_CALL: return call(r, n);
    case E_FILTER: {
        jv *v = eval(r, n->a);
        return v ? filter(r, n, v) : NULL;
    }
    case E_TEST: {
        jv *v = eval(r, n->a);
        if (!v) return NULL;
        int t = test(r, n, v);
        return r->failed ? NULL : mkbool(n->neg ? !t : t);
    }
    case E_NEG: {
        jv *v = eval(r, n->a);
        if (!v) return NULL;
        if (v->k == V_FLOAT) {
            jv *o = mkval(r, V_FLOAT);
            if (o) o->f = -v->f;
            return o;
        }
        if (v->k != V_INT && v->k != V_BOOL) return RFAIL(r, n->off, "unary '-' of a %s", kind_name(v));
        return mkint(r, (long long)(0ULL - (unsigned long long)v->i));
    }
    case E_NOT: {
        jv *v = eval(r, n->a);
        return v ? mkbool(!truthy(v)) : NULL;
    }
    case E_AND:
    case E_OR: {
        jv *a = eval(r, n->a);
        if (!a) return NULL;
        if (truthy(a) == (n->kind == E_OR)) return a;
        return eval(r, n->b);
    }
    case E_BIN: {
        jv *a = eval(r, n->a), *b = a ? eval(r, n->b) : NULL;
        return b ? binop(r, n, a, b) : NULL;
    }
    case E_COND: {
        jv *c = eval(r, n->b);
        if (!c) return NULL;
        if (truthy(c)) return eval(r, n->a);
        return n->c ? eval(r, n->c) : &v_undef;
    }
    case E_LIST: {
        jv *l = list_new(r, n->nargs);
        for (size_t i = 0; l && i < n->nargs; i++)
            if (!(l->items[i] = eval(r, n->args[i]))) return NULL;
        return l;
    }
    case E_DICT: {
        jv *d = mkval(r, V_DICT);
        for (size_t i = 0; d && i + 1 < n->nargs; i += 2) {
            jv *k = eval(r, n->args[i]), *v = k ? eval(r, n->args[i + 1]) : NULL;
            if (!v) return NULL;
            if (dict_set(r, d, k, v)) return NULL;
        }
        if (d) d->cap = 0;   /* an ordinary dict: dict_set grew it, nothing else will */
        return d;
    }
    default: return RFAIL(r, n->off, "internal: not an expression");
    }
}

static int emit(render *r, const char *s, size_t n) {
    if (r->len + n + 1 > r->cap) {
        size_t c = r->cap ? r->cap : 4096;
        while (c < r->len + n + 1) c *= 2;
        if (c > MAX_BYTES) {
            rerr(r, 0, "the output is longer than %zu MiB", MAX_BYTES >> 20);
            return -1;
        }
        char *g = realloc(r->out, c);
        if (!g) {
            rerr(r, 0, "out of memory");
            return -1;
        }
        r->out = g;
        r->cap = c;
    }
    if (n) memcpy(r->out + r->len, s, n);
    r->len += n;
    r->out[r->len] = 0;
    return 0;
}

static int exec(render *r, const node *body);

static jv *loop_var(render *r, jv *list, size_t i) {
    jv *d = mkval(r, V_DICT);
    if (!d) return NULL;
    size_t n = list->n;
    struct { const char *k; jv *v; } f[] = {
        {"index", mkint(r, (long long)i + 1)}, {"index0", mkint(r, (long long)i)},
        {"revindex", mkint(r, (long long)(n - i))}, {"revindex0", mkint(r, (long long)(n - i - 1))},
        {"first", mkbool(i == 0)}, {"last", mkbool(i + 1 == n)}, {"length", mkint(r, (long long)n)},
        {"previtem", i ? list->items[i - 1] : &v_undef}, {"nextitem", i + 1 < n ? list->items[i + 1] : &v_undef}};
    for (size_t k = 0; k < sizeof f / sizeof *f; k++) {
        jv *key = mkstr(r, f[k].k, strlen(f[k].k));
        if (!key || !f[k].v || dict_set(r, d, key, f[k].v)) return NULL;
    }
    return d;
}

static int exec_stmt(render *r, const node *n) {
    if (++r->steps > MAX_STEPS) {
        rerr(r, n->off, "the template takes more than %ld steps", MAX_STEPS);
        return -1;
    }
    switch (n->kind) {
    case S_TEXT: return emit(r, n->lit->s, n->lit->n);
    case S_OUT: {
        jv *v = eval(r, n->a);
        if (!v) return -1;
        sbuf b = {.r = r};
        if (to_str(&b, v, 0)) return -1;
        return emit(r, b.s, b.n);
    }
    case S_IF:
        for (; n && n->kind == S_IF; n = n->c) {
            jv *c = eval(r, n->a);
            if (!c) return -1;
            if (truthy(c)) return exec(r, n->b);
        }
        return n ? exec(r, n) : 0;
    case S_FOR: {
        jv *it = eval(r, n->a), *list = it ? as_list(r, it, n->a->off) : NULL;
        if (!list) return -1;
        frame f = {.parent = r->top};
        r->top = &f;
        int rc = 0;
        for (size_t i = 0; i < list->n && !rc; i++) {
            jv *lv = loop_var(r, list, i), *item = list->items[i];
            if (!lv || assign(r, &f, "loop", 4, lv)) {
                rc = -1;
                break;
            }
            if (!n->nkw) {
                rc = assign(r, &f, n->name, n->nlen, item);
            } else if (item->k != V_LIST || item->n != n->nkw) {   /* for a, b in pairs: unpack each */
                rerr(r, n->off, "cannot unpack a %s into %zu loop variables", item->k == V_LIST ? "list of another "
                     "length" : kind_name(item), n->nkw);
                rc = -1;
            } else {
                for (size_t k = 0; k < n->nkw && !rc; k++)
                    rc = assign(r, &f, n->kwn[k], strlen(n->kwn[k]), item->items[k]);
            }
            if (rc) break;
            rc = exec(r, n->b);
            if (r->cont) r->cont = 0;
            if (r->brk) {
                r->brk = 0;
                break;
            }
        }
        r->top = f.parent;
        return rc;
    }
    case S_SET: {
        jv *v = eval(r, n->a);
        if (!v) return -1;
        if (!n->attr) return assign(r, r->top, n->name, n->nlen, v);
        jv *ns = lookup(r, n->name, n->nlen);
        if (ns->k != V_NS) {
            rerr(r, n->off, "set %.*s.%.*s: %.*s is a %s, not a namespace", (int)n->nlen, n->name, (int)n->alen,
                 n->attr, (int)n->nlen, n->name, kind_name(ns));
            return -1;
        }
        jv *key = mkstr(r, n->attr, n->alen);
        return key ? dict_set(r, ns, key, v) : -1;
    }
    case S_BREAK: r->brk = 1; return 0;
    case S_CONTINUE: r->cont = 1; return 0;
    case S_GEN: {
        size_t start = r->len;
        if (exec(r, n->b)) return -1;
        if (r->nspans == r->scap) {
            size_t c = r->scap ? 2 * r->scap : 16;
            jinja_span *g = realloc(r->spans, c * sizeof *g);
            if (!g) {
                rerr(r, n->off, "out of memory");
                return -1;
            }
            r->spans = g;
            r->scap = c;
        }
        r->spans[r->nspans++] = (jinja_span){start, r->len};
        return 0;
    }
    case S_BODY: return exec(r, n);
    default: rerr(r, n->off, "internal: not a statement"); return -1;
    }
}

static int exec(render *r, const node *body) {
    for (size_t i = 0; i < body->nargs; i++) {
        if (exec_stmt(r, body->args[i])) return -1;
        if (r->brk || r->cont) return 0;
    }
    return 0;
}

ct_status jinja_render(const jinja_template *t, const json_t *vars, char **out, size_t *len, jinja_span **spans,
                       size_t *nspans) {
    *out = NULL;
    *len = 0;
    *spans = NULL;
    *nspans = 0;
    render r = {.t = t};
    frame globals = {0};
    r.top = &globals;
    const char *k;
    json_t *x;
    if (json_is_object(vars))
        json_object_foreach((json_t *)vars, k, x) {
            jv *v = from_json(&r, x);
            if (!v || assign(&r, &globals, k, strlen(k), v)) break;
        }
    if (!r.failed && emit(&r, "", 0) == 0) exec(&r, t->root);
    arena_free(&r.mem);
    if (r.failed) {
        free(r.out);
        free(r.spans);
        return CT_ERR_INVALID;
    }
    *out = r.out;
    *len = r.len;
    *spans = r.spans;
    *nspans = r.nspans;
    return CT_OK;
}
