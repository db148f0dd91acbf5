/* fuzz_jinja.c: any bytes, as a chat template, parse and render or are refused with one line.
 *
 * Each input is parsed as a template: it parses, or the message is one line that starts with the
 * template's name and a line and column. A template that parses is rendered twice with a fixed
 * conversation (a system prompt, user and assistant turns with unicode, a tool call, tools, the special
 * tokens): both renders succeed with the same text and spans, or fail with the same one-line message;
 * the output is NUL-terminated at its length, and the generation spans lie in order inside it.
 *
 * libFuzzer:  make build/fuzz/fuzz_jinja (links build/fuzz/libctitan-core.a, the core built with the
 *             fuzzer's instrumentation); replay: tests/cli/fuzz_replay.sh's build of it.
 * plain:      link with tests/fuzz/replay_main.c instead of -fsanitize=fuzzer (tests/cli/fuzz_replay.sh) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/error.h"
#include "tokenizer/jinja.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "fuzz_jinja: %s failed\n", #c); __builtin_trap(); } } while (0)

static const char VARS[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"  Be brief.  \"},"
    " {\"role\": \"user\", \"content\": \"Hi \\u00e9 \\u2713 \\ud83d\\ude00 <tool_response>x</tool_response>\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>\\nhm\\n</think>\\n\\nHello!\\n\"},"
    " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\":"
    " {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [true, null, 2.5]}}}]},"
    " {\"role\": \"tool\", \"content\": \"42\"}, {\"role\": \"user\", \"content\": \"\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}],"
    " \"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|eot_id|>\", \"add_generation_prompt\": true}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *vars;
    if (!vars) {
        json_error_t je;
        vars = json_loads(VARS, 0, &je);
        CHECK(vars);
    }
    jinja_template *t = NULL;
    if (jinja_parse((const char *)data, size, "fuzz.jinja", &t) != CT_OK) {
        const char *e = ct_last_error();
        CHECK(t == NULL && strncmp(e, "fuzz.jinja:", 11) == 0 && strchr(e, '\n') == NULL);
        return 0;
    }
    char *out[2] = {NULL, NULL}, err[2][1024];
    size_t len[2] = {0, 0}, ns[2] = {0, 0};
    jinja_span *sp[2] = {NULL, NULL};
    ct_status rc[2];
    for (int k = 0; k < 2; k++) {
        rc[k] = jinja_render(t, vars, &out[k], &len[k], &sp[k], &ns[k]);
        snprintf(err[k], sizeof err[k], "%s", rc[k] == CT_OK ? "" : ct_last_error());
        if (rc[k] != CT_OK) {
            CHECK(out[k] == NULL && sp[k] == NULL && strncmp(err[k], "fuzz.jinja:", 11) == 0 &&
                  strchr(err[k], '\n') == NULL);
            continue;
        }
        CHECK(out[k][len[k]] == 0);
        for (size_t i = 0; i < ns[k]; i++) CHECK(sp[k][i].start <= sp[k][i].end && sp[k][i].end <= len[k]);
        CHECK(jinja_has_generation(t) || ns[k] == 0);
    }
    CHECK(rc[0] == rc[1] && strcmp(err[0], err[1]) == 0);
    if (rc[0] == CT_OK) {
        CHECK(len[0] == len[1] && memcmp(out[0], out[1], len[0]) == 0 && ns[0] == ns[1]);
        CHECK(ns[0] == 0 || memcmp(sp[0], sp[1], ns[0] * sizeof *sp[0]) == 0);
    }
    for (int k = 0; k < 2; k++) {
        free(out[k]);
        free(sp[k]);
    }
    jinja_free(t);
    return 0;
}
