/* cmd_config.h: `ctitan config import`: a torchtitan TOML config written as a ctitan YAML manifest. */
#ifndef CT_CMD_CONFIG_H
#define CT_CMD_CONFIG_H

#include "ctitan/abi.h"

/* argv[0] is "config". Prints one error line and returns its status on failure. */
ct_status cmd_config(int argc, char **argv);

#endif
