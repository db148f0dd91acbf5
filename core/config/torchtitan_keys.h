/* torchtitan_keys.h: torchtitan v0.2.2 keys that ctitan has no key of its own for, each accepted (with
 * the values that mean what ctitan does anyway), mapped onto ctitan's key, or refused with the reason. */
#ifndef CT_TORCHTITAN_KEYS_H
#define CT_TORCHTITAN_KEYS_H

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

#endif
