/* jsonguard.h — one linear pass over a client's JSON body before anything builds a tree
 * from it, so that what loopguard reads and what the upstream reads cannot differ and a
 * body cannot buy more memory or CPU than its budget.
 *
 * cJSON keeps every copy of a repeated key (lookups return the first, a Python upstream
 * uses the last), accepts trailing bytes after the value, and spends ~150 bytes per value
 * whatever the body looks like (a 10 MB "[0,0,0,...]" is 5 million values). This pass
 * refuses all three: a body passes only when it is exactly one RFC 8259 value (whitespace
 * around it allowed), no object holds the same key twice (compared after unescaping, as
 * cJSON and Python compare them), nesting is at most max_depth and the number of values at
 * most max_nodes. Time is O(n) in the body; memory is O(number of keys) and freed before
 * returning. */
#ifndef LG_JSONGUARD_H
#define LG_JSONGUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct jg_limits {
    size_t max_nodes;   /* values (objects, arrays, scalars) in the whole document */
    unsigned max_depth; /* nesting of objects and arrays; the top level is depth 1 */
} jg_limits;

/* Checks s[0..n). Returns 0 when the body passes; otherwise -1 with a one-line reason
 * (naming the byte offset, and the key for a duplicate) in err (NUL-terminated,
 * truncated to errlen). */
int jsonguard_check(const char *s, size_t n, const jg_limits *lim, char *err, size_t errlen);

/* Whether the eight bytes at p hold one that ends a run of plain string bytes: a control
 * byte (below 0x20), '"' or '\\' (each byte tested without a carry into the next
 * mattering: a word with none of them never reads as one that has). */
static inline bool jg_special8(const char *p)
{
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    uint64_t w, q, b;
    memcpy(&w, p, 8);
    q = w ^ (ones * '"');
    b = w ^ (ones * '\\');
    return (((w - ones * 0x20) & ~w) | ((q - ones) & ~q) | ((b - ones) & ~b)) & highs;
}

#endif
