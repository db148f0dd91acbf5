/* dtype.c: ct_dtype -> MPI datatype, and the bf16 reductions MPI does not have.
 *
 * f64, f32 and i32 reduce with MPI's own MPI_SUM / MPI_MAX / MPI_MIN. bf16 elements travel as
 * MPI_UINT16_T and reduce with user-defined ops: each pairwise step widens both operands to f32,
 * combines them, and rounds the sum back to bf16 (nearest, ties to even). A sum of two bf16 values
 * is exact in f32 or off by far less than half a bf16 ulp, so this single rounding equals the
 * correctly rounded pairwise sum. fp8 only moves (gather, broadcast, all_to_all, send/recv).
 */
#include "mpi_comm.h"

#include <math.h>
#include <string.h>

const char *ctmpi_dtype_name(ct_dtype dt)
{
    switch (dt) {
    case CT_F32: return "f32";
    case CT_BF16: return "bf16";
    case CT_F8_E4M3: return "f8_e4m3";
    case CT_F8_E5M2: return "f8_e5m2";
    case CT_I32: return "i32";
    case CT_F64: return "f64";
    }
    return "unknown-dtype";
}

int ctmpi_dtype_type(ct_dtype dt, MPI_Datatype *type)
{
    switch (dt) {
    case CT_F64: *type = MPI_DOUBLE; return 1;
    case CT_F32: *type = MPI_FLOAT; return 1;
    case CT_I32: *type = MPI_INT32_T; return 1;
    case CT_BF16: *type = MPI_UINT16_T; return 1;
    case CT_F8_E4M3: case CT_F8_E5M2: *type = MPI_UINT8_T; return 1;
    }
    return 0;
}

static float bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest, ties to even; NaN stays a (quiet) NaN, overflow becomes infinity. */
static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* MPI_User_function: inout[i] = in[i] op inout[i], for `*len` bf16 elements. */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

/* max/min pick one operand's bits (so -0/+0 ties keep inout); a NaN operand gives NaN */
static void bf16_max(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) {
        float x = bf16_to_f32(a[i]), y = bf16_to_f32(b[i]);
        if (isnan(x) || x > y)
            b[i] = a[i];
    }
}

static void bf16_min(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) {
        float x = bf16_to_f32(a[i]), y = bf16_to_f32(b[i]);
        if (isnan(x) || x < y)
            b[i] = a[i];
    }
}

int ctmpi_bf16_ops_create(MPI_Op ops[3])
{
    MPI_User_function *fns[3] = {bf16_sum, bf16_max, bf16_min};
    for (int i = 0; i < 3; i++)
        ops[i] = MPI_OP_NULL;
    for (int i = 0; i < 3; i++) {
        int rc = MPI_Op_create(fns[i], 1, &ops[i]);
        if (rc != MPI_SUCCESS) {
            ctmpi_bf16_ops_free(ops);
            return rc;
        }
    }
    return MPI_SUCCESS;
}

void ctmpi_bf16_ops_free(MPI_Op ops[3])
{
    for (int i = 0; i < 3; i++)
        if (ops[i] != MPI_OP_NULL)
            MPI_Op_free(&ops[i]);
}

ct_status ctmpi_reduce_types(ctmpi *c, const char *what, ct_dtype dt, ct_reduce_op op,
                             MPI_Datatype *type, MPI_Op *mop)
{
    const ct_host *h = c->host;
    if (op != CT_REDUCE_SUM && op != CT_REDUCE_MAX && op != CT_REDUCE_MIN) {
        h->set_error(h, "%s: reduce op %d is not SUM (1), MAX (2) or MIN (3)", what, (int)op);
        return CT_ERR_INVALID;
    }
    if (!ctmpi_dtype_type(dt, type)) {
        h->set_error(h, "%s: dtype %d is not a ct_dtype", what, (int)dt);
        return CT_ERR_INVALID;
    }
    const MPI_Op builtin[3] = {MPI_SUM, MPI_MAX, MPI_MIN};
    switch (dt) {
    case CT_F64:
    case CT_F32:
    case CT_I32:
        *mop = builtin[op - 1];
        return CT_OK;
    case CT_BF16:
        *mop = c->bf16_op[op - 1];
        return CT_OK;
    case CT_F8_E4M3:
    case CT_F8_E5M2:
        break;
    }
    h->set_error(h, "%s: reductions of %s are not supported (f64, f32, i32 and bf16 are); reduce in a "
                    "wider dtype", what, ctmpi_dtype_name(dt));
    return CT_ERR_UNSUPPORTED;
}
