/* tensorboard.h: TensorBoard event files, written by hand: each record a tensorflow.Event protobuf in
 * TFRecord framing. The first record carries file_version "brain.Event:2"; each later one a step
 * and its scalars (Summary.Value with simple_value, a float). No TensorFlow or protobuf library. */
#ifndef CT_TENSORBOARD_H
#define CT_TENSORBOARD_H

#include "ctitan/abi.h"

#include <stddef.h>
#include <stdint.h>

/* One scalar of an event: its tag ("loss_metrics/global_avg_loss") and value (stored as a float). */
typedef struct tb_scalar {
    const char *tag;
    double value;
} tb_scalar;

typedef struct tb_writer tb_writer;

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of n bytes, continuing from crc (0 to start):
 * tb_crc32c(0, "123456789", 9) is 0xE3069283. */
uint32_t tb_crc32c(uint32_t crc, const void *p, size_t n);
/* TFRecord's masked CRC: the CRC rotated right by 15 bits plus 0xa282ead8. */
uint32_t tb_crc_mask(uint32_t crc);

/* TFRecord framing: the payload's length (u64, little-endian), the masked CRC-32C of those 8 bytes,
 * the payload, the masked CRC-32C of the payload. out holds n + TB_FRAME_OVERHEAD bytes. */
#define TB_FRAME_OVERHEAD 16
void tb_record_frame(uint8_t *out, const void *payload, size_t n);

/* One Event protobuf into out: wall_time (field 1, double), step (field 2, int64), then either
 * file_version (field 3; version not NULL) or a Summary (field 5) of the n scalars. The bytes it
 * takes, or 0 if they do not fit in cap. */
size_t tb_event_encode(uint8_t *out, size_t cap, double wall_time, int64_t step, const char *version,
                       const tb_scalar *v, int n);

/* Makes folder (mkdir -p) and creates folder/events.out.tfevents.<unix time>.<hostname> (never an
 * existing file or a symlink) with its file_version record. NULL with one line set (ct_last_error) on a
 * failure. */
tb_writer *tb_open(const char *folder);

/* Appends one event: step and its n scalars, written out at once (a crash after it loses nothing).
 * CT_OK, or a status (CT_ERR_IO for a failed write) with ct_last_error naming the file. */
ct_status tb_write(tb_writer *w, int64_t step, const tb_scalar *v, int n);
/* The event file's path. */
const char *tb_path(const tb_writer *w);
/* Closes and frees w (NULL is fine). CT_OK, or CT_ERR_IO with ct_last_error naming the file. */
ct_status tb_close(tb_writer *w);

#endif
