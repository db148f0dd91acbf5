/* util.h: small helpers shared by the core's files. */
#ifndef CT_UTIL_H
#define CT_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ctitan/util.h" /* ct_util_splitmix64 */

/* write(2) until all n bytes are out, retrying on EINTR. 0 or -1 (errno set). */
int ct_write_all(int fd, const void *buf, size_t n);
/* Monotonic seconds. */
double ct_now(void);
/* mkdir -p: 0, or -1 with errno set. */
int ct_mkdir_p(const char *path);
/* Command-line option "--name VALUE" or "--name=VALUE" at argv[*i]: 1 if it is that option (*val NULL
 * when the value is missing; *i moves past a separate value), else 0. */
int ct_cli_opt(int argc, char **argv, int *i, const char *name, const char **val);
/* Bytes this process may still map under its address-space limit (RLIMIT_AS, ulimit -v): the limit
 * minus VmSize. -1 when there is no limit. *limit (may be NULL) gets the limit in bytes, or -1. */
int64_t ct_address_space_left(int64_t *limit);
/* Opens a file to write ("w": truncate, "a": append) without following a symlink at its last
 * component, close-on-exec. NULL with errno set (ELOOP for a symlink: see ct_open_strerror). */
FILE *ct_fopen_nofollow(const char *path, const char *mode);
/* strerror, with a clear text for ELOOP from an O_NOFOLLOW open. */
const char *ct_open_strerror(int e);
/* 0 if path is a folder; -1 with errno set (ENOTDIR for a file). */
int ct_require_dir(const char *path);
/* Wall-clock time as ISO-8601 UTC with milliseconds: 2026-12-01T23:45:01.123Z (25 bytes). */
void ct_utc_iso(char *out, size_t len);

/* Host-side counter-based RNG on the SDK's splitmix64 (ct_util_splitmix64, ctitan/util.h): value i
 * of stream `key` depends on no other draw. Shared by parameter init, data order and sampling. */
double rng_uniform(uint64_t key, uint64_t i);  /* (0, 1) */
double rng_normal(uint64_t key, uint64_t i);   /* Box-Muller on draws 2i and 2i+1 */
uint64_t rng_hash_str(const char *s);          /* FNV-1a */

#endif
