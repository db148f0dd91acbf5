/* host.c: host services handed to plugins, memory counters, errors, tracing, plugin loader. */
#include "host/host.h"

#include "host/trace.h"
#include "base/util.h"

#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

mem_stats g_mem;
int g_log_level = CT_LOG_INFO;
int g_log_rank = -1;

static const char *mem_names[CT_MEM_NCATEGORIES] = {"params", "grads", "optimizer", "activations", "comm", "other", "master"};

const char *mem_category_name(ct_mem_category cat) {
    return (unsigned)cat < CT_MEM_NCATEGORIES ? mem_names[cat] : "?";
}

void mem_account(ct_mem_category cat, int64_t delta) {
    mem_account_owned(cat, NULL, delta);
}

void mem_account_owned(ct_mem_category cat, const char *owner, int64_t delta) {
    if ((unsigned)cat >= CT_MEM_NCATEGORIES) cat = CT_MEM_OTHER;
    memledger_note(cat, owner, delta); /* who holds the bytes, for memory snapshots */
    g_mem.cur[cat] += delta;
    g_mem.cur_total += delta;
    if (g_mem.cur[cat] > g_mem.peak[cat]) g_mem.peak[cat] = g_mem.cur[cat];
    if (g_mem.cur_total > g_mem.peak_total) g_mem.peak_total = g_mem.cur_total;
    trace_mem_sample();
}

void mem_reset_peaks(void) {
    memcpy(g_mem.peak, g_mem.cur, sizeof g_mem.peak);
    g_mem.peak_total = g_mem.cur_total;
}

static void vlog(ct_log_level level, const char *who, const char *fmt, va_list ap) {
    if ((int)level < g_log_level) return;
    static const char *names[] = {"debug", "info", "warn", "error"};
    FILE *f = level >= CT_LOG_WARN ? stderr : stdout;
    if (g_log_rank >= 0 && f == stdout) fprintf(f, "[rank %d] ", g_log_rank);
    if (level != CT_LOG_INFO || who) fprintf(f, "[%s%s%s] ", names[level & 3], who ? " " : "", who ? who : "");
    vfprintf(f, fmt, ap);
    fputc('\n', f);
    fflush(f);
}

/* A stream that prefixes every line with "[rank N] " (stderr on many ranks). */
typedef struct prefix_stream {
    int fd;
    int at_line_start;
    char prefix[32];
} prefix_stream;

/* Each line goes out in one write (prefix included) so ranks sharing a pipe do not interleave. */
static ssize_t prefix_write(void *cookie, const char *buf, size_t n) {
    prefix_stream *p = cookie;
    size_t done = 0;
    while (done < n) {
        const char *nl = memchr(buf + done, '\n', n - done);
        size_t len = nl ? (size_t)(nl - (buf + done)) + 1 : n - done;
        char line[4096];
        size_t pre = p->at_line_start ? strlen(p->prefix) : 0, take = len;
        if (pre + take > sizeof line) take = sizeof line - pre;
        memcpy(line, p->prefix, pre);
        memcpy(line + pre, buf + done, take);
        if (write(p->fd, line, pre + take) < 0) return -1;
        p->at_line_start = nl != NULL && take == len;
        done += take;
    }
    return (ssize_t)n;
}

void log_set_rank(int rank, int world) {
    static prefix_stream ps;
    static int wrapped, silenced;
    if (world <= 1 || rank < 0) return;
    g_log_rank = rank;
    snprintf(ps.prefix, sizeof ps.prefix, "[rank %d] ", rank); /* again when the comm confirms it */
    if (!wrapped) {
        ps.fd = 2;
        ps.at_line_start = 1;
        cookie_io_functions_t io = {.write = prefix_write};
        FILE *f = fopencookie(&ps, "w", io);
        if (f) {
            setvbuf(f, NULL, _IOLBF, 0);
            fflush(stderr);
            stderr = f;
            wrapped = 1;
        }
    }
    if (rank != 0 && !silenced) { /* start-up lines, metrics and samples come from rank 0; every rank reports its errors */
        fflush(stdout);
        FILE *null = freopen("/dev/null", "w", stdout);
        (void)null;
        silenced = 1;
    }
}

/* The launchers' variables: (rank, world size), in the order mesh_env_world_size reads them. */
void log_set_rank_from_env(void) {
    static const char *vars[][2] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}, {"PMI_RANK", "PMI_SIZE"},
                                    {"PMIX_RANK", "PMIX_SIZE"}, {"SLURM_PROCID", "SLURM_NTASKS"},
                                    {"RANK", "WORLD_SIZE"}};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *r = getenv(vars[i][0]), *w = getenv(vars[i][1]);
        if (!r || !w) continue;
        char *end_r, *end_w;
        long rank = strtol(r, &end_r, 10), world = strtol(w, &end_w, 10);
        if (*r && !*end_r && *w && !*end_w && rank >= 0 && rank < world && world <= INT_MAX)
            log_set_rank((int)rank, (int)world);
        return;
    }
}

/* ---- the host-services table ---- */
static plugin *ctx_of(const ct_host *h) { return (plugin *)h->ctx; }

/* The owner a plugin's bytes are charged to in memory snapshots: its name. */
static const char *owner_of(const ct_host *h) {
    const plugin *p = h ? ctx_of(h) : NULL;
    return p && p->info.name ? p->info.name : NULL;
}

static void h_log(const ct_host *h, ct_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(level, ctx_of(h)->info.name ? ctx_of(h)->info.name : ctx_of(h)->path, fmt, ap);
    va_end(ap);
}

static void h_set_error(const ct_host *h, const char *fmt, ...) {
    char msg[1800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *who = ctx_of(h)->info.name ? ctx_of(h)->info.name : "plugin";
    ct_set_error("%s: %s", who, msg);
    ct_error_keep();
}

/* Host allocations carry a 64-byte header with their size and category. */
typedef struct alloc_header {
    size_t bytes;
    int cat;
    char pad[64 - sizeof(size_t) - sizeof(int)];
} alloc_header;

static void *h_mem_alloc(const ct_host *h, size_t bytes, ct_mem_category cat) {
    if (bytes > SIZE_MAX - 128) return NULL;
    alloc_header *a = aligned_alloc(64, (sizeof *a + bytes + 63) & ~(size_t)63);
    if (!a) return NULL;
    a->bytes = bytes;
    a->cat = cat;
    mem_account_owned(cat, owner_of(h), (int64_t)bytes);
    return a + 1;
}

static void h_mem_free(const ct_host *h, void *p) {
    if (!p) return;
    alloc_header *a = (alloc_header *)p - 1;
    mem_account_owned((ct_mem_category)a->cat, owner_of(h), -(int64_t)a->bytes);
    free(a);
}

static void h_mem_account(const ct_host *h, ct_mem_category cat, int64_t delta) {
    mem_account_owned(cat, owner_of(h), delta);
}

static const char *opt_raw(const ct_host *h, const char *key, ct_opt_type want, ct_status *st) {
    plugin *p = ctx_of(h);
    const ct_option_spec *spec = NULL; /* stepped by struct_size: the loader checked the list */
    for (int i = 0; p->info.options && CT_AT(const ct_option_spec, p->info.options, i)->key; i++)
        if (strcmp(CT_AT(const ct_option_spec, p->info.options, i)->key, key) == 0) {
            spec = CT_AT(const ct_option_spec, p->info.options, i);
            break;
        }
    if (!spec || spec->type != want) {
        ct_set_error("%s: asked for option '%s' it did not declare (or with another type)",
                     p->info.name ? p->info.name : p->path, key);
        *st = CT_ERR_INTERNAL;
        return NULL;
    }
    char full[512];
    int absolute = strchr(key, '.') != NULL; /* a key of another section, spelled whole */
    if ((absolute ? snprintf(full, sizeof full, "%s", key) : snprintf(full, sizeof full, "%s.%s", p->section, key)) >=
        (int)sizeof full) {
        ct_set_error("%s: option key '%.64s...' is too long", p->info.name ? p->info.name : p->path, key);
        *st = CT_ERR_INVALID;
        return NULL;
    }
    const char *s = NULL;
    if (p->mf && mf_get_str(p->mf, full, &s) == 0) {
        *st = CT_OK;
        return s;
    }
    *st = spec->default_value ? CT_OK : CT_ERR_INVALID;
    return spec->default_value;
}

static ct_status h_opt_int(const ct_host *h, const char *key, int64_t *out) {
    ct_status st;
    const char *s = opt_raw(h, key, CT_OPT_INT, &st);
    if (st != CT_OK) return st;
    return mf_parse_int(s, out) ? CT_ERR_INVALID : CT_OK;
}
static ct_status h_opt_float(const ct_host *h, const char *key, double *out) {
    ct_status st;
    const char *s = opt_raw(h, key, CT_OPT_FLOAT, &st);
    if (st != CT_OK) return st;
    return mf_parse_float(s, out) ? CT_ERR_INVALID : CT_OK;
}
static ct_status h_opt_bool(const ct_host *h, const char *key, int *out) {
    ct_status st;
    const char *s = opt_raw(h, key, CT_OPT_BOOL, &st);
    if (st != CT_OK) return st;
    return mf_parse_bool(s, out) ? CT_ERR_INVALID : CT_OK;
}
static ct_status h_opt_string(const ct_host *h, const char *key, const char **out) {
    ct_status st;
    const char *s = opt_raw(h, key, CT_OPT_STRING, &st);
    if (st != CT_OK) return st;
    *out = s;
    return CT_OK;
}

static void h_trace_begin(const ct_host *h, const char *name) {
    (void)h;
    trace_begin(name);
}
static void h_trace_end(const ct_host *h, const char *name) {
    (void)h;
    trace_end(name);
}

static void host_table_init(plugin *p) {
    p->host = (ct_host){
        .struct_size = sizeof(ct_host),
        .abi_major = CT_ABI_MAJOR,
        .abi_minor = CT_ABI_MINOR,
        .ctx = p,
        .log = h_log,
        .set_error = h_set_error,
        .mem_alloc = h_mem_alloc,
        .mem_free = h_mem_free,
        .mem_account = h_mem_account,
        .opt_int = h_opt_int,
        .opt_float = h_opt_float,
        .opt_bool = h_opt_bool,
        .opt_string = h_opt_string,
        .trace_begin = h_trace_begin,
        .trace_end = h_trace_end,
    };
}

/* ---- loader ---- */
const char *plugin_kind_name(ct_plugin_kind kind) {
    switch (kind) {
    case CT_KIND_DEVICE: return "device";
    case CT_KIND_MODEL: return "model";
    case CT_KIND_OPTIMIZER: return "optimizer";
    case CT_KIND_COMM: return "comm";
    case CT_KIND_STRATEGY: return "strategy";
    case CT_KIND_QUANTIZER: return "quantizer";
    case CT_KIND_SCHEDULE: return "schedule";
    case CT_KIND_PIPELINE: return "pipeline";
    }
    return "unknown";
}

/* The oldest minor of CT_ABI_MAJOR the host accepts, per kind: it reads the fields of that minor
 * without a CT_HAS_FIELD guard. Raise a kind's entry when the host starts to rely on a field added
 * later; a field newer than the entry is read only behind CT_HAS_FIELD. */
static const struct {
    ct_plugin_kind kind;
    uint32_t oldest_minor;
} abi_oldest_minor[] = {
    {CT_KIND_DEVICE, 0}, {CT_KIND_MODEL, 0},    {CT_KIND_OPTIMIZER, 0}, {CT_KIND_COMM, 0},
    {CT_KIND_STRATEGY, 0}, {CT_KIND_QUANTIZER, 0}, {CT_KIND_SCHEDULE, 0}, {CT_KIND_PIPELINE, 0},
};

uint32_t plugin_oldest_minor(ct_plugin_kind kind) {
    for (size_t i = 0; i < sizeof abi_oldest_minor / sizeof abi_oldest_minor[0]; i++)
        if (abi_oldest_minor[i].kind == kind) return abi_oldest_minor[i].oldest_minor;
    return 0; /* an unknown kind is refused by its caller, which asked for another */
}

/* The plugin's ABI version against the host's: another major, a newer minor, or a minor older than
 * its kind needs, is one line naming the file and both versions. */
static ct_status abi_check(const char *path, const ct_plugin_info *info) {
    unsigned maj = info->abi_major, min = info->abi_minor, oldest = plugin_oldest_minor(info->kind);
    if (maj != CT_ABI_MAJOR)
        ct_set_error("%s: built against ctitan ABI %u.%u; this host speaks ABI %d.%d: rebuild it against this SDK "
                     "(pkg-config ctitan-sdk)", path, maj, min, CT_ABI_MAJOR, CT_ABI_MINOR);
    else if (min > CT_ABI_MINOR)
        ct_set_error("%s: built against ctitan ABI %u.%u, newer than the ABI %d.%d this host speaks: rebuild it "
                     "against this SDK (pkg-config ctitan-sdk) or use a newer ctitan", path, maj, min, CT_ABI_MAJOR,
                     CT_ABI_MINOR);
    else if (min < oldest)
        ct_set_error("%s: built against ctitan ABI %u.%u; this host speaks ABI %d.%d and takes %s plugins of ABI "
                     "%d.%u or newer: rebuild it against this SDK (pkg-config ctitan-sdk)", path, maj, min,
                     CT_ABI_MAJOR, CT_ABI_MINOR, plugin_kind_name(info->kind), CT_ABI_MAJOR, oldest);
    else return CT_OK;
    return CT_ERR_INVALID;
}

/* A plugin's option list is an array of ABI structs (ctitan/abi.h): stepped by its first entry's
 * struct_size, which must cover every field the host reads, and be the same in every entry. */
static ct_status options_check(const char *path, const ct_option_spec *opts) {
    if (!opts) return CT_OK;
    if (!CT_HAS_FIELD(opts, ct_option_spec, help))
        return ct_fail(CT_ERR_INVALID, "%s: option list's first entry has struct_size %zu, less than the %zu of ABI "
                       "%d.0's ct_option_spec: set it to sizeof(ct_option_spec) (an empty list is options = NULL)",
                       path, opts->struct_size, offsetof(ct_option_spec, help) + sizeof opts->help, CT_ABI_MAJOR);
    for (int i = 0; CT_AT(const ct_option_spec, opts, i)->key; i++) {
        const ct_option_spec *o = CT_AT(const ct_option_spec, opts, i);
        if (o->struct_size == opts->struct_size) continue;
        return ct_fail(CT_ERR_INVALID, "%s: option '%.64s' has struct_size %zu and the list's first entry %zu: every "
                       "entry but the NULL-key terminator must have sizeof(ct_option_spec)", path, o->key,
                       o->struct_size, opts->struct_size);
    }
    return CT_OK;
}

/* A plugin's search knobs (ABI 2.21): stepped like the options, each naming one of its options with at
 * least one value. Read only from a plugin built against 2.21 or later. */
static ct_status knobs_check(const char *path, const ct_plugin_info *info) {
    const ct_search_knob *k = plugin_knobs(info);
    if (!k) return CT_OK;
    if (!CT_HAS_FIELD(k, ct_search_knob, label))
        return ct_fail(CT_ERR_INVALID, "%s: search knob list's first entry has struct_size %zu, less than the %zu of "
                       "ABI 2.21's ct_search_knob: set it to sizeof(ct_search_knob)", path, k->struct_size,
                       offsetof(ct_search_knob, label) + sizeof k->label);
    for (int i = 0; CT_AT(const ct_search_knob, k, i)->key; i++) {
        const ct_search_knob *e = CT_AT(const ct_search_knob, k, i);
        int known = 0;
        for (int j = 0; info->options && CT_AT(const ct_option_spec, info->options, j)->key && !known; j++)
            known = !strcmp(CT_AT(const ct_option_spec, info->options, j)->key, e->key);
        if (e->struct_size != k->struct_size || !known || !e->values || !*e->values)
            return ct_fail(CT_ERR_INVALID, "%s: search knob '%.64s': expected an entry of sizeof(ct_search_knob) naming "
                           "one of the plugin's options, with its values (\"a|b\")", path, e->key);
    }
    return CT_OK;
}

const ct_search_knob *plugin_knobs(const ct_plugin_info *info) {
    if (info->abi_major != CT_ABI_MAJOR || info->abi_minor < 21) return NULL;
    return info->knobs;
}

/* The folder of the running binary + "/plugins". */
static void exe_plugin_dir(char *buf, size_t len) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    buf[0] = 0;
    if (n <= 0) return;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    if (strlen(exe) + sizeof "/plugins" <= len) {
        strcpy(buf, exe);
        strcat(buf, "/plugins");
    }
}

/* Search path: an explicit folder (`ctitan plugins FOLDER`; NULL otherwise), $CTITAN_PLUGIN_PATH
 * (':'-separated), the binary's plugins folder, the build's. Never the manifest's folder: a manifest
 * in a folder someone else can write would load the ctitan-*.so beside it, and a plugin's
 * constructors run before any check. A manifest that wants a plugin beside it names it by path. */
int plugin_search_dirs(const char *first_dir, char dirs[][PATH_MAX], int max) {
    int n = 0;
    if (first_dir && n < max && strlen(first_dir) < PATH_MAX) strcpy(dirs[n++], first_dir);
    const char *env = getenv("CTITAN_PLUGIN_PATH");
    while (env && *env && n < max) {
        size_t len = strcspn(env, ":");
        if (len) snprintf(dirs[n++], PATH_MAX, "%.*s", (int)len, env);
        env += len + (env[len] == ':');
    }
    if (n < max) exe_plugin_dir(dirs[n++], PATH_MAX);
#ifdef CT_BUILD_PLUGIN_DIR
    if (n < max && strcmp(dirs[n - 1], CT_BUILD_PLUGIN_DIR)) snprintf(dirs[n++], PATH_MAX, "%s", CT_BUILD_PLUGIN_DIR);
#endif
    return n;
}

#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define HOST_ELF_DATA ELFDATA2MSB
#else
#define HOST_ELF_DATA ELFDATA2LSB
#endif

static const char *file_kind(mode_t m) {
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket"
           : S_ISCHR(m) || S_ISBLK(m) ? "a device" : "not a regular file";
}

/* The ELF machine this process runs as, from its own header (0 when it cannot be read). */
static unsigned host_elf_machine(void) {
    static unsigned machine = ~0u;
    if (machine != ~0u) return machine;
    machine = 0;
    Elf64_Ehdr eh;
    int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (fd >= 0 && pread(fd, &eh, sizeof eh, 0) == (ssize_t)sizeof eh && !memcmp(eh.e_ident, ELFMAG, SELFMAG))
        machine = eh.e_machine;
    if (fd >= 0) close(fd);
    return machine;
}

/* end = off + n * size, or -1 when that overflows. */
static int64_t table_end(uint64_t off, uint64_t n, uint64_t size) {
    uint64_t bytes, end;
    if (__builtin_mul_overflow(n, size, &bytes) || __builtin_add_overflow(off, bytes, &end) || end > INT64_MAX)
        return -1;
    return (int64_t)end;
}

/* Checks a plugin file before dlopen maps it and runs its constructors: a regular file (opened so
 * that a FIFO does not block and a terminal is not adopted), a 64-bit ELF shared object for this
 * machine, and long enough for every table and loadable segment its headers describe (dlopen
 * maps segments past the end of a truncated file, and touching them raises SIGBUS). */
ct_status plugin_file_check(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return ct_fail(CT_ERR_IO, "%s: cannot open plugin: %s", path, strerror(errno));
    struct stat st;
    Elf64_Ehdr eh;
    Elf64_Phdr *ph = NULL;
    ct_status rc = CT_ERR_INVALID;
    if (fstat(fd, &st) != 0) {
        rc = ct_fail(CT_ERR_IO, "%s: cannot stat plugin: %s", path, strerror(errno));
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        ct_set_error("%s: not a plugin: %s, expected a shared object (.so)", path, file_kind(st.st_mode));
        goto done;
    }
    int64_t size = st.st_size;
    if (size < (int64_t)sizeof eh || pread(fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh) {
        ct_set_error("%s: not a plugin: %lld bytes, shorter than an ELF header (%zu bytes)", path,
                     (long long)size, sizeof eh);
        goto done;
    }
    if (memcmp(eh.e_ident, ELFMAG, SELFMAG)) {
        ct_set_error("%s: not a plugin: no ELF magic (expected a shared object built for this machine)", path);
        goto done;
    }
    if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != HOST_ELF_DATA) {
        ct_set_error("%s: not a plugin for this machine: ELF class %d, data %d; expected class %d, data %d",
                     path, eh.e_ident[EI_CLASS], eh.e_ident[EI_DATA], ELFCLASS64, HOST_ELF_DATA);
        goto done;
    }
    if (eh.e_type != ET_DYN) {
        ct_set_error("%s: not a plugin: ELF type %u, expected a shared object (%u)", path, eh.e_type, ET_DYN);
        goto done;
    }
    unsigned machine = host_elf_machine();
    if (machine && eh.e_machine != machine) {
        ct_set_error("%s: plugin built for ELF machine %u, this process is machine %u", path, eh.e_machine, machine);
        goto done;
    }
    if (eh.e_phnum == 0 || eh.e_phentsize != sizeof(Elf64_Phdr) || (eh.e_shnum && eh.e_shentsize != sizeof(Elf64_Shdr))) {
        ct_set_error("%s: not a plugin: %u program headers of %u bytes, %u section headers of %u bytes", path,
                     eh.e_phnum, eh.e_phentsize, eh.e_shnum, eh.e_shentsize);
        goto done;
    }
    /* the least size the headers promise: both header tables and every segment's file bytes */
    int64_t need = table_end(eh.e_phoff, eh.e_phnum, sizeof(Elf64_Phdr)), sh = table_end(eh.e_shoff, eh.e_shnum, sizeof(Elf64_Shdr));
    if (need < 0 || sh < 0) {
        ct_set_error("%s: not a plugin: ELF header tables lie past any file size", path);
        goto done;
    }
    if (sh > need) need = sh;
    if (need <= size) {
        size_t bytes = (size_t)eh.e_phnum * sizeof *ph;
        if (!(ph = malloc(bytes)) || pread(fd, ph, bytes, (off_t)eh.e_phoff) != (ssize_t)bytes) {
            rc = ct_fail(ph ? CT_ERR_IO : CT_ERR_NOMEM, "%s: cannot read its program headers: %s", path,
                         ph ? strerror(errno) : "out of memory");
            goto done;
        }
        for (int i = 0; i < eh.e_phnum; i++) {
            int64_t end = table_end(ph[i].p_offset, 1, ph[i].p_filesz);
            if (ph[i].p_type != PT_LOAD) continue;
            if (end < 0) {
                ct_set_error("%s: not a plugin: segment %d lies past any file size", path, i);
                goto done;
            }
            if (end > need) need = end;
        }
    }
    if (need > size) {
        ct_set_error("%s: truncated: %lld bytes, the ELF headers say at least %lld", path, (long long)size,
                     (long long)need);
        goto done;
    }
    rc = CT_OK;
done:
    free(ph);
    close(fd);
    return rc;
}

/* Anything by that name: a directory or FIFO named like a plugin is reported by plugin_file_check,
 * not skipped in favour of a later folder. */
static int path_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* Under an address-space limit (ulimit -v) some libraries spin instead of failing when a mapping is
 * refused: OpenBLAS, which the CPU plugin links, retries its buffer mmap forever, and it maps its
 * library and one 128 MiB buffer per OpenMP thread as it loads (167 MiB with one thread, measured
 * with VmSize around dlopen). So under a limit the loader has OpenBLAS load with one thread (its
 * thread variables set to 1: the CPU plugin sets its own count from device.threads, after checking
 * the room for it, so they choose nothing else) and, before the first plugin loads, wants
 * PLUGIN_MIN_ROOM left. Without a limit nothing changes. */
#define PLUGIN_MIN_ROOM ((int64_t)256 << 20)
static ct_status address_space_check(const char *path) {
    static int checked;
    int64_t limit, left = ct_address_space_left(&limit);
    if (checked || left < 0) return CT_OK;
    setenv("OMP_NUM_THREADS", "1", 1); /* OpenBLAS built with OpenMP reads this one */
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    setenv("GOTO_NUM_THREADS", "1", 1);
    if (left < PLUGIN_MIN_ROOM)
        return ct_fail(CT_ERR_NOMEM, "%s: cannot load plugins under the address-space limit (ulimit -v %lld KiB): "
                       "%lld MiB left, plugins need %lld MiB as they load (OpenBLAS alone maps 167 MiB): raise "
                       "ulimit -v", path, (long long)(limit >> 10), (long long)(left >> 20),
                       (long long)(PLUGIN_MIN_ROOM >> 20));
    checked = 1;
    return CT_OK;
}

plugin *plugin_open(const char *path) {
    if (plugin_file_check(path) != CT_OK || address_space_check(path) != CT_OK) return NULL;
    dlerror();
    /* RTLD_NODELETE: a plugin may start threads (OpenMP, CUDA) that outlive its handle */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) {
        ct_set_error("%s: cannot load plugin: %s", path, dlerror());
        return NULL;
    }
    ct_plugin_entry_fn entry;
    *(void **)&entry = dlsym(h, CT_PLUGIN_ENTRY_NAME);
    if (!entry) {
        ct_set_error("%s: not a ctitan plugin: it does not export '%s'", path, CT_PLUGIN_ENTRY_NAME);
        dlclose(h);
        return NULL;
    }
    plugin *p = calloc(1, sizeof *p);
    if (!p) {
        dlclose(h);
        ct_set_error("out of memory");
        return NULL;
    }
    p->path = strdup(path);
    p->handle = h;
    p->section = "";
    host_table_init(p);
    p->info.struct_size = sizeof p->info;
    ct_clear_error();
    ct_status st = entry(&p->host, &p->info);
    if (st != CT_OK) {
        ct_set_error("%s: plugin entry failed (status %d): %s", path, st, ct_last_error());
        goto fail;
    }
    if (abi_check(path, &p->info) != CT_OK) goto fail;
    if (!p->info.name || !p->info.api) {
        ct_set_error("%s: plugin entry returned no name or no API table", path);
        goto fail;
    }
    if (options_check(path, p->info.options) != CT_OK || knobs_check(path, &p->info) != CT_OK) goto fail;
    return p;
fail:
    plugin_unload(p);
    return NULL;
}

plugin *plugin_load(const char *name, ct_plugin_kind kind, const char *section, const manifest *mf) {
    char path[PATH_MAX];
    const char *mdir = mf ? mf->dir : NULL;
    if (strchr(name, '/') || (strlen(name) > 3 && strcmp(name + strlen(name) - 3, ".so") == 0)) {
        int w = name[0] == '/' || !mdir ? snprintf(path, sizeof path, "%s", name)
                                         : snprintf(path, sizeof path, "%s/%s", mdir, name + (strncmp(name, "./", 2) ? 0 : 2));
        if (w < 0 || w >= (int)sizeof path) {
            ct_set_error("%s plugin path '%.80s...' is longer than PATH_MAX", plugin_kind_name(kind), name);
            return NULL;
        }
        if (!path_exists(path)) {
            ct_set_error("%s plugin '%s' not found at %s", plugin_kind_name(kind), name, path);
            return NULL;
        }
    } else {
        char lower[128];
        size_t i = 0;
        if (strlen(name) >= sizeof lower) { /* truncated, it could name another plugin */
            ct_set_error("%s plugin name '%.40s...' is longer than %zu characters", plugin_kind_name(kind), name,
                         sizeof lower - 1);
            return NULL;
        }
        for (; name[i]; i++) lower[i] = (char)tolower((unsigned char)name[i]);
        lower[i] = 0;
        char dirs[16][PATH_MAX];
        int nd = plugin_search_dirs(NULL, dirs, 16);
        int found = 0;
        char searched[2048] = "";
        size_t used = 0;
        for (int d = 0; d < nd && !found; d++) {
            if (snprintf(path, sizeof path, "%s/ctitan-%s.so", dirs[d], lower) >= (int)sizeof path) continue;
            found = path_exists(path);
            int w = snprintf(searched + used, sizeof searched - used, "%s%s", used ? ", " : "", dirs[d]);
            if (w > 0 && (size_t)w < sizeof searched - used) used += (size_t)w;
        }
        if (!found) {
            char beside[PATH_MAX], hint[sizeof lower + 96] = "";
            if (mdir && snprintf(beside, sizeof beside, "%s/ctitan-%s.so", mdir, lower) < (int)sizeof beside &&
                path_exists(beside))
                snprintf(hint, sizeof hint, "; the manifest's folder is not searched: name ./ctitan-%s.so to load the one there",
                         lower);
            ct_set_error("%s plugin '%s' not found: no ctitan-%s.so in %s (set CTITAN_PLUGIN_PATH or give a path%s)",
                         plugin_kind_name(kind), name, lower, searched, hint);
            return NULL;
        }
    }
    plugin *p = plugin_open(path);
    if (!p) return NULL;
    if (p->info.kind != kind) {
        ct_set_error("%s: plugin '%s' is a %s plugin, expected a %s plugin", path, p->info.name,
                     plugin_kind_name(p->info.kind), plugin_kind_name(kind));
        plugin_unload(p);
        return NULL;
    }
    p->section = section;
    p->mf = mf;
    return p;
}

void plugin_unload(plugin *p) {
    if (!p) return;
#ifndef __SANITIZE_ADDRESS__
    if (p->handle) dlclose(p->handle);
#endif /* under ASan a plugin stays mapped, so a leak report at exit can name its frames */
    free(p->path);
    free(p);
}

/* A folder's entries to examine, sorted: every name but "." and ".." (all), or only ctitan-*.so.
 * NULL when the folder cannot be read (*n = 0) or out of memory. */
static char (*dir_names(const char *dir, int all, int *n))[256] {
    DIR *d = opendir(dir);
    char (*names)[256] = NULL;
    *n = 0;
    if (!d) return NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || l >= 256) continue;
        if (!all && (strncmp(e->d_name, "ctitan-", 7) || l < 4 || strcmp(e->d_name + l - 3, ".so"))) continue;
        void *grown = realloc(names, sizeof(*names) * (size_t)(*n + 1));
        if (!grown) break;
        names = grown;
        memcpy(names[(*n)++], e->d_name, l + 1);
    }
    closedir(d);
    if (names) qsort(names, (size_t)*n, sizeof *names, (int (*)(const void *, const void *))strcmp);
    return names;
}

/* One folder: a plugin is "KIND NAME ABI PATH" and its description below; any other file is
 * "? FILE - why" with the loader's own error. Subfolders are skipped. */
static void list_dir(FILE *out, const char *dir, int all, int *count, int *files) {
    int nn;
    char (*names)[256] = dir_names(dir, all, &nn);
    for (int i = 0; i < nn; i++) {
        char path[PATH_MAX + 256];
        struct stat st;
        if (snprintf(path, sizeof path, "%s/%s", dir, names[i]) >= (int)sizeof path) continue;
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) continue;
        (*files)++;
        plugin *p = plugin_open(path);
        if (!p) {
            fprintf(out, "%-10s %-12s %-6s %s\n", "?", names[i], "-", ct_last_error());
            continue;
        }
        fprintf(out, "%-10s %-12s %u.%-4u %s\n%31s%s\n", plugin_kind_name(p->info.kind), p->info.name,
                p->info.abi_major, p->info.abi_minor, path, "", p->info.description ? p->info.description : "");
        plugin_unload(p);
        (*count)++;
    }
    free(names);
}

int plugin_list(FILE *out, const char *folder, int *files) {
    char dirs[16][PATH_MAX], seen[16][PATH_MAX];
    int nd = folder ? 1 : plugin_search_dirs(NULL, dirs, 16), count = 0, nfiles = 0;
    if (folder) snprintf(dirs[0], PATH_MAX, "%s", folder);
    fprintf(out, "host ABI %d.%d (CT_ABI_MAJOR.CT_ABI_MINOR of ctitan/abi.h)\n", CT_ABI_MAJOR, CT_ABI_MINOR);
    fprintf(out, "%-10s %-12s %-6s %s\n", "KIND", "NAME", "ABI", "PATH / DESCRIPTION");
    for (int d = 0; d < nd; d++) {
        if (!realpath(dirs[d], seen[d])) seen[d][0] = 0;
        int dup = !seen[d][0];
        for (int j = 0; j < d && !dup; j++) dup = strcmp(seen[j], seen[d]) == 0;
        if (!dup) list_dir(out, dirs[d], folder != NULL, &count, &nfiles);
    }
    if (files) *files = nfiles;
    return count;
}
