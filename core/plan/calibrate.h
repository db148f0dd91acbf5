/* calibrate.h: `ctitan plan --calibrate`: a hardware profile measured on this machine through the
 * manifest's own device, quantizer and comm plugins.
 *
 * What it measures (calibrate.c says how):
 *  - every distinct op of one microbatch of the manifest's layout (plan_trace_layout), forward and
 *    backward, at its shapes and GEMM dtype: seconds per call into hw_profile.ops;
 *  - the device's memory bandwidth, its GEMM rate at a large square shape (against its
 *    measure_peak_flops), the attention rate and the optimizer's step;
 *  - under `ctitan launch -n N`: all-gather, reduce-scatter and all-reduce over groups of d
 *    consecutive ranks for every divisor d > 1 of N, at sizes covering the layout's collectives and
 *    its units' parameters, into hw_profile.comms, and the ring formula's bandwidth and latency
 *    fitted to the all-gathers.
 * Every rank measures at once (ranks share the machine as in training) and the profile keeps the
 * slowest rank's time. Rank 0 writes the profile (hw_profile_write).
 */
#ifndef CT_PLAN_CALIBRATE_H
#define CT_PLAN_CALIBRATE_H

#include "plan/plan.h"

#include <stddef.h>

/* Calibrates on the manifest `mf` (loaded, overrides applied; the caller's, freed by the caller) and
 * writes the profile to out_path (rank 0; the other ranks measure with it and write nothing).
 * Returns CT_OK; CT_ERR_INVALID for bad input (the manifest, its plugins, the output path: exit 2);
 * another status (CT_ERR_INTERNAL) for a failure while measuring (exit 1). With an error, its one line is set
 * (ct_last_error), or none is (the message is cleared) when the line was already printed on stderr
 * (the manifest's and plugins' errors print themselves, as in train).
 * A failure after the ranks started measuring together ends the whole job through the comm's
 * abort (exit 1), after printing its line: the other ranks would otherwise wait in a collective. */
ct_status plan_calibrate(manifest *mf, const char *out_path);

#endif
