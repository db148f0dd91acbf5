/* test_jinja.c: ctitan's chat-template interpreter renders what transformers' Jinja environment
 * renders, byte for byte: tests/golden/chat/renders.json (gen_chat_golden.py) holds Jinja snippets
 * (one or two constructs each: operators, tests, filters, string methods, slices, loops and their
 * variables, namespaces, whitespace control) and the fuzz corpus's chat templates (Llama 3, Llama 3.1
 * with its tool paths, Qwen2.5, Qwen3, the built-in ones) with three conversations (plain, tool calls,
 * Llama 3.1's built-in tools), and the text transformers rendered, or that it
 * raised: then ctitan must refuse too, in one line naming the template. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "tokenizer/jinja.h"

static void test_renders_equal_transformers(void **state) {
    (void)state;
    json_error_t je;
    json_t *cases = json_load_file("tests/golden/chat/renders.json", 0, &je);
    if (!cases) fail_msg("tests/golden/chat/renders.json: %s", je.text);
    size_t i, ok = 0, refused = 0;
    json_t *c;
    int bad = 0;
    json_array_foreach(cases, i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *src = json_object_get(c, "template"), *want = json_object_get(c, "output");
        jinja_template *t = NULL;
        char *out = NULL;
        size_t len = 0, ns = 0;
        jinja_span *sp = NULL;
        ct_status rc = jinja_parse(json_string_value(src), json_string_length(src), "case.jinja", &t);
        if (rc == CT_OK) rc = jinja_render(t, json_object_get(c, "vars"), &out, &len, &sp, &ns);
        if (!want) {
            const char *e = ct_last_error();
            if (rc == CT_OK || strncmp(e, "case.jinja:", 11) != 0 || strchr(e, '\n')) {
                print_error("%s: transformers raised %s, ctitan %s\n", name,
                            json_string_value(json_object_get(c, "error")), rc == CT_OK ? "rendered it" : e);
                bad = 1;
            } else {
                refused++;
            }
        } else if (rc != CT_OK) {
            print_error("%s: %s\n", name, ct_last_error());
            bad = 1;
        } else if (len != json_string_length(want) || memcmp(out, json_string_value(want), len) != 0) {
            print_error("%s: rendered\n---\n%s\n--- transformers rendered\n%s\n---\n", name, out,
                        json_string_value(want));
            bad = 1;
        } else {
            ok++;
        }
        free(out);
        free(sp);
        jinja_free(t);
    }
    print_message("%zu renders equal to transformers', %zu refused as transformers refused them\n", ok, refused);
    assert_true(ok + refused >= 60);
    json_decref(cases);
    assert_false(bad);
}

/* A generation block's span is the text it wrote. */
static void test_generation_spans(void **state) {
    (void)state;
    static const char src[] = "{{ bos_token }}{% for m in messages %}[{% generation %}{{ m }}{% endgeneration %}]"
                              "{% endfor %}";
    jinja_template *t;
    assert_int_equal(jinja_parse(src, sizeof src - 1, "gen.jinja", &t), CT_OK);
    assert_true(jinja_has_generation(t));
    json_t *vars = json_pack("{s:[s,s], s:s}", "messages", "ab", "cde", "bos_token", "<s>");
    char *out;
    size_t len, ns;
    jinja_span *sp;
    assert_int_equal(jinja_render(t, vars, &out, &len, &sp, &ns), CT_OK);
    assert_string_equal(out, "<s>[ab][cde]");
    assert_int_equal(ns, 2);
    assert_int_equal(sp[0].start, 4);
    assert_int_equal(sp[0].end, 6);
    assert_int_equal(sp[1].start, 8);
    assert_int_equal(sp[1].end, 11);
    free(out);
    free(sp);
    json_decref(vars);
    jinja_free(t);
}

/* What the subset leaves out is refused at parse time, naming the construct, its line and column. */
static void test_refusals_name_the_construct(void **state) {
    (void)state;
    static const struct { const char *src, *want; } cases[] = {
        {"{% macro m() %}{% endmacro %}", "t.jinja:1:4: unsupported statement 'macro'"},
        {"a\n  {% include 'x' %}", "t.jinja:2:6: unsupported statement 'include'"},
        {"{{ x | wordcount }}", "t.jinja:1:8: unsupported filter 'wordcount'"},
        {"{{ x is divisibleby 3 }}", "t.jinja:1:9: unsupported test 'divisibleby'"},
        {"{{ 'a'.zfill(3) }}", "t.jinja:1:8: unsupported method 'zfill'"},
        {"{{ cycler(1) }}", "t.jinja:1:4: unsupported function 'cycler'"},
        {"{% for a in x if a %}{% endfor %}", "t.jinja:1:15: unsupported construct 'for ... if'"},
        {"{% for a in x %}{% else %}{% endfor %}", "t.jinja:1:20: unsupported construct 'for ... else'"},
        {"{% set x %}y{% endset %}", "t.jinja:1:4: unsupported construct 'set block'"},
        {"{{ 2 ** 3 }}", "t.jinja:1:6: unsupported operator '**'"},
        {"{% if x %}", "t.jinja:1:11: the template ends inside a block (expected 'elif')"},
        {"{% endif %}", "t.jinja:1:4: 'endif' without its opening statement"},
        {"{{ 'abc }}", "t.jinja:1:4: unterminated string"},
        {"{{ x", "a tag is not closed (expected '}}')"},
        {"{# x", "t.jinja:1:1: a comment is not closed (expected '#}')"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        jinja_template *t = NULL;
        assert_int_equal(jinja_parse(cases[i].src, strlen(cases[i].src), "t.jinja", &t), CT_ERR_INVALID);
        assert_null(t);
        if (!strstr(ct_last_error(), cases[i].want))
            fail_msg("%s: '%s' should say '%s'", cases[i].src, ct_last_error(), cases[i].want);
    }
}

/* Bounded: nesting, steps and memory. */
static void test_bounds(void **state) {
    (void)state;
    char src[420 + 200] = "{{ ";
    for (int i = 0; i < 200; i++) strcat(src, "(");
    strcat(src, "1");
    for (int i = 0; i < 200; i++) strcat(src, ")");
    strcat(src, " }}");
    jinja_template *t = NULL;
    assert_int_equal(jinja_parse(src, strlen(src), "t.jinja", &t), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "nested deeper than 64"));
    static const char loops[] = "{% for a in r %}{% for b in r %}{% for c in r %}{% for d in r %}{{ a }}"
                                "{% endfor %}{% endfor %}{% endfor %}{% endfor %}";
    assert_int_equal(jinja_parse(loops, sizeof loops - 1, "t.jinja", &t), CT_OK);
    json_t *vars = json_pack("{s:[i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,"
                             "i,i,i,i,i,i,i,i,i,i]}", "r", 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
                             0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9);
    char *out;
    size_t len, ns;
    jinja_span *sp;
    /* 50^4 iterations: the step bound or the memory bound (loop variables) stops it, whichever first */
    assert_int_equal(jinja_render(t, vars, &out, &len, &sp, &ns), CT_ERR_INVALID);
    assert_true(strstr(ct_last_error(), "more than 4194304 steps") || strstr(ct_last_error(), "more than 64 MiB"));
    jinja_free(t);
    static const char grow[] = "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for a in r %}"
                               "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}";
    assert_int_equal(jinja_parse(grow, sizeof grow - 1, "t.jinja", &t), CT_OK);
    assert_int_equal(jinja_render(t, vars, &out, &len, &sp, &ns), CT_ERR_INVALID);   /* 16 * 2^50 bytes */
    assert_non_null(strstr(ct_last_error(), "rendering needs more than 64 MiB"));
    jinja_free(t);
    json_decref(vars);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_renders_equal_transformers),
        cmocka_unit_test(test_generation_spans),
        cmocka_unit_test(test_refusals_name_the_construct),
        cmocka_unit_test(test_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
