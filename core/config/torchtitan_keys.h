/* torchtitan_keys.h: torchtitan v0.2.2 keys that ctitan has no key of its own for, each accepted (with
 * the values that mean what ctitan does anyway), mapped onto ctitan's key, or refused with the reason. */
#ifndef CT_TORCHTITAN_KEYS_H
#define CT_TORCHTITAN_KEYS_H

#include <stddef.h>

typedef struct tt_key {
    const char *key;     /* dotted, as torchtitan spells it */
    const char *accept;  /* values accepted: "*" any, "a|b" these (each item of a list), "" only empty;
                          * NULL: refused whatever its value */
    const char *maps_to; /* ctitan's key that takes the value (accept is then "*"), or NULL */
    const char *reason;  /* what ctitan does instead, or why not */
} tt_key;

/* The entry for `key`, or NULL. */
const tt_key *tt_key_find(const char *key);
/* Every entry, up to one whose key is NULL (for the docs' table and tests). */
extern const tt_key tt_keys[];

typedef struct manifest manifest;
/* torchtitan's float8 and MX spellings (quantize.linear.float8.*, quantize.linear.mx.*, [float8]) become
 * the float8 plugin's keys (quantize.dense.float8.*, keeping their lines) where those are not set; 1
 * when torchtitan's way of turning the dense quantizer on is there (a recipe name, or a converter in
 * model.converters: quantize.grouped_mm.* alone sets the plugin's linears false, and
 * quantize.grouped_mm.mx its grouped_mm_recipe mxfp8 where unset), else 0. */
int tt_dense_quantizer_requested(manifest *mf);
/* torchtitan's keys that turn the dense quantizer on beside the plugin's own switch (its recipe names),
 * up to a NULL: a manifest the planner writes drops them and keeps the switch alone. */
extern const char *const tt_quantizer_recipe_keys[];
/* 1 when the model.converters item s[0..n) is one of torchtitan's quantizing converters (float8, mx and
 * their quantize.linear / quantize.grouped_mm spellings), else 0. */
int tt_converter_quantizes(const char *s, size_t n);

#endif
