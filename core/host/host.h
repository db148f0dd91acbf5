/* host.h: the core's side of the ABI: host-services tables, memory counters, errors, and the
 * plugin loader (dlopen from a search path, entry symbol, ABI major check). */
#ifndef CT_HOST_H
#define CT_HOST_H

#include "ctitan/abi.h"
#include "ctitan/device.h"
#include "ctitan/host.h"
#include "config/manifest.h"

#include <limits.h>

#include <stdio.h>

/* ---- memory counters ---- */
typedef struct mem_stats {
    int64_t cur[CT_MEM_NCATEGORIES];
    int64_t peak[CT_MEM_NCATEGORIES];
    int64_t cur_total, peak_total;
} mem_stats;

extern mem_stats g_mem;
void mem_account(ct_mem_category cat, int64_t delta);
/* mem_account charging `owner` (NULL: mem_owner_set's, else a name by category) in the ledger. */
void mem_account_owned(ct_mem_category cat, const char *owner, int64_t delta);
/* The peaks start again from what is held now (each metrics record reports the peak since the one
 * before, as torchtitan resets its peak statistics at every log step). */
void mem_reset_peaks(void);
const char *mem_category_name(ct_mem_category cat);

/* ---- errors: base/error.h ---- */
#include "base/error.h"

/* ---- logging ---- */
extern int g_log_level; /* messages below this level are dropped */
extern int g_log_rank;  /* >= 0: every line is prefixed "[rank N]" (many ranks) */
/* Many ranks: stderr lines get "[rank N] ", and ranks other than 0 drop stdout. May be called again
 * (the comm's rank replaces the launcher's). */
void log_set_rank(int rank, int world);
/* log_set_rank from the launcher's environment (mpirun, srun, torchrun), so that lines printed before
 * the comm plugin joins the job carry their rank too. Nothing outside a launcher. */
void log_set_rank_from_env(void);

/* ---- tracing: host/trace.h ---- */
#include "host/trace.h"

/* ---- plugins ---- */
typedef struct plugin {
    char *path;
    void *handle;
    ct_plugin_info info;
    ct_host host;        /* this plugin's table; ctx points back here */
    const char *section; /* its manifest section */
    const manifest *mf;
} plugin;

/* The plugin's search knobs (ct_plugin_info.knobs, stepped by CT_AT; checked at load to name its options),
 * or NULL: none, or built against an ABI before 2.21. */
const ct_search_knob *plugin_knobs(const ct_plugin_info *info);

/* Loads the plugin `name` (a bare name -> "ctitan-<lowercase name>.so" on the search path, which
 * never includes the manifest's folder; or a path to a .so, relative to the manifest's folder) and
 * checks it is of `kind`. The file is checked before dlopen (plugin_file_check). On error returns
 * NULL with one line set (ct_last_error). */
plugin *plugin_load(const char *name, ct_plugin_kind kind, const char *section, const manifest *mf);
void plugin_unload(plugin *p);
const char *plugin_kind_name(ct_plugin_kind kind);
/* The oldest minor of CT_ABI_MAJOR the loader accepts for a plugin of `kind` (newer ones than the
 * host's CT_ABI_MINOR are refused too). */
uint32_t plugin_oldest_minor(ct_plugin_kind kind);
/* The plugin search path: first_dir (a folder the user named, `ctitan plugins FOLDER`; may be NULL),
 * $CTITAN_PLUGIN_PATH (':'-separated), the binary's folder + /plugins, the build's plugins. Returns
 * how many folders it wrote (at most max). */
int plugin_search_dirs(const char *first_dir, char dirs[][PATH_MAX], int max);
/* Opens any plugin file (no kind asked for): plugin_file_check, dlopen, the entry symbol, the ABI
 * version and the option list's struct_size. NULL with the one line saying why set (ct_last_error). */
plugin *plugin_open(const char *path);
/* Lists plugins with kind, name, ABI, path and description. folder NULL: every ctitan-*.so on the
 * search path (the files a bare name loads). A folder: every file in it (subfolders skipped), each
 * that is not a loadable plugin on a "?" line with the loader's reason. *files (may be NULL) gets
 * how many files were examined. Returns how many plugins were listed. */
int plugin_list(FILE *out, const char *folder, int *files);
/* Whether path may be handed to dlopen: a regular file holding a 64-bit ELF shared object for this
 * machine, as long as its headers say. CT_OK, or a status with one line set. */
ct_status plugin_file_check(const char *path);

#endif
