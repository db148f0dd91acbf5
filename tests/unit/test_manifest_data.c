/* test_manifest_data.c: config/'s YAML reader taking a file as data (manifest_load_data, what hardware
 * profiles are read with): every map and list an entry before what it holds, in file order, with its
 * line; empty values kept; the file's own limits; each refusal one line naming file, line and key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/manifest.h"
#include "base/error.h"
#include "tmpdir.h"

static const mf_data_format format = {"test file", "expected a test file: a map of keys", 4, 16};

/* The text written to dir/data.yaml and read as data; NULL when refused (the error in ct_last_error). */
static manifest *read_text(const char *text, char *path, size_t len) {
    snprintf(path, len, "%s/data.yaml", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    return manifest_load_data(path, &format);
}

/* text must be refused with "PATH:expect..." on one line. */
static void refused(const char *text, const char *expect) {
    char path[256], want[512];
    manifest *m = read_text(text, path, sizeof path);
    if (m) {
        manifest_free(m);
        fail_msg("accepted:\n%s", text);
    }
    snprintf(want, sizeof want, "%s:%s", path, expect);
    const char *err = ct_last_error();
    if (strncmp(err, want, strlen(want))) fail_msg("%s\n got  %s\n want %s...", text, err, want);
    assert_null(strchr(err, '\n'));
}

static void entry(const manifest *m, int i, const char *key, const char *value, int kind, int line) {
    assert_true(i < m->n_values);
    const mf_value *v = &m->values[i];
    assert_string_equal(v->key, key);
    if (value) assert_string_equal(v->value, value);
    else assert_null(v->value);
    assert_int_equal(v->is_seq, kind);
    assert_int_equal(v->line, line);
    assert_ptr_equal(mf_find(m, key), v);
}

static void test_maps_lists_and_empty_values_are_entries_in_file_order(void **state) {
    (void)state;
    char path[256];
    manifest *m = read_text("name: x\n"
                            "empty:\n"
                            "sec:\n"
                            "  a: 1\n"
                            "  list: [\"1,2\", [3],\n"
                            "         {k: v}]\n"
                            "  m: {}\n"
                            "none: []\n",
                            path, sizeof path);
    if (!m) fail_msg("%s", ct_last_error());
    entry(m, 0, "name", "x", 0, 1);
    entry(m, 1, "empty", NULL, 0, 2);
    entry(m, 2, "sec", NULL, MF_MAP, 3);
    entry(m, 3, "sec.a", "1", 0, 4);
    entry(m, 4, "sec.list", "3", MF_ITEMS, 5);
    entry(m, 5, "sec.list[0]", "1,2", 0, 5); /* one item: a list is not joined */
    entry(m, 6, "sec.list[1]", "1", MF_ITEMS, 5);
    entry(m, 7, "sec.list[1][0]", "3", 0, 5);
    entry(m, 8, "sec.list[2]", NULL, MF_MAP, 6); /* an item's line is its own */
    entry(m, 9, "sec.list[2].k", "v", 0, 6);
    entry(m, 10, "sec.m", NULL, MF_MAP, 7);
    entry(m, 11, "none", "0", MF_ITEMS, 8);
    assert_int_equal(m->n_values, 12);
    assert_int_equal(mf_list_len(m, "sec.list"), 3);
    assert_int_equal(mf_list_len(m, "none"), 0);
    const char *s;
    assert_int_equal(mf_get_str(m, "empty", &s), -1); /* no schema: no default either */
    assert_int_equal(mf_get_str(m, "sec.list[2].k", &s), 0);
    assert_string_equal(s, "v");
    char where[256], want[300];
    mf_where(m, "sec.a", where, sizeof where);
    snprintf(want, sizeof want, "%s:4: sec.a", path);
    assert_string_equal(where, want);
    assert_null(mf_find(m, "sec.b"));
    manifest_free(m);
    m = read_text("# nothing but a comment\n", path, sizeof path); /* an empty document: no entries */
    if (!m) fail_msg("%s", ct_last_error());
    assert_int_equal(m->n_values, 0);
    manifest_free(m);
    m = read_text("a: [[[1]]]\n", path, sizeof path); /* 4 levels: the limit itself */
    if (!m) fail_msg("%s", ct_last_error());
    entry(m, 3, "a[0][0][0]", "1", 0, 1);
    manifest_free(m);
}

static void test_refusals_name_file_line_and_key(void **state) {
    (void)state;
    refused("a: 1\nb: 2\na: 3\n", "3: a: duplicate key (first given at line 1)");
    refused("s: {a: 1}\nt: 2\ns:\n  b: 2\n", "3: s: duplicate section (first given at line 1)");
    refused("s:\n  m: {a: 1}\n  m: {b: 1}\n", "3: s.m: duplicate key (first given at line 2)");
    refused("s:\n  a.b: 1\n", "2: s: 'a.b': keys are plain names");
    refused("s:\n  - a[0]: 1\n", "2: s[0]: 'a[0]': keys are plain names");
    refused("a: &x 1\nb: *x\n", "1: an anchor or alias (&name, *name); a test file has none");
    refused("a: [[[[1]]]]\n", "1: maps and lists nested deeper than 4 levels"); /* the root map is one */
    refused("- 1\n- 2\n", "1: expected a test file: a map of keys");
    refused("a: 1\n---\nb: 2\n", "2: a second YAML document starts here; a test file is one document");
    refused("a: [1, 2,\n  3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]\n",
            "2: a[15]: more than 16 keys, maps, lists and items");
    refused("a: [1\n", "2:1: YAML syntax error: did not find expected ',' or ']'");
    /* torchtitan's TOML is a manifest's other syntax, not a data file's */
    refused("[training]\nsteps = 1\n", "2:");
    assert_null(manifest_load_data("/nonexistent/x.yaml", &format));
    assert_string_equal(ct_last_error(), "/nonexistent/x.yaml: cannot open test file: No such file or directory");
}

static int setup(void **state) {
    (void)state;
    return tmpdir_make("mfdata");
}

static int teardown(void **state) {
    (void)state;
    tmpdir_remove();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_maps_lists_and_empty_values_are_entries_in_file_order),
        cmocka_unit_test(test_refusals_name_file_line_and_key),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
