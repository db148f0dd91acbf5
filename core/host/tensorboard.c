/* tensorboard.c: TensorBoard event files (see tensorboard.h). The protobuf wire format is small
 * enough to write directly: a field is a key (field number << 3 | wire type) as a varint, then a
 * varint (type 0), 8 bytes (type 1), a varint length and the bytes (type 2) or 4 bytes (type 5). */
#include "host/tensorboard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "host/host.h"
#include "base/util.h"

struct tb_writer {
    int fd;
    char path[4352];
};

/* ---- CRC-32C: byte-at-a-time over a 256-entry table of the reflected polynomial ---- */
static uint32_t crc_table[256];

static void crc_table_fill(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t tb_crc32c(uint32_t crc, const void *p, size_t n) {
    if (!crc_table[1]) crc_table_fill(); /* entry 1 is nonzero once filled; filling twice is harmless */
    const uint8_t *b = p;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ b[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

uint32_t tb_crc_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

static void put_le(uint8_t *out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) out[i] = (uint8_t)(v >> (8 * i));
}

void tb_record_frame(uint8_t *out, const void *payload, size_t n) {
    put_le(out, (uint64_t)n, 8);
    put_le(out + 8, tb_crc_mask(tb_crc32c(0, out, 8)), 4);
    memcpy(out + 12, payload, n);
    put_le(out + 12 + n, tb_crc_mask(tb_crc32c(0, payload, n)), 4);
}

/* ---- the protobuf encoder: appends to a fixed buffer; `over` records that something did not fit ---- */
typedef struct pb {
    uint8_t *p;
    size_t n, cap;
    int over;
} pb;

static void pb_bytes(pb *b, const void *s, size_t n) {
    if (b->over || n > b->cap - b->n) {
        b->over = 1;
        return;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void pb_varint(pb *b, uint64_t v) {
    uint8_t t[10];
    int k = 0;
    do {
        t[k++] = (uint8_t)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
    pb_bytes(b, t, (size_t)k);
}

static size_t varint_len(uint64_t v) {
    size_t k = 1;
    while (v > 0x7F) v >>= 7, k++;
    return k;
}

static void pb_key(pb *b, int field, int type) { pb_varint(b, (uint64_t)(field << 3 | type)); }

static void pb_string(pb *b, int field, const char *s, size_t n) {
    pb_key(b, field, 2);
    pb_varint(b, n);
    pb_bytes(b, s, n);
}

/* Summary.Value {tag = 1; simple_value = 2 (float)}: its encoded length */
static size_t value_len(const char *tag) {
    size_t t = strlen(tag);
    return 1 + varint_len(t) + t + 1 + 4;
}

size_t tb_event_encode(uint8_t *out, size_t cap, double wall_time, int64_t step, const char *version,
                       const tb_scalar *v, int n) {
    pb b = {out, 0, cap, 0};
    uint8_t le[8];
    uint64_t bits;
    memcpy(&bits, &wall_time, 8);
    put_le(le, bits, 8);
    pb_key(&b, 1, 1); /* wall_time: fixed64 */
    pb_bytes(&b, le, 8);
    pb_key(&b, 2, 0); /* step: varint; a negative int64 takes 10 bytes, as protobuf encodes it */
    pb_varint(&b, (uint64_t)step);
    if (version) {
        pb_string(&b, 3, version, strlen(version));
        return b.over ? 0 : b.n;
    }
    size_t summary = 0; /* Summary { repeated Value value = 1; } */
    for (int i = 0; i < n; i++) summary += 1 + varint_len(value_len(v[i].tag)) + value_len(v[i].tag);
    pb_key(&b, 5, 2);
    pb_varint(&b, summary);
    for (int i = 0; i < n; i++) {
        pb_key(&b, 1, 2);
        pb_varint(&b, value_len(v[i].tag));
        pb_string(&b, 1, v[i].tag, strlen(v[i].tag));
        float f = (float)v[i].value;
        uint32_t fb;
        memcpy(&fb, &f, 4);
        put_le(le, fb, 4);
        pb_key(&b, 2, 5); /* simple_value: fixed32 */
        pb_bytes(&b, le, 4);
    }
    return b.over ? 0 : b.n;
}

/* ---- the file ---- */
static double wall_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One event framed and written with a single write(2): once it returns, a crash of this process
 * leaves the record in the file. */
static ct_status event_write(tb_writer *w, int64_t step, const char *version, const tb_scalar *v, int n) {
    size_t cap = 64 + (version ? strlen(version) : 0);
    for (int i = 0; i < n; i++) cap += 16 + 2 * value_len(v[i].tag);
    uint8_t *buf = malloc(2 * cap + TB_FRAME_OVERHEAD);
    if (!buf) return ct_fail(CT_ERR_NOMEM, "cannot write %s: out of memory for an event of %d scalars", w->path, n);
    size_t len = tb_event_encode(buf, cap, wall_now(), step, version, v, n);
    ct_status st = CT_OK;
    if (!len) { /* cap bounds every field above: not reached */
        st = ct_fail(CT_ERR_INTERNAL, "cannot write %s: an event of %d scalars did not fit its buffer", w->path, n);
    } else {
        tb_record_frame(buf + cap, buf, len);
        if (ct_write_all(w->fd, buf + cap, len + TB_FRAME_OVERHEAD))
            st = ct_fail(CT_ERR_IO, "cannot write %s: %s", w->path, strerror(errno));
    }
    free(buf);
    return st;
}

tb_writer *tb_open(const char *folder) {
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1)) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_'; /* a file name, whatever the host is called */
    if (ct_mkdir_p(folder) || ct_require_dir(folder)) {
        ct_set_error("cannot create the folder %s: %s", folder, strerror(errno));
        return NULL;
    }
    tb_writer *w = calloc(1, sizeof *w);
    if (!w) {
        ct_set_error("out of memory");
        return NULL;
    }
    if (snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s", folder, (long long)time(NULL), host) >=
        (int)sizeof w->path) {
        ct_set_error("the event file's path under %s is too long", folder);
        goto fail;
    }
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        ct_set_error("cannot create %s: %s", w->path, strerror(errno));
        goto fail;
    }
    if (event_write(w, 0, "brain.Event:2", NULL, 0) != CT_OK) { /* its message names the file */
        close(w->fd);
        goto fail;
    }
    return w;
fail:
    free(w);
    return NULL;
}

ct_status tb_write(tb_writer *w, int64_t step, const tb_scalar *v, int n) { return event_write(w, step, NULL, v, n); }

const char *tb_path(const tb_writer *w) { return w->path; }

ct_status tb_close(tb_writer *w) {
    if (!w) return CT_OK;
    ct_status st = CT_OK;
    if (close(w->fd)) st = ct_fail(CT_ERR_IO, "cannot write %s: %s", w->path, strerror(errno));
    free(w);
    return st;
}
