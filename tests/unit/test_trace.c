/* test_trace.c: the profiler's trace copies every name (a buffer reused for each unit's name, as a
 * model pack may hand out, still leaves every name in the file), records nothing outside a window,
 * writes per-rank Chrome trace JSON that merges into one file with a process per rank; the memory
 * ledger's snapshot sums to the counters at the peak and names each tensor's bytes. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tmpdir.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "host/host.h"
#include "host/trace.h"

static int setup(void **state) {
    (void)state;
    return tmpdir_make("trace");
}

static int teardown(void **state) {
    (void)state;
    tmpdir_remove();
    return 0;
}

/* The events of a trace file, checked to be {"traceEvents": [...]}. */
static json_t *events_of(const char *path, json_t **doc) {
    json_error_t e;
    *doc = json_load_file(path, 0, &e);
    assert_non_null(*doc);
    json_t *ev = json_object_get(*doc, "traceEvents");
    assert_true(json_is_array(ev));
    return ev;
}

static int count_named(json_t *ev, const char *name, const char *ph, int pid) {
    size_t i;
    json_t *e;
    int n = 0;
    json_array_foreach(ev, i, e) {
        if (!strcmp(json_string_value(json_object_get(e, "name")), name) &&
            !strcmp(json_string_value(json_object_get(e, "ph")), ph) &&
            json_integer_value(json_object_get(e, "pid")) == pid)
            n++;
    }
    return n;
}

static void record_window(int rank) {
    char name[16];
    trace_begin("outside"); /* no window yet: dropped */
    trace_set_on(1);
    for (int l = 0; l < 3; l++) { /* one buffer for every layer's name */
        snprintf(name, sizeof name, "layers.%d", l);
        trace_begin(name);
        trace_complete("linear", "device_op", trace_now_us(), "{\"flops\":8}");
        trace_end(name);
    }
    mem_account(CT_MEM_ACTIVATIONS, 64 * (rank + 1));
    mem_account(CT_MEM_ACTIVATIONS, -64 * (rank + 1));
    trace_set_on(0);
    trace_begin("after"); /* window closed: dropped */
}

static void test_names_windows_and_merge(void **state) {
    (void)state;
    char p0[512], p1[512], merged[512];
    snprintf(p0, sizeof p0, "%s/rank0_trace.json", dir);
    snprintf(p1, sizeof p1, "%s/rank1_trace.json", dir);
    snprintf(merged, sizeof merged, "%s/trace.json", dir);
    trace_enable(1);
    record_window(0);
    assert_int_equal(trace_write_rank(p0, 0), CT_OK);
    record_window(1); /* the second "rank": the same process, written under pid 1 */
    assert_int_equal(trace_write_rank(p1, 1), CT_OK);
    assert_int_equal(trace_merge(merged, dir, 2), CT_OK);
    json_t *doc, *ev = events_of(merged, &doc);
    for (int r = 0; r < 2; r++) {
        for (int l = 0; l < 3; l++) {
            char name[16];
            snprintf(name, sizeof name, "layers.%d", l);
            assert_int_equal(count_named(ev, name, "B", r), 1);
            assert_int_equal(count_named(ev, name, "E", r), 1);
        }
        assert_int_equal(count_named(ev, "linear", "X", r), 3);
        assert_int_equal(count_named(ev, "process_name", "M", r), 1);
        assert_int_equal(count_named(ev, "outside", "B", r), 0);
        assert_int_equal(count_named(ev, "after", "B", r), 0);
        assert_true(count_named(ev, "memory", "C", r) >= 2); /* the window's first counters and the change */
    }
    json_decref(doc);
    /* a rank's missing file: an error naming it, no merged file left half-written */
    snprintf(merged, sizeof merged, "%s/trace3.json", dir);
    assert_int_equal(trace_merge(merged, dir, 3), CT_ERR_IO);
    assert_non_null(strstr(ct_last_error(), "rank2_trace.json"));
    assert_int_equal(access(merged, F_OK), -1);
    trace_enable(0);
}

static void test_snapshot_sums_to_counters(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/snap.json", dir);
    const char *names[2] = {"layers.0.attention.wq.weight", "layers.0.attention.wk.weight"};
    const int64_t bytes[2] = {4096, 1024};
    mem_account(CT_MEM_PARAMS, 6144); /* two tensors and 1024 bytes of padding */
    mem_account_owned(CT_MEM_COMM, "fsdp", 100);
    memsnap_arm();
    mem_account(CT_MEM_ACTIVATIONS, 5000); /* the peak */
    int64_t at_peak[CT_MEM_NCATEGORIES];
    memcpy(at_peak, g_mem.cur, sizeof at_peak);
    mem_account(CT_MEM_ACTIVATIONS, -5000);
    memsnap_freeze();
    mem_account(CT_MEM_ACTIVATIONS, 9000); /* after the step: not this snapshot's peak */
    assert_int_equal(memsnap_write(path, 0, 7, names, bytes, 2), CT_OK);
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    assert_non_null(doc);
    assert_int_equal(json_integer_value(json_object_get(doc, "step")), 7);
    json_t *counters = json_object_get(doc, "counters"), *live = json_object_get(doc, "live"), *l;
    int64_t sums[CT_MEM_NCATEGORIES] = {0}, total = 0;
    int named = 0, fsdp = 0;
    size_t i;
    json_array_foreach(live, i, l) {
        const char *cat = json_string_value(json_object_get(l, "category"));
        const char *owner = json_string_value(json_object_get(l, "owner"));
        int64_t b = json_integer_value(json_object_get(l, "bytes"));
        for (int c = 0; c < CT_MEM_NCATEGORIES; c++)
            if (!strcmp(cat, mem_category_name((ct_mem_category)c))) sums[c] += b;
        total += b;
        named += !strcmp(owner, names[0]) && b == 4096;
        fsdp += !strcmp(owner, "fsdp") && b == 100;
    }
    for (int c = 0; c < CT_MEM_NCATEGORIES; c++) {
        const char *cat = mem_category_name((ct_mem_category)c);
        assert_int_equal(json_integer_value(json_object_get(counters, cat)), at_peak[c]);
        assert_int_equal(sums[c], at_peak[c]);
    }
    assert_int_equal(json_integer_value(json_object_get(doc, "total_bytes")), total);
    assert_int_equal(named, 1);
    assert_int_equal(fsdp, 1);
    json_decref(doc);
    mem_account(CT_MEM_ACTIVATIONS, -9000);
    mem_account_owned(CT_MEM_COMM, "fsdp", -100);
    mem_account(CT_MEM_PARAMS, -6144);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_windows_and_merge),
        cmocka_unit_test(test_snapshot_sums_to_counters),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
