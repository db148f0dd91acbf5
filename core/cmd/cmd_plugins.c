/* cmd_plugins.c: `ctitan plugins`: the search path's plugins, a folder's files, one plugin in full. */
#include "cmd/cmd_plugins.h"

#include "host/host.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static const char usage[] =
    "usage: ctitan plugins [FOLDER | FILE]\n"
    "  (none)   every ctitan-*.so on the search path ($CTITAN_PLUGIN_PATH, the binary's plugins/, the build's\n"
    "           plugins/): the files a manifest's bare name loads (model.name: llama3 -> ctitan-llama3.so),\n"
    "           each with kind, name, ABI version, path and description\n"
    "  FOLDER   every file in FOLDER, whatever its name: each plugin as above, and each file that is not a\n"
    "           loadable plugin on a \"?\" line saying why (not ELF, another machine, no ctitan_plugin_entry,\n"
    "           ABI version refused, ...); a plugin outside the search path is named by its path\n"
    "  FILE     one plugin: kind, name, the ABI version it was built against, description, and every\n"
    "           option with its manifest key, type, default, range or choices, and help\n"
    "Exit status 0; 2 for a path that does not exist, a FILE that is not a loadable plugin or a FOLDER\n"
    "without one; 1 when the search path holds no plugin.\n";

static const char *type_name(ct_opt_type t) {
    switch (t) {
    case CT_OPT_INT: return "int";
    case CT_OPT_FLOAT: return "float";
    case CT_OPT_STRING: return "string";
    case CT_OPT_BOOL: return "bool";
    }
    return "?";
}

/* The manifest section the core reads a plugin's options from (a quantizer's is quantize.dense.NAME). */
static const char *plugin_section(const ct_plugin_info *in, char *buf, size_t len) {
    switch (in->kind) {
    case CT_KIND_STRATEGY:
    case CT_KIND_SCHEDULE:
    case CT_KIND_PIPELINE: return "parallelism";
    case CT_KIND_QUANTIZER: snprintf(buf, len, "quantize.dense.%s", in->name); return buf;
    default: return plugin_kind_name(in->kind);
    }
}

static void describe(const plugin *p) {
    const ct_plugin_info *in = &p->info;
    char buf[200];
    const char *section = plugin_section(in, buf, sizeof buf);
    int n = 0;
    while (in->options && CT_AT(const ct_option_spec, in->options, n)->key) n++;
    printf("%s\n", p->path);
    printf("  kind         %s\n", plugin_kind_name(in->kind));
    printf("  name         %s\n", in->name);
    printf("  ABI          %u.%u (built against; this host speaks %d.%d)\n", in->abi_major, in->abi_minor,
           CT_ABI_MAJOR, CT_ABI_MINOR);
    printf("  description  %s\n", in->description ? in->description : "(none)");
    if (!n) {
        printf("  options      none\n");
        return;
    }
    printf("  options      %d, set as %s.KEY in a manifest or --%s.KEY=VALUE:\n", n, section, section);
    for (int i = 0; i < n; i++) { /* stepped by struct_size: the loader checked the list */
        const ct_option_spec *o = CT_AT(const ct_option_spec, in->options, i);
        int checks = CT_HAS_FIELD(o, ct_option_spec, choices);
        const char *range = checks ? o->range : NULL, *choices = checks ? o->choices : NULL;
        printf("    %s%s%s  %s, ", strchr(o->key, '.') ? "" : section, strchr(o->key, '.') ? "" : ".", o->key,
               type_name(o->type));
        if (o->default_value) printf("default %s", o->default_value);
        else printf("no default (unset unless given)");
        if (range) printf(", in %s", range);
        if (choices) printf(", one of %s", choices);
        printf("\n      %s\n", o->help && *o->help ? o->help : "(no help)");
    }
}

static ct_status list_folder(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "ctitan plugins: %s: cannot read the folder: %s\n", dir, strerror(errno));
        return CT_ERR_INVALID;
    }
    closedir(d);
    int files = 0, n = plugin_list(stdout, dir, &files);
    if (n > 0) return CT_OK;
    fflush(stdout);
    fprintf(stderr, "ctitan plugins: %s: no loadable plugin among its %d file%s\n", dir, files, files == 1 ? "" : "s");
    return CT_ERR_INVALID;
}

ct_status cmd_plugins(int argc, char **argv) {
    if (argc > 0 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
        fputs(usage, stdout);
        return CT_OK;
    }
    if (argc > 1) {
        fprintf(stderr, "ctitan plugins: one FOLDER or FILE at most, got %d arguments (see ctitan plugins --help)\n", argc);
        return CT_ERR_INVALID;
    }
    if (argc == 0) return plugin_list(stdout, NULL, NULL) > 0 ? CT_OK : CT_ERR_IO;
    const char *path = argv[0];
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "ctitan plugins: %s: no such file or folder (give a folder of plugins or a plugin's .so)\n", path);
        return CT_ERR_INVALID;
    }
    if (S_ISDIR(st.st_mode)) return list_folder(path);
    char local[4096];
    if (!strchr(path, '/')) { /* dlopen looks a bare name up on the library path, not here */
        snprintf(local, sizeof local, "./%s", path);
        path = local;
    }
    plugin *p = plugin_open(path);
    if (!p) {
        fprintf(stderr, "ctitan plugins: %s\n", ct_last_error());
        return CT_ERR_INVALID;
    }
    describe(p);
    plugin_unload(p);
    return CT_OK;
}
