/* jsontree.h — a client body's cJSON tree in one allocation.
 *
 * cJSON_ParseWithLength allocates every value and every string on its own (a 90-byte chat
 * request: 19 blocks, each freed again by cJSON_Delete). jt_parse builds the same tree —
 * the same types, strings, numbers (valuedouble, valueint saturated as cJSON does), member
 * order and sibling links (a first child's prev is the last one) — in one block: the
 * values first, in document order, then their strings.
 *
 * It takes only the strict form a body has after jsonguard (one RFC 8259 value; no control
 * byte, no \u0000 and no lone surrogate in a string; at most JT_MAX_DEPTH levels; numbers
 * of at most 63 bytes), where cJSON's result is a plain function of the text; for anything
 * else it declines and the caller parses with cJSON as before. */
#ifndef LG_JSONTREE_H
#define LG_JSONTREE_H

#include <stddef.h>

#include <cJSON.h>

#define JT_MAX_DEPTH 64

/* The tree of s[0..n), or NULL when the text is not in the strict form (nothing
 * allocated). The tree is one lg_xmalloc block that starts at the root: it is freed with
 * lg_xfree(root), never with cJSON_Delete, and its values are only read (a cJSON call that
 * detaches, replaces or frees one of them would free into the block). */
cJSON *jt_parse(const char *s, size_t n);

#endif
