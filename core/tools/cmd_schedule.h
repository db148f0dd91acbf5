/* cmd_schedule.h: `ctitan schedule`: builds a pipeline schedule's action lists for a shape, checks
 * them by simulating every rank together, and draws the result (text, or SVG with --svg).
 *
 * Takes the command's own argv: argv[0] is the command name ("schedule") and is skipped. Returns 0
 * when the schedule is valid, 1 when the checker rejects it (one line naming the rank and the
 * action), 2 on a usage error or bad input (unknown schedule, a shape the schedule refuses, an
 * unreadable or malformed CSV); `--help` prints the usage to stdout and returns 0.
 */
#ifndef CTITAN_CMD_SCHEDULE_H
#define CTITAN_CMD_SCHEDULE_H

/* ctitan schedule --name NAME [--pp P] [--stages S] --microbatches M [--csv FILE] [--svg FILE]
 *                 [--write-csv FILE] [--costs F,B,I,W] */
int cmd_schedule(int argc, char **argv);

#endif
