/* util.h: small helpers shared by the core's files. */
#ifndef CT_UTIL_H
#define CT_UTIL_H

#include <stddef.h>

/* Formats one error line into err (err may be NULL or errlen 0: nothing is written). */
void ct_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* write(2) until all n bytes are out, retrying on EINTR. 0 or -1 (errno set). */
int ct_write_all(int fd, const void *buf, size_t n);
/* Monotonic seconds. */
double ct_now(void);
/* mkdir -p: 0, or -1 with errno set. */
int ct_mkdir_p(const char *path);

#endif
