/* cmd_plugins.h: `ctitan plugins`: what plugins there are, why a file is not one, and what one
 * plugin takes.
 *
 * Without an argument it lists the ctitan-*.so files of the search path (the files a manifest's bare
 * name loads); with a folder, every file in it, each one that is not a loadable plugin with the
 * loader's reason; with a file, that plugin's kind, name, ABI version, description and every option
 * (manifest key, type, default, range or choices, help). CT_ERR_INVALID (exit 2) with one line on
 * stderr for a path that does not exist, a file that is not a loadable plugin or a folder without
 * one; CT_ERR_IO when the search path holds no plugin.
 */
#ifndef CTITAN_CMD_PLUGINS_H
#define CTITAN_CMD_PLUGINS_H

#include "ctitan/abi.h"

/* ctitan plugins [FOLDER | FILE]; argv[0] is the first argument after the command name. */
ct_status cmd_plugins(int argc, char **argv);

#endif
