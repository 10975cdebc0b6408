/* fuzz_think.c — libFuzzer target for the think-tag splitter.
 *
 * Properties (abort on violation): the split does not depend on chunking (whole input vs
 * pieces chosen by the input's first bytes, with and without starting inside); the output
 * never has more bytes than the input; without "<think>" and "</think>" in the input and
 * not starting inside, everything is content, unchanged. think_split_whole must agree
 * with a splitter started inside exactly when the text holds "</think>". */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/buf.h"
#include "tests/fuzz/fuzz_cuts.h"
#include "proxy/think.h"

static void split(const uint8_t *in, size_t len, bool inside, fuzz_cuts *cuts, lg_buf *r, lg_buf *c)
{
    think_split *t = think_new(inside);
    size_t at = 0;
    while (at < len) {
        size_t step = fuzz_cuts_next(cuts, len - at);
        think_feed(t, (const char *)in + at, step, r, c);
        at += step;
    }
    think_finish(t, r, c);
    think_free(t);
}

static bool same(const lg_buf *a, const lg_buf *b)
{
    return a->len == b->len && (a->len == 0 || !memcmp(a->p, b->p, a->len));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_cuts cuts;
    if (!fuzz_cuts_take(&data, &size, &cuts, 11)) return 0;

    for (int inside = 0; inside < 2; inside++) {
        lg_buf r1 = LG_BUF_INIT, c1 = LG_BUF_INIT, r2 = LG_BUF_INIT, c2 = LG_BUF_INIT;
        split(data, size, inside, NULL, &r1, &c1);
        split(data, size, inside, &cuts, &r2, &c2);
        if (!same(&r1, &r2) || !same(&c1, &c2)) abort();
        if (r1.len + c1.len > size) abort();
        if (!inside && !memmem(data, size, "<think>", 7) && !memmem(data, size, "</think>", 8)) {
            if (r1.len || c1.len != size || (size && memcmp(c1.p, data, size))) abort();
        }
        if (inside == (memmem(data, size, "</think>", 8) != NULL)) {
            lg_buf r3 = LG_BUF_INIT, c3 = LG_BUF_INIT;
            think_split_whole((const char *)data, size, &r3, &c3);
            if (!same(&r1, &r3) || !same(&c1, &c3)) abort();
            lg_buf_free(&r3);
            lg_buf_free(&c3);
        }
        lg_buf_free(&r1);
        lg_buf_free(&c1);
        lg_buf_free(&r2);
        lg_buf_free(&c2);
    }
    return 0;
}
