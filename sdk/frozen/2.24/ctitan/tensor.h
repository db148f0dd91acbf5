/* ctitan/tensor.h: dtypes and the tensor descriptor shared by the model, optimizer and host.
 *
 * A tensor is a view of device memory: the host owns `data` and `grad` (they come from the host's
 * arenas) and the descriptor itself; plugins read the shape and pointers and never free them.
 * Shapes are row-major and contiguous: shape[ndim-1] varies fastest.
 */
#ifndef CTITAN_TENSOR_H
#define CTITAN_TENSOR_H

#include "ctitan/abi.h"

#define CT_MAX_DIMS 6

typedef enum ct_dtype {
    CT_F32 = 1,
    CT_BF16 = 2,
    CT_F8_E4M3 = 3,
    CT_F8_E5M2 = 4,
    CT_I32 = 5,
    CT_F64 = 6 /* host-side reductions (norms, token counts); not a tensor dtype of any model */
} ct_dtype;

/* Bytes per element of a dtype; 0 for an unknown one. */
static inline size_t ct_dtype_size(ct_dtype t) {
    switch (t) {
    case CT_F64: return 8;
    case CT_F32: case CT_I32: return 4;
    case CT_BF16: return 2;
    case CT_F8_E4M3: case CT_F8_E5M2: return 1;
    }
    return 0;
}

/* Tensor flags. */
#define CT_TENSOR_PARAM 0x1u    /* a trainable parameter */
#define CT_TENSOR_NO_DECAY 0x2u /* excluded from weight decay (norm weights, biases) */
#define CT_TENSOR_LINEAR 0x10u       /* declared by the pack: the weight (out, in) of a linear layer */
#define CT_TENSOR_QUANT_DECIDED 0x4u /* host: the quantizer was asked about this weight */
#define CT_TENSOR_QUANTIZED 0x8u     /* host: its linear GEMMs go through the quantizer */
/* ABI 2.12: the host marks the ids unit_forward gets, so a strategy that wraps embedding or the loss
 * tells the model's token ids and targets from any other int32 tensor without guessing by shape. */
#define CT_TENSOR_TOKEN_IDS 0x20u /* host: the model's input token ids (B, T) */
#define CT_TENSOR_TARGETS 0x40u   /* host: the model's targets (B, T) */
/* ABI 2.17, declared by the pack: stacked experts, dim 0 the expert (ct_moe_layer's w1, w3, w2), what
 * expert parallel splits along dim 0 */
#define CT_TENSOR_EXPERTS 0x80u

typedef struct ct_tensor {
    size_t struct_size;
    ct_dtype dtype;
    int ndim;
    int64_t shape[CT_MAX_DIMS];
    void *data;       /* device memory, numel * dtype size bytes */
    void *grad;       /* device memory of the same shape in f32, or NULL */
    const char *name; /* parameters: fully qualified name ("layers.0.attention.wq.weight"); the host's
                         copy, valid as long as the tensor */
    uint32_t flags;
    int device;       /* device index; 0 for the CPU */
} ct_tensor;

static inline int64_t ct_tensor_numel(const ct_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

#endif
