/* cmd_schedule.h: `ctitan schedule`: builds a pipeline schedule's action lists for a shape, checks
 * them by simulating every rank together, and draws the result (text, or SVG with --svg).
 *
 * Takes the command's own argv: argv[0] is the command name ("schedule") and is skipped. Returns
 * CT_OK when the schedule is valid, CT_ERR_INTERNAL when the checker rejects it (one line naming the
 * rank and the action; exit 1), CT_ERR_INVALID on a usage error or bad input (unknown schedule, a
 * shape the schedule refuses, an unreadable or malformed CSV); `--help` prints the usage to stdout
 * and returns CT_OK.
 */
#ifndef CTITAN_CMD_SCHEDULE_H
#define CTITAN_CMD_SCHEDULE_H

#include "ctitan/abi.h"

/* ctitan schedule --name NAME [--pp P] [--stages S] --microbatches M [--csv FILE] [--svg FILE]
 *                 [--write-csv FILE] [--costs F,B,I,W] [--parallelism.KEY=VALUE ...]: the options
 * the schedule declares, checked against its list as a manifest's would be. */
ct_status cmd_schedule(int argc, char **argv);

#endif
