/* test_pool.c: the activation arenas' allocator (core/engine/pool.c): marks, heap mode (a freed
 * allocation becomes a hole that later ones take, best fit; one at the top lowers it), the same
 * addresses when a pass repeats, and the steady size after a pass that had to grow. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "engine/runtime.h"

#define KB ((size_t)1024)

static size_t off(const pool *p, const void *x) { return (size_t)((const char *)x - p->chunks[p->cur].base); }

/* A free below the top leaves a hole the next allocation that fits takes; the extent stays. */
static void hole_is_reused(void **state) {
    (void)state;
    pool p;
    pool_init(&p, NULL, NULL, CT_MEM_ACTIVATIONS);
    void *base = pool_alloc(&p, 64 * KB);
    assert_non_null(base);
    pool_heap_begin(&p);
    char *a = pool_alloc(&p, 100 * KB), *b = pool_alloc(&p, 200 * KB), *c = pool_alloc(&p, 50 * KB);
    size_t extent = p.used;
    pool_free(&p, b, 200 * KB);
    assert_int_equal(p.used, extent); /* a hole, not the top */
    assert_int_equal(p.n_holes, 1);
    char *d = pool_alloc(&p, 150 * KB);
    assert_ptr_equal(d, b); /* best fit: b's place */
    assert_int_equal(p.used, extent);
    char *e = pool_alloc(&p, 60 * KB); /* the 50 KiB left of the hole is too small: the top */
    assert_int_equal(off(&p, e), off(&p, c) + 50 * KB);
    char *f = pool_alloc(&p, 50 * KB); /* fits the rest of the hole exactly */
    assert_ptr_equal(f, b + 150 * KB);
    assert_int_equal(p.n_holes, 0);
    (void)a;
    pool_destroy(&p);
}

/* Freeing the top lowers it, and the holes under it with it; holes next to each other merge. */
static void top_comes_down(void **state) {
    (void)state;
    pool p;
    pool_init(&p, NULL, NULL, CT_MEM_ACTIVATIONS);
    pool_heap_begin(&p);
    char *a = pool_alloc(&p, 10 * KB), *b = pool_alloc(&p, 20 * KB), *c = pool_alloc(&p, 30 * KB),
         *d = pool_alloc(&p, 40 * KB);
    pool_free(&p, b, 20 * KB);
    pool_free(&p, c, 30 * KB);
    assert_int_equal(p.n_holes, 1); /* b and c: one hole */
    assert_int_equal(p.holes[0].size, 50 * KB);
    pool_free(&p, d, 40 * KB); /* the top, and the hole below it */
    assert_int_equal(p.n_holes, 0);
    assert_int_equal(p.used, 10 * KB);
    assert_ptr_equal(pool_alloc(&p, 8 * KB), a + 10 * KB);
    pool_destroy(&p);
}

/* Releasing a mark at or below where heap mode began ends it; frees outside heap mode do nothing. */
static void release_ends_heap(void **state) {
    (void)state;
    pool p;
    pool_init(&p, NULL, NULL, CT_MEM_ACTIVATIONS);
    pool_alloc(&p, 4 * KB);
    pool_mark m = pool_get_mark(&p);
    pool_heap_begin(&p);
    char *a = pool_alloc(&p, 8 * KB);
    pool_alloc(&p, 8 * KB);
    pool_free(&p, a, 8 * KB);
    assert_int_equal(p.n_holes, 1);
    pool_release(&p, m);
    assert_int_equal(p.heap, 0);
    assert_int_equal(p.n_holes, 0);
    assert_int_equal(p.used, 4 * KB);
    char *b = pool_alloc(&p, 8 * KB);
    size_t used = p.used;
    pool_free(&p, b, 8 * KB); /* not in heap mode: kept */
    assert_int_equal(p.used, used);
    pool_destroy(&p);
}

/* One pass of allocations and frees; returns the offsets it got. */
static void pass(pool *p, size_t *offs) {
    assert_int_equal(pool_reset(p), CT_OK);
    pool_alloc(p, 300 * KB);
    pool_heap_begin(p);
    char *x[6];
    for (int i = 0; i < 6; i++) x[i] = pool_alloc(p, (size_t)(i + 1) * 100 * KB);
    for (int i = 0; i < 6; i += 2) pool_free(p, x[i], (size_t)(i + 1) * 100 * KB);
    for (int i = 0; i < 4; i++) offs[i] = off(p, pool_alloc(p, 90 * KB * (size_t)(i + 1)));
    for (int i = 0; i < 6; i++) offs[4 + i] = (size_t)(x[i] - p->chunks[0].base);
}

/* A pass that grows the pool leaves it one chunk of that pass's extent; the next pass runs in it
 * and the chunk then shrinks to what a pass needs; from then on the same pass lands at the same
 * offsets and nothing is allocated. */
static void steady_after_growth(void **state) {
    (void)state;
    pool p;
    pool_init(&p, NULL, NULL, CT_MEM_ACTIVATIONS);
    size_t o1[10], o2[10], o3[10];
    pass(&p, o1);
    assert_true(p.n_chunks > 1); /* 1 MiB first chunk: it grew */
    pass(&p, o2);
    assert_int_equal(p.n_chunks, 1);
    size_t need = p.high, big = p.chunks[0].cap;
    assert_true(need < big);
    pass(&p, o3);
    assert_int_equal(p.chunks[0].cap, need); /* shrunk to the extent */
    assert_int_equal(p.high, need);
    assert_memory_equal(o2, o3, sizeof o2);
    char *before = p.chunks[0].base;
    pass(&p, o3);
    assert_ptr_equal(p.chunks[0].base, before);
    assert_memory_equal(o2, o3, sizeof o2);
    assert_int_equal(pool_steady_bytes(&p), need);
    pool_destroy(&p);
}

/* The planner's pools: one first chunk of address space, so its pass is the steady one. */
static void first_chunk_is_steady(void **state) {
    (void)state;
    pool p, q;
    pool_init(&p, NULL, NULL, CT_MEM_ACTIVATIONS);
    pool_init(&q, NULL, NULL, CT_MEM_ACTIVATIONS);
    q.first_chunk = 64 << 20;
    size_t a[10], b[10];
    pass(&p, a);
    pass(&p, a);
    pass(&p, a);
    pass(&q, b);
    assert_int_equal(q.n_chunks, 1);
    assert_int_equal(pool_steady_bytes(&q), pool_steady_bytes(&p));
    assert_memory_equal(a, b, sizeof a);
    pool_destroy(&p);
    pool_destroy(&q);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hole_is_reused),     cmocka_unit_test(top_comes_down),
        cmocka_unit_test(release_ends_heap),  cmocka_unit_test(steady_after_growth),
        cmocka_unit_test(first_chunk_is_steady),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
