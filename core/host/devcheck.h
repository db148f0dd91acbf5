/* devcheck.h: the argument checks every device op shares, in one layer the host puts in front of the
 * device plugin.
 *
 * A copy of the plugin's table whose ops first check their arguments (negative sizes, null pointers
 * where there is work, groups and fp8 formats, head counts, strides, ...) and refuse a bad call with
 * CT_ERR_INVALID and one line "op: what is wrong", set through the plugin's own host table (so the
 * line reads as the plugin's did: "cpu: gelu_forward: negative length -1"), before the plugin sees
 * it. What only a device knows stays in its plugin: its kernels' limits, ids and targets in its
 * memory, what a graph capture cannot hold, its allocator's sizes. A refusal while a graph captures
 * is kept, and graph_end returns it (device.h's contract), as the plugin does with its own.
 *
 * Uses nothing of the core but the SDK, so a device's test harness can put the same layer in front
 * of the plugin it tests (tests/unit/test_device_conformance.c). */
#ifndef CT_DEVCHECK_H
#define CT_DEVCHECK_H

#include "ctitan/device.h"
#include "ctitan/host.h"

/* The checking table around `real`, reporting through `host` (the table the plugin was given).
 * One per process, as the host runs one device: a second call replaces the first. Optional ops
 * the plugin leaves NULL (or that its older table does not reach) stay NULL, save the 2.23 families:
 * each general op is there when the plugin has it or the narrow op of its base case (derived from
 * the narrow ops by case), and each narrow op when the plugin has it or the general op (derived
 * from it); struct_size is today's, so callers may test for the general ops on any plugin. */
const ct_device_api *devcheck_wrap(const ct_device_api *real, const ct_host *host);

#endif
