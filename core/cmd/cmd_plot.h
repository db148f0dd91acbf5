/* cmd_plot.h: `ctitan plot`: runs' metrics.jsonl drawn as curves (loss or any numeric field against
 * step or tokens), one line per run labelled by its layout, written as SVG or PNG with cairo.
 *
 * Takes the command's own argv: argv[0] is the command name ("plot") and is skipped. Returns CT_OK
 * when the picture was written, CT_ERR_INVALID on a usage error or bad input (a run folder without
 * metrics.jsonl, a malformed record, a field no record has; one line naming the folder or file and
 * the field), CT_ERR_IO when the picture cannot be written; `--help` prints the usage and returns
 * CT_OK.
 */
#ifndef CTITAN_CMD_PLOT_H
#define CTITAN_CMD_PLOT_H

#include "ctitan/abi.h"

/* ctitan plot RUN_DIR... --output FILE.svg|FILE.png [--metric FIELD] [--x step|tokens]
 *             [--label NAME]... [--title TEXT] [--log-y] [--smooth W] [--size WxH] */
ct_status cmd_plot(int argc, char **argv);

/* Axis ticks on [lo, hi] (lo < hi, both finite): the multiples of a step of 1, 2 or 5 times a power
 * of ten that lie in the range, the largest such step giving at least min_ticks of them. *first is the
 * first tick, *step the spacing; returns the number of ticks (0 on a range it cannot tick: empty or
 * not finite, or min_ticks outside 2..20). */
int plot_nice_ticks(double lo, double hi, int min_ticks, double *first, double *step);

/* TensorBoard's smoothing: an exponential moving average with weight w (0 <= w < 1) over v[0..n),
 * debiased so the first values are not pulled towards zero; out may be v. */
void plot_smooth_ema(const double *v, double *out, int n, double w);

#endif
