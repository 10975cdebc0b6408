/* g_cycle.c — the cycle detector: the text replays its own recent sentences, one after
 * another, in the same order: a sentence or line said again and again ("Thank you." ×5), a
 * two-line reasoning cycle ("Wait, …" / "$\boxed{5}$"), a dialogue or a chapter of ten
 * paragraphs coming round again with only its numbers changed ("Chapter 4:" / "Chapter 6:").
 *
 * It reads the segments (lines and sentences) g_text.c completes, each as its list of words.
 * A segment has two skeletons: its words (case folded, a leading item number left out) and
 * its words without the numbers. The ring remembers the last cycle.window skeletons. A replay
 * at lag L is a run of segments each equal, numbers aside, to the one L before; it trips when
 * it has come round (copies − 1) times (run ≥ L × (copies − 1)), holds min_segments segments
 * equal with their numbers, at least two thirds of the run, and min_bytes, at least half of
 * them prose.
 *
 * Why these bounds, measured on real answers: numbers alone changing is not enough ("Check if
 * n is equal to 4." for n = 1 … 27, one product in several sizes are lists, not loops), so
 * such segments carry a replay but do not count for it; a replay that has not yet come round
 * (thirteen items of a list of fifty told again, a song's chorus sung twice after its verses)
 * is content; code repeats lines on purpose, so half the run must be prose.
 *
 * Cost: nothing per byte; per segment a hash over its words and one compare, and a scan of
 * the chain of the segments in the ring that share its bucket (256 buckets) when a replay breaks.
 * Memory: the ring, 12 bytes a segment, and 512 bytes of buckets. */
#include <stdlib.h>

#include "guard/guard_int.h"

/* The ring, made at the first segment (memory per stream counts: a text that never ends a
 * line or a sentence needs none); a power of two, so that indexing is a mask, not a
 * division. RARE_PATH. */
RARE_PATH static void cycle_alloc(guard *g)
{
    for (g->cyc_mask = 1; g->cyc_mask < g->p->cycle.window; g->cyc_mask <<= 1)
        ;
    g->cyc = guard_xcalloc(g->cyc_mask--, sizeof(*g->cyc));
}

void guard_cycle_release(guard *g)
{
    free(g->cyc);
}

static inline uint32_t step(uint32_t h, uint64_t w)
{
    uint64_t x = (h ^ w) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> 32);
}

/* The skeletons of the segment whose nw words are in g->sw: *exact over every word but a
 * leading number, *masked over the words that start with a letter. Returns how many do. */
static unsigned skeletons(const guard *g, unsigned nw, uint32_t *exact, uint32_t *masked)
{
    uint32_t e = 0x811C9DC5u, m = 0x811C9DC5u;
    unsigned words = 0;
    for (unsigned i = 0; i < nw; i++) {
        if (i || g->sw[i].alpha) e = step(e, g->sw[i].hash);
        if (g->sw[i].alpha) m = step(m, g->sw[i].hash);
        words += g->sw[i].alpha;
    }
    *exact = e;
    *masked = m;
    return words;
}

bool guard_cycle_segment(guard *g, unsigned nw, uint64_t start, uint64_t end, bool prose,
                         uint64_t now)
{
    const guard_params *p = g->p;
    if (!g->cyc) cycle_alloc(g);
    unsigned w = p->cycle.window, m = g->cyc_mask;
    uint32_t exact, masked;
    /* A line of numbers and box drawing ("╟── 1 ╾ 2") has no skeleton to compare: it is
     * left out, as blank lines are. */
    if (!skeletons(g, nw, &exact, &masked)) return false;
    uint64_t i = g->cyc_n++;
    gcyc *s = &g->cyc[i & m];
    uint32_t len = (uint32_t)(end - start);

    /* Does it continue the replay at lag L? Else the newest earlier copy starts a new one.
     * Each bucket remembers its newest segment and each segment the one before it in its
     * bucket, so the search walks only the segments of its bucket (most segments: none). */
    const gcyc *o = g->cyc_lag ? &g->cyc[(i - g->cyc_lag) & m] : NULL;
    uint16_t *last = &g->cyc_last[masked & (GUARD_CYC_BUCKETS - 1)];
    unsigned c = *last ? (uint16_t)(i + 1 - *last) : 0;
    if (!o || o->masked != masked) {
        g->cyc_lag = 0;
        while (c && c < w && c <= i) {
            const gcyc *e = &g->cyc[(i - c) & m];
            if (e->masked == masked) {
                g->cyc_lag = c;
                o = e;
                break;
            }
            c = e->prev ? c + e->prev : 0;
        }
        g->cyc_run = g->cyc_exact = 0;
        g->cyc_bytes = g->cyc_prose = 0;
        g->cyc_from = start;
    }
    if (g->cyc_lag) {
        g->cyc_run++;
        g->cyc_exact += o->exact == exact;
        g->cyc_bytes += len;
        g->cyc_prose += prose ? len : 0;
    }
    /* The one before in its bucket, if still in the ring (0: none). */
    unsigned prev = *last ? (uint16_t)(i + 1 - *last) : 0;
    s->prev = prev < w ? (uint16_t)prev : 0;
    *last = (uint16_t)(i + 1);
    s->exact = exact;
    s->masked = masked;

    unsigned lag = g->cyc_lag, run = g->cyc_run, need = p->cycle.min_segments;
    if (!lag || run < need || run < lag * (p->cycle.copies - 1) || g->cyc_exact < need ||
        g->cyc_exact * 3 < run * 2 || g->cyc_bytes < p->cycle.min_bytes ||
        g->cyc_prose * 2 < g->cyc_bytes)
        return false;
    /* A sentence the prompt asks for, or holds, may come back that many times. */
    unsigned copies = 1 + run / lag;
    if (start >= g->base &&
        copies <= guard_prompt_slack(g, g->buf + (start - g->base), (size_t)(end - start)))
        return false;
    guard_set_unit(g, start, end);
    guard_trip(g, "cycle", g->cyc_from, now, copies);
    return true;
}
