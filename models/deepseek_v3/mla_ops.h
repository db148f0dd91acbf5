/* mla_ops.h: the column ops multi-head latent attention needs beside the builder's (which has no slice,
 * concatenation or scalar multiply), as custom ops on the tape. Every tensor is f32 and contiguous; "rows"
 * are every dim but the last, flattened. Each returns NULL with the host's error set. */
#ifndef DEEPSEEK_V3_MLA_OPS_H
#define DEEPSEEK_V3_MLA_OPS_H

#include <ctitan/model.h>

/* x (..., a + b) -> *lo (..., a) and *hi (..., b): the first a columns and the rest. hi may be NULL (only the
 * first a columns kept). */
ct_status mla_split(ct_builder *b, ct_tensor *x, int64_t a, ct_tensor **lo, ct_tensor **hi);

/* x (B, T, H, a) and y (B, T, Hy, c) with Hy 1 or H -> (B, T, H, a + c): y's columns after x's, a one-head
 * y repeated over the H heads (DeepSeek's decoupled RoPE key). y NULL: c zero columns (v padded to q's
 * head size for the builder's attention). */
ct_tensor *mla_join(ct_builder *b, ct_tensor *x, ct_tensor *y, int64_t c);

/* s * x (YaRN's mscale^2 on the softmax scale, folded into q). */
ct_tensor *mla_scale(ct_builder *b, ct_tensor *x, float s);

#endif
