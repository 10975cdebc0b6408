/* fuzz_jsonguard.c — libFuzzer target for the JSON body guard (proxy/jsonguard.c).
 *
 * The first input byte picks the budgets (nodes 1-256, depth 1-16); the rest is the body.
 * Properties checked (abort on violation):
 *  1. a body the guard accepts is one JSON value that cJSON parses to its last byte
 *     (whitespace aside), with no more values than the node budget and no deeper nesting
 *     than the depth budget, and no object in it has two members with the same key;
 *  2. a refusal always comes with a reason;
 *  3. for any body, a tree jt_parse (proxy/jsontree.c) builds is cJSON's: the same types,
 *     keys, strings, numbers and links. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "proxy/jsonguard.h"
#include "proxy/jsontree.h"
#include "proxy/xalloc.h"

/* Counts values and checks the depth and duplicate keys of a parsed tree. */
static size_t walk(const cJSON *j, unsigned depth, unsigned max_depth)
{
    size_t n = 1;
    bool container = cJSON_IsArray(j) || cJSON_IsObject(j);
    if (container && depth > max_depth) abort();
    for (const cJSON *c = container ? j->child : NULL; c; c = c->next) {
        if (cJSON_IsObject(j))
            for (const cJSON *d = c->next; d; d = d->next)
                if (strcmp(c->string, d->string) == 0) abort();
        n += walk(c, depth + 1, max_depth);
    }
    return n;
}

/* Whether the sibling lists from a and b (and all below them) are alike (property 3). */
static bool same(const cJSON *a, const cJSON *b)
{
    for (const cJSON *pa = NULL; a || b; pa = a, a = a->next, b = b->next) {
        if (!a || !b || a->type != b->type || a->valueint != b->valueint ||
            memcmp(&a->valuedouble, &b->valuedouble, sizeof a->valuedouble) != 0 ||
            !a->string != !b->string || (a->string && strcmp(a->string, b->string) != 0) ||
            !a->valuestring != !b->valuestring ||
            (a->valuestring && strcmp(a->valuestring, b->valuestring) != 0) ||
            (pa && a->prev != pa))
            return false;
        if (a->child) {
            const cJSON *last = a->child;
            while (last->next)
                last = last->next;
            if (a->child->prev != last) return false;
        }
        if (!same(a->child, b->child)) return false;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    if (len < 1) return 0;
    jg_limits lim = {(size_t)(data[0] & 0xff) + 1, (unsigned)(data[0] >> 4) + 1};
    const char *s = (const char *)data + 1;
    size_t n = len - 1;
    cJSON *tree = jt_parse(s, n);
    if (tree) {
        cJSON *c = cJSON_ParseWithLength(s, n);
        if (!c || !same(tree, c)) abort();
        cJSON_Delete(c);
        lg_xfree(tree);
    }
    char err[200] = "";
    if (jsonguard_check(s, n, &lim, err, sizeof err) != 0) {
        if (!err[0]) abort();
        return 0;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(s, n, &end, false);
    if (!j) abort();
    while (end < s + n && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r'))
        end++;
    if (end != s + n) abort();
    if (walk(j, 1, lim.max_depth) > lim.max_nodes) abort();
    cJSON_Delete(j);
    return 0;
}
