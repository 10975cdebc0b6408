/* g_store.c — the text detectors' tables and the store that keeps them between answers
 * (guard.h: guard_store).
 *
 * A 2-token answer through the proxy made its eight tables (up to 4 KiB each, most past
 * glibc's thread cache) when it ended and freed them at its guard's reset: 5k of a
 * request's 168k instructions. Kept in each spare guard instead, they went with it into
 * its next stream from that stream's first byte, and a paced stream of the bench (whose
 * stamp tokens end no segment before the answer does) held 11 KiB more all its life
 * (bench RSS per stream 32 -> 40 KiB). The store keeps them apart from the guards. */
#include <stdlib.h>
#include <string.h>

#include "guard/guard_int.h"

struct guard_store {
    unsigned n[GT_N];
    struct guard_tab tab[GT_N][GUARD_STORE_SETS];
};

guard_store *guard_store_new(void)
{
    return guard_xcalloc(1, sizeof(guard_store));
}

void guard_store_free(guard_store *s)
{
    if (!s) return;
    for (unsigned t = 0; t < GT_N; t++)
        for (unsigned i = 0; i < s->n[t]; i++)
            free(s->tab[t][i].p);
    free(s);
}

void *guard_table(guard *g, unsigned t, size_t size)
{
    guard_store *s = g->store;
    void *p = NULL;
    for (unsigned i = s ? s->n[t] : 0; i-- > 0;) {
        if (s->tab[t][i].size != size) continue; /* made for other params */
        p = memset(s->tab[t][i].p, 0, size);
        s->tab[t][i] = s->tab[t][--s->n[t]];
        break;
    }
    if (!p) p = guard_xcalloc(1, size);
    g->tab[t] = (struct guard_tab){p, size};
    return p;
}

void guard_tables_release(guard *g)
{
    guard_store *s = g->store;
    for (unsigned t = 0; t < GT_N; t++) {
        if (!g->tab[t].p) continue;
        if (s && s->n[t] < GUARD_STORE_SETS)
            s->tab[t][s->n[t]++] = g->tab[t];
        else
            free(g->tab[t].p);
        g->tab[t] = (struct guard_tab){0};
    }
}
