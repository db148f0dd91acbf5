/* cmd_plan.h: `ctitan plan`: what a manifest's layout costs on given hardware (memory per GPU by
 * category, step time by part, tokens/s per GPU, MFU), or with --search the best layouts for N GPUs;
 * with --calibrate, a hardware profile measured on this machine.
 *
 * Takes the arguments after the command name. Returns CT_OK (also for --help, which prints the usage
 * on stdout), CT_ERR_INVALID after one line on stderr for bad usage or input (options, manifest,
 * overrides, plugins, hardware profile, a layout the plugins refuse, a --write-manifest folder that
 * does not exist), another status for a failure while running (writing an output, calibration's
 * measurements; --write-manifest when no layout fits).
 */
#ifndef CTITAN_CMD_PLAN_H
#define CTITAN_CMD_PLAN_H

#include "ctitan/abi.h"

ct_status cmd_plan(int argc, char **argv);

#endif
