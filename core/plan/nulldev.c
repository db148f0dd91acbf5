/* nulldev.c: the planner's device. It computes nothing and its memory is address space only
 * (PROT_NONE, reserved without backing), so the host's own tape runs a microbatch of any size, its
 * arenas counting every byte exactly as in training, while no op reads or writes a tensor. A host
 * bug that touched tensor data during planning would fault at once instead of passing silently. */
#include "plan/plan_internal.h"

#include <string.h>
#include <sys/mman.h>

/* Every allocation remembers its size just before the address it hands out, in one readable page. */
#define NULLDEV_HDR 4096

static ct_status nd_alloc(ct_device *dev, size_t bytes, void **out) {
    (void)dev;
    size_t total = bytes + NULLDEV_HDR;
    char *p = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return CT_ERR_NOMEM;
    if (mprotect(p, NULLDEV_HDR, PROT_READ | PROT_WRITE)) {
        munmap(p, total);
        return CT_ERR_NOMEM;
    }
    memcpy(p, &total, sizeof total);
    *out = p + NULLDEV_HDR;
    return CT_OK;
}

static void nd_free(ct_device *dev, void *ptr) {
    (void)dev;
    if (!ptr) return;
    char *p = (char *)ptr - NULLDEV_HDR;
    size_t total;
    memcpy(&total, p, sizeof total);
    munmap(p, total);
}

static ct_status nd_copy(ct_device *dev, void *dst, const void *src, size_t bytes, ct_copy_kind kind) {
    (void)dev, (void)src;
    if (kind == CT_COPY_D2H) memset(dst, 0, bytes); /* host memory: what the host reads back is zero */
    return CT_OK;
}

#define NO_OP(name, ...)                                                                                               \
    static ct_status name(ct_device *dev, __VA_ARGS__) {                                                               \
        (void)dev;                                                                                                     \
        return CT_OK;                                                                                                  \
    }
#define U __attribute__((unused))

NO_OP(nd_copy_2d, U float *a, U int64_t b, U const float *c, U int64_t d, U int64_t e, U int64_t f)
/* Bytes the tape zeroes (activation gradients start at zero): memory traffic the planner counts. */
double plan_null_zeroed;
static ct_status nd_zero(ct_device *dev, void *p, size_t n) {
    (void)dev, (void)p;
    plan_null_zeroed += (double)n;
    return CT_OK;
}
static ct_status nd_sync(ct_device *dev) {
    (void)dev;
    return CT_OK;
}
NO_OP(nd_matmul, U float *c, U const float *a, U const float *b, U int64_t m, U int64_t n, U int64_t k, U int ta,
      U int tb, U float al, U float be)
NO_OP(nd_set_matmul_dtype, U ct_dtype t)
NO_OP(nd_axpy, U float *y, U const float *x, U float a, U int64_t n)
NO_OP(nd_add, U float *o, U const float *a, U const float *b, U int64_t n)
NO_OP(nd_scale, U float *x, U float a, U int64_t n)
static ct_status nd_sum(ct_device *dev, double *out, const float *x, int64_t n) {
    (void)dev, (void)x, (void)n;
    *out = 0;
    return CT_OK;
}
NO_OP(nd_sum_to_device, U float *o, U const float *x, U int64_t n)
NO_OP(nd_transpose, U float *d, U const float *s, U int64_t r, U int64_t c)
NO_OP(nd_emb_fwd, U float *o, U const int32_t *ids, U const float *t, U int64_t n, U int64_t c, U int64_t b,
      U int64_t r, U int s)
NO_OP(nd_emb_bwd, U float *o, U const int32_t *ids, U const float *t, U int64_t n, U int64_t c, U int64_t b,
      U int64_t r, U int s)
NO_OP(nd_rms_fwd, U float *o, U float *r, U const float *x, U const float *w, U int64_t n, U int64_t c, U float e)
NO_OP(nd_rms_bwd_in, U float *dx, U const float *dy, U const float *x, U const float *w, U const float *r, U int64_t n,
      U int64_t c)
NO_OP(nd_rms_bwd_w, U float *dw, U const float *dy, U const float *x, U const float *r, U int64_t n, U int64_t c)
NO_OP(nd_ln_fwd, U float *o, U float *m, U float *r, U const float *x, U const float *w, U const float *b, U int64_t n,
      U int64_t c, U float e)
NO_OP(nd_ln_bwd_in, U float *dx, U const float *dy, U const float *x, U const float *w, U const float *m,
      U const float *r, U int64_t n, U int64_t c)
NO_OP(nd_ln_bwd_w, U float *dw, U float *db, U const float *dy, U const float *x, U const float *m, U const float *r,
      U int64_t n, U int64_t c)
NO_OP(nd_bias_fwd, U float *o, U const float *x, U const float *b, U int64_t n, U int64_t c)
NO_OP(nd_bias_bwd, U float *db, U const float *dy, U int64_t n, U int64_t c)
NO_OP(nd_rope_fwd, U float *o, U const float *x, U const int32_t *p, U const float *f, U float th, U int64_t b,
      U int64_t t, U int64_t h, U int64_t d)
NO_OP(nd_rope_bwd, U float *o, U const float *x, U const int32_t *p, U const float *f, U float th, U int64_t b,
      U int64_t t, U int64_t h, U int64_t d)
NO_OP(nd_attn_fwd, U float *o, U float *l, U const float *q, U const float *k, U const float *v, U int64_t b,
      U int64_t t, U int64_t h, U int64_t kvh, U int64_t d)
NO_OP(nd_attn_bwd, U float *dq, U float *dk, U float *dv, U const float *dy, U const float *q, U const float *k,
      U const float *v, U const float *o, U const float *l, U int64_t b, U int64_t t, U int64_t h, U int64_t kvh,
      U int64_t d)
NO_OP(nd_swiglu_fwd, U float *o, U const float *a, U const float *g, U int64_t n)
NO_OP(nd_swiglu_bwd, U float *da, U float *dg, U const float *dy, U const float *a, U const float *g, U int64_t n)
NO_OP(nd_gelu_fwd, U float *o, U const float *x, U int64_t n)
NO_OP(nd_gelu_bwd, U float *dx, U const float *dy, U const float *x, U int64_t n)
NO_OP(nd_xent_fwd, U float *l, U const float *lg, U const int32_t *t, U int64_t n, U int64_t v, U int32_t ig)
NO_OP(nd_xent_bwd, U float *dl, U const float *lg, U const int32_t *t, U const float *l, U float d, U const float *dd,
      U int64_t n, U int64_t v, U int64_t b, U int32_t ig)
NO_OP(nd_xent_bwd_dev, U float *dl, U const float *lg, U const int32_t *t, U const float *d, U int64_t n, U int64_t v,
      U int32_t ig)
NO_OP(nd_xent_stats, U float *s, U const float *lg, U const int32_t *t, U int64_t n, U int64_t v, U int64_t b,
      U int32_t ig)
NO_OP(nd_round_bf16, U float *x, U int64_t n)
NO_OP(nd_cast_f32_to_bf16, U uint16_t *d, U const float *s, U int64_t n)
NO_OP(nd_cast_bf16_to_f32, U float *d, U const uint16_t *s, U int64_t n)

/* Activation offload's host copies: address space as the device's memory is; copies move nothing. */
static ct_status nd_copy_async(ct_device *dev, void *dst, const void *src, size_t bytes, ct_copy_kind kind,
                               uint64_t *ticket) {
    static uint64_t issued;
    (void)dev, (void)dst, (void)src, (void)bytes, (void)kind;
    *ticket = ++issued;
    return CT_OK;
}
static ct_status nd_copy_wait(ct_device *dev, uint64_t ticket) {
    (void)dev, (void)ticket;
    return CT_OK;
}

/* The handle the planner's runtime passes: any non-NULL address (the arenas allocate from a device
 * only when they have one), never dereferenced. */
static char null_device_token;
ct_device *plan_null_handle(void) { return (ct_device *)(void *)&null_device_token; }

const ct_device_api plan_null_device = {
    .struct_size = sizeof(ct_device_api),
    .alloc = nd_alloc,
    .free = nd_free,
    .copy = nd_copy,
    .copy_2d = nd_copy_2d,
    .zero = nd_zero,
    .synchronize = nd_sync,
    .matmul = nd_matmul,
    .set_matmul_dtype = nd_set_matmul_dtype,
    .axpy = nd_axpy,
    .add = nd_add,
    .scale = nd_scale,
    .sum = nd_sum,
    .sum_squares = nd_sum,
    .sum_to_device = nd_sum_to_device,
    .transpose = nd_transpose,
    .embedding_forward_general = nd_emb_fwd,
    .embedding_backward_general = nd_emb_bwd,
    .rmsnorm_forward = nd_rms_fwd,
    .rmsnorm_backward_input = nd_rms_bwd_in,
    .rmsnorm_backward_weight = nd_rms_bwd_w,
    .layernorm_forward = nd_ln_fwd,
    .layernorm_backward_input = nd_ln_bwd_in,
    .layernorm_backward_weight = nd_ln_bwd_w,
    .bias_forward = nd_bias_fwd,
    .bias_backward = nd_bias_bwd,
    .rope_forward_general = nd_rope_fwd,
    .rope_backward_general = nd_rope_bwd,
    .attention_forward = nd_attn_fwd,
    .attention_backward = nd_attn_bwd,
    .swiglu_forward = nd_swiglu_fwd,
    .swiglu_backward = nd_swiglu_bwd,
    .gelu_forward = nd_gelu_fwd,
    .gelu_backward = nd_gelu_bwd,
    .cross_entropy_forward = nd_xent_fwd,
    .cross_entropy_backward_general = nd_xent_bwd,
    /* never called: it tells the tape the loss's gradient stays on the device, as on a GPU */
    .cross_entropy_backward_dev = nd_xent_bwd_dev,
    .cross_entropy_stats = nd_xent_stats,
    .round_bf16 = nd_round_bf16,
    .cast_f32_to_bf16 = nd_cast_f32_to_bf16,
    .cast_bf16_to_f32 = nd_cast_bf16_to_f32,
    .host_alloc = nd_alloc,
    .host_free = nd_free,
    .copy_async = nd_copy_async,
    .copy_wait = nd_copy_wait,
};
