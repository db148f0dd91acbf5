/* kernels_f32.c: the plugin's numerics, the f32 instance of kernels_impl.h. */
#include "kernels.h"

#define CT_REAL_DOUBLE 0
#include "kernels_impl.h"
