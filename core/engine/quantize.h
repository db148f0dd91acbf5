/* quantize.h: the run's quantizer as the innermost layer of the builder chain. See quantize.c. */
#ifndef CT_QUANTIZE_H
#define CT_QUANTIZE_H

#include "engine/runtime.h"

/* A builder layer over `next` (the host's builder) whose linear, linear_cross_entropy and moe_experts
 * run the GEMMs of the weights rt->qapi converts through it; every other op forwards. NULL when out of
 * memory. Freed with tape_layer_free (runtime_free frees rt->layers). */
ct_builder *quantize_layer_new(runtime *rt, ct_builder *next);
/* Asks the quantizer about every weight the pack declared as a linear layer's and reports each
 * answer (rank 0, not while planning); the others are asked when a linear or the experts first use
 * them. */
void quantize_decide_linears(runtime *rt);

#endif
