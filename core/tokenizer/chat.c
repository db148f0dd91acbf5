/* chat.c: conversations through a chat template into token ids and the assistant-token mask (what
 * counts and why: chat.h). */
#include "tokenizer/chat.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokenizer/jinja.h"

/* Llama 3's template (Meta's, as in Llama 3 Instruct's tokenizer_config.json) with the assistant's
 * content and <|eot_id|> in a generation block. */
static const char BUILTIN_LLAMA3[] =
    "{{- bos_token }}\n"
    "{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}\n"
    "    {%- if message['role'] == 'assistant' %}\n"
    "        {%- generation %}\n"
    "        {{- message['content'] | trim + '<|eot_id|>' }}\n"
    "        {%- endgeneration %}\n"
    "    {%- else %}\n"
    "        {{- message['content'] | trim + '<|eot_id|>' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n";

/* ChatML (Qwen2, Qwen2.5, Qwen3 without reasoning): the assistant's content and <|im_end|> counted,
 * the newline after it not. */
static const char BUILTIN_CHATML[] =
    "{%- for message in messages %}\n"
    "    {{- '<|im_start|>' + message['role'] + '\\n' }}\n"
    "    {%- if message['role'] == 'assistant' %}\n"
    "        {%- generation %}\n"
    "        {{- message['content'] + '<|im_end|>' }}\n"
    "        {%- endgeneration %}\n"
    "        {{- '\\n' }}\n"
    "    {%- else %}\n"
    "        {{- message['content'] + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n";

struct chat_template {
    jinja_template *tpl;
    char *origin;
    char *bos, *eos;   /* the tokens' text, NULL when the tokenizer has none */
};

void chat_template_free(chat_template *t) {
    if (!t) return;
    jinja_free(t->tpl);
    free(t->origin);
    free(t->bos);
    free(t->eos);
    free(t);
}

const char *chat_template_origin(const chat_template *t) { return t->origin; }

static char *token_text(const ct_tokenizer *tok, int id) {
    size_t n;
    const char *s = id >= 0 ? tokenizer_token_bytes(tok, id, &n) : NULL;
    if (!s) return NULL;
    char *c = malloc(n + 1);
    if (c) {
        memcpy(c, s, n);
        c[n] = 0;
    }
    return c;
}

/* tokenizer_config.json beside (or in) the tokenizer's path. */
static char *config_path(const char *tokenizer_path) {
    struct stat st;
    char buf[PATH_MAX];
    if (stat(tokenizer_path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(buf, sizeof buf, "%s/tokenizer_config.json", tokenizer_path);
    } else {
        const char *slash = strrchr(tokenizer_path, '/');
        if (slash)
            snprintf(buf, sizeof buf, "%.*s/tokenizer_config.json", (int)(slash - tokenizer_path), tokenizer_path);
        else snprintf(buf, sizeof buf, "tokenizer_config.json");
    }
    return strdup(buf);
}

/* The chat_template of a tokenizer_config.json: a string, or a list of {name, template} (the one named
 * "default"). *src is malloc'd. */
static ct_status config_template(const char *path, char **src, size_t *len) {
    json_error_t je;
    json_t *cfg = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!cfg) {
        if (errno == ENOENT || strstr(je.text, "unable to open"))
            return ct_fail(CT_ERR_INVALID, "%s: cannot read it (%s); name a template with --chat-template %s or "
                           "a file", path, je.text, CHAT_BUILTINS);
        return ct_fail(CT_ERR_INVALID, "%s:%d:%d: invalid JSON: %s", path, je.line, je.column, je.text);
    }
    json_t *t = json_object_get(cfg, "chat_template");
    if (json_is_array(t)) {
        size_t i;
        json_t *item, *found = NULL;
        json_array_foreach(t, i, item) {
            if (json_is_string(json_object_get(item, "name")) &&
                strcmp(json_string_value(json_object_get(item, "name")), "default") == 0)
                found = json_object_get(item, "template");
        }
        t = found;
    }
    ct_status rc = CT_OK;
    if (!json_is_string(t)) {
        rc = ct_fail(CT_ERR_INVALID, "%s: chat_template: %s; name a template with --chat-template %s or a file",
                     path, json_object_get(cfg, "chat_template") ? "expected a string (or a list holding one named "
                     "\"default\")" : "missing", CHAT_BUILTINS);
    } else {
        *len = json_string_length(t);
        if (!(*src = malloc(*len + 1))) rc = ct_fail(CT_ERR_NOMEM, "%s: out of memory", path);
        else memcpy(*src, json_string_value(t), *len + 1);
    }
    json_decref(cfg);
    return rc;
}

static ct_status read_file(const char *path, char **src, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return ct_fail(CT_ERR_INVALID, "--chat-template %s: not a built-in template (%s) and not a file: %s",
                           path, CHAT_BUILTINS, strerror(errno));
    char *b = NULL;
    size_t n = 0, cap = 0, got;
    do {
        if (n + 65536 > cap) {
            char *g = realloc(b, cap = 2 * cap + 65536);
            if (!g) {
                free(b);
                fclose(f);
                return ct_fail(CT_ERR_NOMEM, "%s: out of memory", path);
            }
            b = g;
        }
        got = fread(b + n, 1, cap - n, f);
        n += got;
    } while (got > 0 && n < (64u << 20));
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(b);
        return ct_fail(CT_ERR_IO, "%s: read failed", path);
    }
    *src = b;
    *len = n;
    return CT_OK;
}

ct_status chat_template_load(const char *tokenizer_path, const char *choice, const ct_tokenizer *tok,
                             chat_template **out) {
    *out = NULL;
    chat_template *t = calloc(1, sizeof *t);
    if (!t) return ct_fail(CT_ERR_NOMEM, "out of memory");
    char *src = NULL, origin[PATH_MAX + 64];
    size_t len = 0;
    ct_status rc;
    if (choice && (strcmp(choice, "llama3") == 0 || strcmp(choice, "chatml") == 0)) {
        const char *b = strcmp(choice, "llama3") == 0 ? BUILTIN_LLAMA3 : BUILTIN_CHATML;
        len = strlen(b);
        src = strdup(b);
        rc = src ? CT_OK : ct_fail(CT_ERR_NOMEM, "out of memory");
        snprintf(origin, sizeof origin, "built-in %s", choice);
    } else if (choice) {
        rc = read_file(choice, &src, &len);
        snprintf(origin, sizeof origin, "%s", choice);
    } else {
        char *cfg = config_path(tokenizer_path);
        rc = cfg ? config_template(cfg, &src, &len) : ct_fail(CT_ERR_NOMEM, "out of memory");
        snprintf(origin, sizeof origin, "%s chat_template", cfg ? cfg : "tokenizer_config.json");
        free(cfg);
    }
    if (rc == CT_OK) rc = jinja_parse(src, len, origin, &t->tpl);
    free(src);
    if (rc == CT_OK && !(t->origin = strdup(origin))) rc = ct_fail(CT_ERR_NOMEM, "out of memory");
    if (rc != CT_OK) {
        chat_template_free(t);
        return rc;
    }
    t->bos = token_text(tok, tokenizer_bos_id(tok));
    t->eos = token_text(tok, tokenizer_eos_id(tok));
    *out = t;
    return CT_OK;
}

/* -- conversations -- */

static ct_status check_message(const json_t *m, const char *where, const char *key, size_t i) {
    if (!json_is_object(m))
        return ct_fail(CT_ERR_INVALID, "%s: %s[%zu]: expected an object with \"role\" and \"content\"", where, key, i);
    json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
    if (!json_is_string(role))
        return ct_fail(CT_ERR_INVALID, "%s: %s[%zu]: %s", where, key, i,
                       role ? "\"role\" is not a string" : "no \"role\"");
    if (!json_is_string(content) && !((!content || json_is_null(content)) && json_object_get(m, "tool_calls")))
        return ct_fail(CT_ERR_INVALID, "%s: %s[%zu] (%s): %s", where, key, i, json_string_value(role),
                       content ? "\"content\" is not a string" : "no \"content\"");
    return CT_OK;
}

/* Appends a prompt or completion (a string: one message of role; a list: its messages) to msgs. */
static ct_status add_part(json_t *msgs, const json_t *v, const char *role, const char *key, const char *where) {
    if (json_is_string(v))
        return json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", role, "content", v))
               ? ct_fail(CT_ERR_NOMEM, "out of memory") : CT_OK;
    if (!json_is_array(v))
        return ct_fail(CT_ERR_INVALID, "%s: \"%s\": expected a string or a list of messages", where, key);
    size_t i;
    json_t *m;
    json_array_foreach(v, i, m) {
        ct_status rc = check_message(m, where, key, i);
        if (rc != CT_OK) return rc;
        json_array_append(msgs, m);
    }
    return CT_OK;
}

/* The conversation's messages (a new reference), checked. */
static ct_status conversation(const json_t *conv, const char *where, json_t **out) {
    *out = NULL;
    static const char shape[] = "expected {\"messages\": [...]} or {\"prompt\": ..., \"completion\": ...}";
    if (!json_is_object(conv)) return ct_fail(CT_ERR_INVALID, "%s: not a conversation: %s", where, shape);
    json_t *msgs = json_object_get(conv, "messages");
    if (msgs) {
        if (!json_is_array(msgs) || json_array_size(msgs) == 0)
            return ct_fail(CT_ERR_INVALID, "%s: \"messages\": expected a non-empty list of messages", where);
        size_t i;
        json_t *m;
        json_array_foreach(msgs, i, m) {
            ct_status rc = check_message(m, where, "messages", i);
            if (rc != CT_OK) return rc;
        }
        *out = json_incref(msgs);
        return CT_OK;
    }
    json_t *p = json_object_get(conv, "prompt"), *c = json_object_get(conv, "completion");
    if (!p || !c) return ct_fail(CT_ERR_INVALID, "%s: not a conversation: %s", where, shape);
    json_t *all = json_array();
    ct_status rc = all ? add_part(all, p, "user", "prompt", where) : ct_fail(CT_ERR_NOMEM, "out of memory");
    if (rc == CT_OK) rc = add_part(all, c, "assistant", "completion", where);
    if (rc != CT_OK) {
        json_decref(all);
        return rc;
    }
    *out = all;
    return CT_OK;
}

/* Renders messages[0, upto) with add_generation_prompt gen. */
static ct_status render(const chat_template *t, const json_t *conv, json_t *msgs, size_t upto, int gen,
                        const char *where, char **text, size_t *len, jinja_span **spans, size_t *nspans) {
    json_t *part = json_array(), *vars = json_object();
    for (size_t i = 0; part && i < upto; i++) json_array_append(part, json_array_get(msgs, i));
    json_t *tools = json_object_get(conv, "tools");
    int bad = !part || !vars || json_object_set(vars, "messages", part) ||
              json_object_set_new(vars, "tools", tools ? json_incref(tools) : json_null()) ||
              json_object_set_new(vars, "documents", json_null()) ||
              json_object_set_new(vars, "add_generation_prompt", json_boolean(gen)) ||
              json_object_set_new(vars, "bos_token", t->bos ? json_string(t->bos) : json_null()) ||
              json_object_set_new(vars, "eos_token", t->eos ? json_string(t->eos) : json_null());
    json_decref(part);
    ct_status rc = bad ? ct_fail(CT_ERR_NOMEM, "out of memory") : jinja_render(t->tpl, vars, text, len, spans, nspans);
    json_decref(vars);
    if (rc != CT_OK && !bad) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ct_last_error());
        ct_set_error("%s: %s", where, msg);
    }
    return rc;
}

/* Marks counted the tokens that overlap [a, b) of the text (off: each token's start, n + 1 of them). */
static void mark(const size_t *off, size_t n, size_t a, size_t b, unsigned char *counted) {
    if (a >= b) return;
    for (size_t i = 0; i < n; i++)
        if (off[i] < b && off[i + 1] > a) counted[i] = 1;
}

/* The assistant turns' spans of a template without generation blocks (chat.h), marked. */
static ct_status prefix_spans(const chat_template *t, const json_t *conv, json_t *msgs, const char *full,
                              size_t flen, const size_t *off, size_t n, const char *where, unsigned char *counted) {
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        if (strcmp(json_string_value(json_object_get(json_array_get(msgs, i), "role")), "assistant") != 0) continue;
        char *p = NULL, *q = NULL;
        size_t pl, ql, ns;
        jinja_span *sp;
        ct_status rc = render(t, conv, msgs, i, 1, where, &p, &pl, &sp, &ns);
        if (rc == CT_OK) {
            free(sp);
            rc = render(t, conv, msgs, i + 1, 0, where, &q, &ql, &sp, &ns);
            if (rc == CT_OK) free(sp);
        }
        if (rc == CT_OK && (ql > flen || memcmp(q, full, ql) != 0 || pl > ql || memcmp(p, q, pl) != 0))
            rc = ct_fail(CT_ERR_INVALID, "%s: messages[%zu] (assistant): the template renders the conversation up to "
                         "it differently once more follows, so its turn cannot be told apart; use a template with "
                         "{%% generation %%} blocks (--chat-template %s or a file)", where, i, CHAT_BUILTINS);
        if (rc == CT_OK) {
            size_t e = ql;
            while (e > pl && strchr(" \t\r\n", q[e - 1])) e--;
            mark(off, n, pl, e, counted);
        }
        free(p);
        free(q);
        if (rc != CT_OK) return rc;
    }
    return CT_OK;
}

ct_status chat_encode(const chat_template *t, const ct_tokenizer *tok, const json_t *conv, const char *where,
                      int32_t **ids, unsigned char **counted, size_t *n) {
    *ids = NULL;
    *counted = NULL;
    *n = 0;
    json_t *msgs;
    ct_status rc = conversation(conv, where, &msgs);
    if (rc != CT_OK) return rc;
    char *text = NULL;
    size_t len = 0, nspans = 0;
    jinja_span *spans = NULL;
    size_t *off = NULL;
    if ((rc = render(t, conv, msgs, json_array_size(msgs), 0, where, &text, &len, &spans, &nspans)) != CT_OK)
        goto done;
    if ((rc = tokenizer_encode(tok, text, len, 1, ids, n)) != CT_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ct_last_error());
        ct_set_error("%s: the rendered conversation: %s", where, msg);
        goto done;
    }
    /* each token's byte offset in the text: the tokens must give the text back byte for byte */
    off = malloc((*n + 1) * sizeof *off);
    *counted = calloc(*n ? *n : 1, 1);
    if (!off || !*counted) {
        rc = ct_fail(CT_ERR_NOMEM, "out of memory");
        goto done;
    }
    off[0] = 0;
    for (size_t i = 0; i < *n; i++) {
        size_t l = 0;
        tokenizer_token_bytes(tok, (*ids)[i], &l);
        off[i + 1] = off[i] + l;
    }
    if (off[*n] != len) {
        rc = ct_fail(CT_ERR_INVALID, "%s: the tokens of the rendered conversation give %zu bytes back, not its %zu "
                     "(the tokenizer drops bytes); masks would not line up", where, off[*n], len);
        goto done;
    }
    if (jinja_has_generation(t->tpl)) {
        for (size_t s = 0; s < nspans; s++) mark(off, *n, spans[s].start, spans[s].end, *counted);
    } else {
        rc = prefix_spans(t, conv, msgs, text, len, off, *n, where, *counted);
    }
done:
    if (rc != CT_OK) {
        free(*ids);
        free(*counted);
        *ids = NULL;
        *counted = NULL;
        *n = 0;
    }
    free(off);
    free(spans);
    free(text);
    json_decref(msgs);
    return rc;
}

ct_status chat_encode_prompt(const chat_template *t, const ct_tokenizer *tok, const char *user, int32_t **ids,
                             size_t *n) {
    *ids = NULL;
    *n = 0;
    json_t *conv = json_pack("{s:[{s:s, s:s}]}", "messages", "role", "user", "content", user);
    if (!conv) return ct_fail(CT_ERR_INVALID, "the prompt is not valid UTF-8");
    json_t *msgs = json_object_get(conv, "messages");
    char *text = NULL;
    size_t len = 0, nspans = 0;
    jinja_span *spans = NULL;
    ct_status rc = render(t, conv, msgs, 1, 1, "the prompt", &text, &len, &spans, &nspans);
    if (rc == CT_OK && (rc = tokenizer_encode(tok, text, len, 1, ids, n)) != CT_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ct_last_error());
        ct_set_error("the prompt rendered with %s: %s", t->origin, msg);
    }
    free(spans);
    free(text);
    json_decref(conv);
    return rc;
}

ct_status chat_end_of_turn(const chat_template *t, const ct_tokenizer *tok, int32_t *id) {
    *id = -1;
    json_t *conv = json_pack("{s:[{s:s, s:s}, {s:s, s:s}]}", "messages", "role", "user", "content", "Hi", "role",
                             "assistant", "content", "Hello");
    if (!conv) return ct_fail(CT_ERR_NOMEM, "out of memory");
    int32_t *ids;
    unsigned char *counted;
    size_t n;
    ct_status rc = chat_encode(t, tok, conv, "a probe conversation", &ids, &counted, &n);
    json_decref(conv);
    if (rc != CT_OK) return rc;
    size_t last = n;
    while (last > 0 && !counted[last - 1]) last--;
    if (last == 0 || !tokenizer_is_special(tok, ids[last - 1]))
        rc = ct_fail(CT_ERR_INVALID, "%s: an assistant turn does not end with a special token (its last token is "
                     "%s), so a reply has no end-of-turn token to stop at", t->origin,
                     last == 0 ? "none" : "plain text");
    else
        *id = ids[last - 1];
    free(ids);
    free(counted);
    return rc;
}
