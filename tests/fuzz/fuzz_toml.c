/* fuzz_toml.c: any bytes as a torchtitan TOML config through the shim (toml++): it must return an error
 * or visit every leaf, never crash, leak or throw, and it checks what the shim promises: an error is
 * one line naming the file; every leaf has a dotted key, a value and a line in the text. */
#include "config/toml_shim.h"
#include "base/error.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok) {
    if (!ok) abort();
}

typedef struct seen {
    size_t leaves, lines; /* lines: of the text, for the leaves' line numbers */
} seen;

static ct_status visit(void *ctx, const char *key, const char *value, int kind, int line) {
    seen *s = ctx;
    check(key && *key && value && kind >= MF_TOML_SCALAR && kind <= MF_TOML_NESTED);
    check(line >= 1 && (size_t)line <= s->lines);
    s->leaves++;
    return CT_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char path[] = "fuzz.toml";
    seen s = {0, 1};
    for (size_t i = 0; i < size; i++) s.lines += data[i] == '\n' || data[i] == '\r'; /* '\r' alone ends one too */
    if (mf_toml_parse(path, (const char *)data, size, 64, visit, &s) != CT_OK) {
        const char *err = ct_last_error();
        check(strncmp(err, path, strlen(path)) == 0 && !strchr(err, '\n'));
    }
    return 0;
}
