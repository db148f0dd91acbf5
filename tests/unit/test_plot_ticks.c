/* test_plot_ticks.c: `ctitan plot`'s axis ticks are multiples of 1, 2 or 5 x 10^k inside the range,
 * at least as many as asked for and the widest such step; ranges it cannot tick give none; the
 * smoothing is TensorBoard's debiased moving average. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>

#include "cmd/cmd_plot.h"

/* The ticks of [lo, hi] with min_ticks: their count, first and step as expected. */
static void ticks_are(double lo, double hi, int min_ticks, int n, double first, double step) {
    double f = -1, s = -1;
    int got = plot_nice_ticks(lo, hi, min_ticks, &f, &s);
    assert_int_equal(got, n);
    assert_true(fabs(f - first) <= 1e-12 * fmax(1, fabs(first)));
    assert_true(fabs(s - step) <= 1e-12 * step);
}

static void test_plot_ticks_steps_of_1_2_5(void **state) {
    (void)state;
    ticks_are(0, 10, 4, 6, 0, 2);         /* 0 2 4 6 8 10 (5 would give 3) */
    ticks_are(0, 10, 3, 3, 0, 5);         /* 0 5 10 */
    ticks_are(1, 40, 4, 4, 10, 10);       /* 10 20 30 40 */
    ticks_are(2.9, 6.8, 4, 4, 3, 1);      /* a loss curve: 3 4 5 6 */
    ticks_are(0.00051, 0.00299, 4, 4, 0.001, 0.0005); /* a learning rate: 1e-3 .. 2.5e-3 by 5e-4 */
    ticks_are(-3, 7, 4, 5, -2, 2);        /* through zero */
    ticks_are(512, 20480, 4, 4, 5000, 5000); /* tokens: 5k 10k 15k 20k */
    ticks_are(123456789, 123456791, 3, 3, 123456789, 1); /* a narrow range far from zero */
}

/* Every tick lies in the range, and the step is one of 1, 2, 5 x 10^k. */
static void test_plot_ticks_inside_and_nice(void **state) {
    (void)state;
    static const double r[][2] = {{0.1, 0.35}, {-1e6, 3e7}, {1e-9, 7e-9}, {99, 101}, {0, 1}, {6.697, 6.7}};
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        for (int m = 2; m <= 8; m++) {
            double f, s;
            int n = plot_nice_ticks(r[i][0], r[i][1], m, &f, &s);
            assert_true(n >= m);
            assert_true(n <= 3 * m); /* the next wider step (at most x2.5) gives fewer than m */
            double mant = s / pow(10, floor(log10(s) + 1e-9));
            assert_true(fabs(mant - 1) < 1e-9 || fabs(mant - 2) < 1e-9 || fabs(mant - 5) < 1e-9);
            double eps = s * 1e-9;
            assert_true(f >= r[i][0] - eps && f + (n - 1) * s <= r[i][1] + eps);
        }
}

static void test_plot_ticks_refuses_bad_ranges(void **state) {
    (void)state;
    double f, s;
    assert_int_equal(plot_nice_ticks(1, 1, 4, &f, &s), 0);
    assert_int_equal(plot_nice_ticks(2, 1, 4, &f, &s), 0);
    assert_int_equal(plot_nice_ticks(0, INFINITY, 4, &f, &s), 0);
    assert_int_equal(plot_nice_ticks(NAN, 1, 4, &f, &s), 0);
    assert_int_equal(plot_nice_ticks(-1e308, 1e308, 4, &f, &s), 0); /* the width overflows */
    assert_int_equal(plot_nice_ticks(0, 1, 1, &f, &s), 0);
    assert_int_equal(plot_nice_ticks(0, 1, 21, &f, &s), 0);
}

/* Weight 0 is the raw curve; the first value is kept (debiased); a constant stays constant; and
 * values follow the debiased recurrence. */
static void test_plot_smooth_ema(void **state) {
    (void)state;
    double v[] = {4, 2, 6, 6, 1}, out[5];
    plot_smooth_ema(v, out, 5, 0);
    for (int i = 0; i < 5; i++) assert_true(out[i] == v[i]);
    plot_smooth_ema(v, out, 5, 0.6);
    assert_true(fabs(out[0] - 4) < 1e-12);
    double last = 0;
    for (int i = 0; i < 5; i++) {
        last = 0.6 * last + 0.4 * v[i];
        assert_true(fabs(out[i] - last / (1 - pow(0.6, i + 1))) < 1e-12);
    }
    double c[] = {3, 3, 3, 3}, co[4];
    plot_smooth_ema(c, co, 4, 0.99);
    for (int i = 0; i < 4; i++) assert_true(fabs(co[i] - 3) < 1e-12);
    plot_smooth_ema(v, v, 5, 0.6); /* in place */
    for (int i = 0; i < 5; i++) assert_true(fabs(v[i] - out[i]) < 1e-12);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plot_ticks_steps_of_1_2_5),
        cmocka_unit_test(test_plot_ticks_inside_and_nice),
        cmocka_unit_test(test_plot_ticks_refuses_bad_ranges),
        cmocka_unit_test(test_plot_smooth_ema),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
