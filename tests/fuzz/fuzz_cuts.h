/* fuzz_cuts.h — how the split-invariance fuzz targets chunk their input.
 *
 * The first input byte says how many (0-7) piece sizes follow it; the rest is the text.
 * Feeding the text in pieces of those sizes (cycled) and whole must give the same result.
 * With no sizes, the text is fed whole. */
#ifndef LG_FUZZ_CUTS_H
#define LG_FUZZ_CUTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct fuzz_cuts {
    const uint8_t *sizes;
    size_t n, k;
    unsigned mod; /* pieces are 1..mod bytes */
} fuzz_cuts;

/* Takes the size table off the front of *data. Returns false when the input is too short. */
static inline bool fuzz_cuts_take(const uint8_t **data, size_t *size, fuzz_cuts *c, unsigned mod)
{
    size_t n = *size ? (*data)[0] % 8 : 0;
    if (*size < 1 + n) return false;
    *c = (fuzz_cuts){.sizes = *data + 1, .n = n, .mod = mod};
    *data += 1 + n;
    *size -= 1 + n;
    return true;
}

/* The size of the next piece when `remaining` bytes are left (whole when c is NULL or has no
 * table); never 0 while remaining > 0. */
static inline size_t fuzz_cuts_next(fuzz_cuts *c, size_t remaining)
{
    size_t step = c && c->n ? 1 + (size_t)c->sizes[c->k++ % c->n] % c->mod : remaining;
    return step < remaining ? step : remaining;
}

#endif
