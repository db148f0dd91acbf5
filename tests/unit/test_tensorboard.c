/* test_tensorboard: the TensorBoard event writer (core/host/tensorboard.c).
 *
 * CRC-32C against the published check vectors (RFC 3720 B.4 and the "123456789" check value); the
 * records the writer frames are read back with a decoder written here from the TFRecord and protobuf
 * wire formats, so both framing and encoding are checked against the spec, not against themselves. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/host.h"
#include "host/tensorboard.h"
#include "tmpdir.h"

static void test_crc32c_check_vectors(void **state) {
    (void)state;
    uint8_t b[32];
    assert_int_equal(tb_crc32c(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(tb_crc32c(0, "", 0), 0);
    memset(b, 0, sizeof b);
    assert_int_equal(tb_crc32c(0, b, 32), 0x8A9136AAu);
    memset(b, 0xFF, sizeof b);
    assert_int_equal(tb_crc32c(0, b, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++) b[i] = (uint8_t)i;
    assert_int_equal(tb_crc32c(0, b, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++) b[i] = (uint8_t)(31 - i);
    assert_int_equal(tb_crc32c(0, b, 32), 0x113FDB5Cu);
    /* continuing from a partial CRC gives the whole one */
    assert_int_equal(tb_crc32c(tb_crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
}

static uint32_t unmask(uint32_t m) {
    uint32_t r = m - 0xa282ead8u;
    return (r << 15) | (r >> 17);
}

static void test_crc_mask_is_tfrecords(void **state) {
    (void)state;
    /* rotate right by 15, add the constant: undone by subtracting and rotating left */
    const uint32_t c[] = {0, 1, 0xE3069283u, 0xFFFFFFFFu, 0x80000000u};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) assert_int_equal(unmask(tb_crc_mask(c[i])), c[i]);
    assert_int_equal(tb_crc_mask(0), 0xa282ead8u);
    assert_int_equal(tb_crc_mask(1u << 15), 0xa282ead9u);
}

/* ---- a reader for what the writer frames ---- */
static uint64_t get_le(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* One TFRecord at p (n bytes left): its payload and length, checked; the bytes it took. */
static size_t record_read(const uint8_t *p, size_t n, const uint8_t **payload, size_t *len) {
    assert_true(n >= TB_FRAME_OVERHEAD);
    *len = (size_t)get_le(p, 8);
    assert_true(*len <= n - TB_FRAME_OVERHEAD);
    assert_int_equal(get_le(p + 8, 4), tb_crc_mask(tb_crc32c(0, p, 8)));
    *payload = p + 12;
    assert_int_equal(get_le(p + 12 + *len, 4), tb_crc_mask(tb_crc32c(0, p + 12, *len)));
    return *len + TB_FRAME_OVERHEAD;
}

static uint64_t varint(const uint8_t **p, const uint8_t *end) {
    uint64_t v = 0;
    for (int s = 0; s < 70; s += 7) {
        assert_true(*p < end);
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7F) << s;
        if (!(b & 0x80)) return v;
    }
    fail_msg("varint longer than 10 bytes");
    return 0;
}

/* What an Event holds, decoded field by field (unknown fields fail the test). */
typedef struct event {
    double wall_time;
    int64_t step;
    char version[32];
    int n;
    char tag[8][64];
    float value[8];
} event;

static void value_decode(const uint8_t *p, const uint8_t *end, event *e) {
    assert_true(e->n < 8);
    while (p < end) {
        uint64_t key = varint(&p, end);
        if (key == (1 << 3 | 2)) {
            uint64_t n = varint(&p, end);
            assert_true(n < 64 && n <= (uint64_t)(end - p));
            memcpy(e->tag[e->n], p, n);
            e->tag[e->n][n] = 0;
            p += n;
        } else if (key == (2 << 3 | 5)) {
            assert_true(end - p >= 4);
            uint32_t b = (uint32_t)get_le(p, 4);
            memcpy(&e->value[e->n], &b, 4);
            p += 4;
        } else {
            fail_msg("Summary.Value: unexpected key %llu", (unsigned long long)key);
        }
    }
    e->n++;
}

static void event_decode(const uint8_t *p, size_t len, event *e) {
    const uint8_t *end = p + len;
    memset(e, 0, sizeof *e);
    while (p < end) {
        uint64_t key = varint(&p, end), n, bits;
        switch (key) {
        case 1 << 3 | 1:
            assert_true(end - p >= 8);
            bits = get_le(p, 8);
            memcpy(&e->wall_time, &bits, 8);
            p += 8;
            break;
        case 2 << 3 | 0: e->step = (int64_t)varint(&p, end); break;
        case 3 << 3 | 2:
            n = varint(&p, end);
            assert_true(n < sizeof e->version && n <= (uint64_t)(end - p));
            memcpy(e->version, p, n);
            p += n;
            break;
        case 5 << 3 | 2: {
            n = varint(&p, end);
            assert_true(n <= (uint64_t)(end - p));
            const uint8_t *s = p, *send = p + n;
            while (s < send) {
                assert_int_equal(varint(&s, send), 1 << 3 | 2); /* Summary.value */
                uint64_t vn = varint(&s, send);
                assert_true(vn <= (uint64_t)(send - s));
                value_decode(s, s + vn, e);
                s += vn;
            }
            p = send;
            break;
        }
        default: fail_msg("Event: unexpected key %llu", (unsigned long long)key);
        }
    }
    assert_true(p == end);
}

static void test_event_round_trip(void **state) {
    (void)state;
    const tb_scalar v[] = {{"loss_metrics/global_avg_loss", 6.920127}, {"lr", 1.5e-3}, {"memory/peak(bytes)", 37748736}};
    uint8_t buf[512], rec[512 + TB_FRAME_OVERHEAD];
    size_t n = tb_event_encode(buf, sizeof buf, 1796222866.25, 300, NULL, v, 3);
    assert_true(n > 0);
    tb_record_frame(rec, buf, n);
    const uint8_t *payload;
    size_t len;
    assert_int_equal(record_read(rec, n + TB_FRAME_OVERHEAD, &payload, &len), n + TB_FRAME_OVERHEAD);
    assert_int_equal(len, n);
    event e;
    event_decode(payload, len, &e);
    assert_true(e.wall_time == 1796222866.25);
    assert_int_equal(e.step, 300);
    assert_int_equal(e.n, 3);
    for (int i = 0; i < 3; i++) {
        assert_string_equal(e.tag[i], v[i].tag);
        assert_true(e.value[i] == (float)v[i].value);
    }
    /* the file_version record, and a negative step (protobuf's 10-byte varint) */
    n = tb_event_encode(buf, sizeof buf, 0.5, -2, "brain.Event:2", NULL, 0);
    assert_int_equal(n, 1 + 8 + 1 + 10 + 1 + 1 + 13);
    event_decode(buf, n, &e);
    assert_string_equal(e.version, "brain.Event:2");
    assert_int_equal(e.step, -2);
    assert_int_equal(e.n, 0);
    /* too small a buffer: 0, not a cut record */
    assert_int_equal(tb_event_encode(buf, 20, 0.5, 1, NULL, v, 3), 0);
}

/* The writer's file: a file_version record, then one record per tb_write, each decoded. */
static void test_writer_file(void **state) {
    (void)state;
    char folder[256], host[256] = {0};
    snprintf(folder, sizeof folder, "%s/tb/run1", dir);
    tb_writer *w = tb_open(folder);
    assert_non_null(w);
    char path[512];
    snprintf(path, sizeof path, "%s", tb_path(w));
    gethostname(host, sizeof host - 1);
    const char *name = strrchr(path, '/') + 1;
    assert_memory_equal(name, "events.out.tfevents.", 20);
    assert_string_equal(strchr(name + 20, '.') + 1, host);
    for (int64_t step = 1; step <= 3; step++) {
        tb_scalar v[] = {{"grad_norm", 0.5 * (double)step}, {"validation_metrics/tokens", 64}};
        assert_int_equal(tb_write(w, step, v, 2), CT_OK);
    }
    /* written through at once: the file holds every record before close */
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t data[4096];
    size_t n = fread(data, 1, sizeof data, f);
    fclose(f);
    assert_int_equal(tb_close(w), CT_OK);
    size_t at = 0;
    int records = 0;
    while (at < n) {
        const uint8_t *payload;
        size_t len;
        event e;
        at += record_read(data + at, n - at, &payload, &len);
        event_decode(payload, len, &e);
        assert_true(e.wall_time > 1.7e9);
        if (records == 0) {
            assert_string_equal(e.version, "brain.Event:2");
        } else {
            assert_int_equal(e.step, records);
            assert_int_equal(e.n, 2);
            assert_string_equal(e.tag[0], "grad_norm");
            assert_true(e.value[0] == (float)(0.5 * records));
            assert_true(e.value[1] == 64.0f);
        }
        records++;
    }
    assert_int_equal(records, 4);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(folder), 0);
    snprintf(folder, sizeof folder, "%s/tb", dir);
    assert_int_equal(rmdir(folder), 0);
}

/* The descriptor open on path, found through /proc/self/fd; -1 if none. */
static int fd_of(const char *path) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    char link[300], target[600];
    int found = -1;
    while (d && (e = readdir(d))) {
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = 0;
        if (!strcmp(target, path)) found = atoi(e->d_name);
    }
    if (d) closedir(d);
    return found;
}

/* A write that fails (a full disk: /dev/full put in the file's place) is -1 and names the file. */
static void test_write_error_names_the_file(void **state) {
    (void)state;
    char folder[256], path[512];
    snprintf(folder, sizeof folder, "%s/full", dir);
    tb_writer *w = tb_open(folder);
    assert_non_null(w);
    snprintf(path, sizeof path, "%s", tb_path(w));
    int fd = fd_of(path), full = open("/dev/full", O_WRONLY);
    assert_true(fd >= 0 && full >= 0);
    assert_int_equal(dup2(full, fd), fd);
    close(full);
    tb_scalar v = {"grad_norm", 1.0};
    assert_int_equal(tb_write(w, 1, &v, 1), CT_ERR_IO);
    assert_non_null(strstr(ct_last_error(), path));
    assert_non_null(strstr(ct_last_error(), "No space left on device"));
    tb_close(w);
    unlink(path);
    rmdir(folder);
}

/* A folder that is a file: NULL and one line naming it. */
static void test_open_refuses_a_file(void **state) {
    (void)state;
    char folder[256];
    snprintf(folder, sizeof folder, "%s/plain", dir);
    FILE *f = fopen(folder, "w");
    assert_non_null(f);
    fclose(f);
    assert_null(tb_open(folder));
    assert_non_null(strstr(ct_last_error(), folder));
    assert_non_null(strstr(ct_last_error(), "Not a directory"));
    assert_null(strchr(ct_last_error(), '\n'));
    char below[300];
    snprintf(below, sizeof below, "%s/run", folder);
    assert_null(tb_open(below));
    assert_non_null(strstr(ct_last_error(), below));
    unlink(folder);
}

static int setup(void **state) {
    (void)state;
    return tmpdir_make("tensorboard");
}

static int teardown(void **state) {
    (void)state;
    tmpdir_remove();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_check_vectors),
        cmocka_unit_test(test_crc_mask_is_tfrecords),
        cmocka_unit_test(test_event_round_trip),
        cmocka_unit_test(test_writer_file),
        cmocka_unit_test(test_write_error_names_the_file),
        cmocka_unit_test(test_open_refuses_a_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
