/* jinja.h: the subset of Jinja that chat templates (Llama 3, Qwen2/2.5/3) are written in, rendered the
 * way transformers' apply_chat_template renders them (trim_blocks and lstrip_blocks on, the loop
 * controls extension, its {% generation %} block).
 *
 * What is read:
 *   text, {{ expr }}, {% stmt %}, {# comment #}; whitespace control {%- -%} {{- -}} {#- -#} and {%+
 *   statements   if / elif / else / endif, for NAME[, NAME...] in expr / endfor (loop.index, index0, revindex,
 *                revindex0, first, last, length, previtem, nextitem), set NAME = expr,
 *                set NAME.ATTR = expr (a namespace), break, continue, generation / endgeneration
 *   expressions  literals ('..', "..", integers, floats, true/false/none in either case, [..], {..}),
 *                names, .attr, [index], [a:b:c] slices, calls, a if c else b, or, and, not, == != <
 *                <= > >=, in, not in, is [not] TEST, + - * / // %, ~, unary -, | FILTER(args)
 *   functions    raise_exception(msg), namespace(k=v, ...), range(...)
 *   tests        defined undefined none string number integer float boolean true false mapping
 *                iterable sequence odd even equalto eq ne
 *   filters      trim length count tojson (indent, ensure_ascii, sort_keys) upper lower capitalize
 *                title first last join default d string list reject select replace int float abs
 *                items
 *   methods      str: strip lstrip rstrip startswith endswith split upper lower replace title
 *                capitalize; dict: get items keys values
 * Anything else (macros, blocks, extends, include, call, filter blocks, set blocks, raw, for-else,
 * for-if, an unknown filter, test, method or function) is refused at parse time with
 * "NAME:LINE:COL: unsupported ... 'construct'"; errors while rendering (raise_exception, a type
 * error, an attribute of an undefined value) also name the line and column.
 *
 * Untrusted input: the parser bounds nesting (64 levels); rendering bounds the bytes a render may
 * allocate (64 MiB) and the steps it may take (4M statements and expressions: nested loops over
 * finite lists still multiply), so no template can recurse, grow or run without end.
 *
 * Lifetimes: jinja_parse's template owns a copy of the source; free with jinja_free. jinja_render's
 * output is malloc'd, the caller frees it. Errors: ct_status with one line for ct_last_error().
 */
#ifndef CTITAN_JINJA_H
#define CTITAN_JINJA_H

#include <stddef.h>

#include <jansson.h>

#include "base/error.h"

typedef struct jinja_template jinja_template;

/* Parses src[0, len); name prefixes every message ("tokenizer_config.json chat_template"). */
ct_status jinja_parse(const char *src, size_t len, const char *name, jinja_template **out);
void jinja_free(jinja_template *t);

/* A span of the output that a {% generation %} block wrote: [start, end) bytes. */
typedef struct jinja_span {
    size_t start, end;
} jinja_span;

/* Renders with the variables of vars (a JSON object: strings, numbers, booleans, null, arrays,
 * objects); every other name is undefined. *out (NUL-terminated, *len bytes) and *spans (*nspans of
 * them, in output order; NULL when none) are malloc'd. */
ct_status jinja_render(const jinja_template *t, const json_t *vars, char **out, size_t *len, jinja_span **spans,
                       size_t *nspans);

/* Whether the template holds a {% generation %} block. */
int jinja_has_generation(const jinja_template *t);

#endif
