/* g_lines.c — the lines detector: one line or sentence keeps coming back, and the text
 * between its returns is itself made of returns (so "A x A y A z" with fresh x, y, z passes,
 * and a list whose items share a prefix does too).
 *
 * It reads the segments g_text.c cuts the text into. The window remembers the last
 * lines.window segments with a letter (a ring of hashes); each hash bucket knows its newest
 * segment and each segment the one before it in its bucket, so finding a segment's earlier
 * copies walks only the segments of its bucket: O(1) for most segments, O(copies) for a
 * returning one. Memory, from the first segment on: the ring, 24 bytes a segment, and
 * GUARD_SEG_BUCKETS buckets of 2 bytes per segment (2.5 KiB for the default window). */
#include <stdlib.h>

#include "guard/guard_int.h"

/* The window, made at the first segment: a text that never ends a line or a sentence needs
 * none. The ring is sized to a power of two so that indexing is a mask, not a division, and
 * the buckets to GUARD_SEG_BUCKETS per segment of it: they only shorten the walks, so their
 * number changes no verdict. COLD_PATH. */
COLD_PATH static void lines_alloc(guard *g)
{
    for (g->seg_mask = 1; g->seg_mask < g->p->lines.window; g->seg_mask <<= 1)
        ;
    g->segs = guard_table(g, GT_SEGS, g->seg_mask * sizeof(*g->segs));
    g->seg_last =
        guard_table(g, GT_SEG_LAST, g->seg_mask * GUARD_SEG_BUCKETS * sizeof(*g->seg_last));
    g->seg_bmask = g->seg_mask * GUARD_SEG_BUCKETS - 1;
    g->seg_mask--;
}

/* The lines detector, for a completed segment with a letter. The window keeps every such
 * segment, short ones too (they are what lies between the repeats); only a prose sentence
 * of min_segment_bytes can trigger, because code repeats lines on purpose. `now` is the
 * number of bytes fed when it is decided. Returns true on a trip. */
bool guard_lines_segment(guard *g, uint64_t h, uint64_t start, uint64_t end, bool trigger,
                         bool prose, bool plain, bool in_row, uint64_t now)
{
    const guard_params *p = g->p;
    if (!g->segs) {
        /* The text's first segment: no copy of it is in a window, so it trips nothing. At
         * the text's end (guard_finish: a 2-token answer, a text without a line's or a
         * sentence's end) no segment follows it either, and the window is not made. */
        if (g->finished) return false;
        lines_alloc(g);
    }
    unsigned w = p->lines.window, m = g->seg_mask;
    uint64_t occ[64], n = g->nsegs;
    unsigned nocc = 0, need = p->lines.min_repeats - 1;
    /* Its copies in the window (the w - 1 segments before it), newest first, remembering
     * the last min_repeats-1 of them: a walk of its bucket's chain. A segment that cannot
     * trigger only needs to know whether there is one. */
    uint16_t *last = &g->seg_last[h & g->seg_bmask];
    unsigned prev = *last ? (uint16_t)(n + 1 - *last) : 0; /* the distance back to it */
    for (unsigned k = prev; k && k < w && k <= n;) {
        const gseg *e = &g->segs[(n - k) & m];
        if (e->hash == h) {
            if (nocc < need && nocc < 64) occ[nocc] = n - k;
            nocc++;
            if (!trigger) break;
        }
        k = e->prev ? k + e->prev : 0;
    }
    *last = (uint16_t)(n + 1); /* one segment in 2^16 is none: as cycle's buckets */
    bool again = n && g->segs[(n - 1) & m].hash == h;
    g->lines_same = again ? g->lines_same + 1 : 0;
    gseg *s = &g->segs[g->nsegs & m];
    s->hash = h;
    s->start = start;
    s->seen = nocc > 0;
    s->prose = prose;
    s->prev = prev < w ? (uint16_t)prev : 0;
    g->nsegs++;
    /* The run of returns: segments in a row that each came back (a chorus is a short one,
     * a list that cycles a long one), and how many of them are text. A run trips when it is
     * long and covers the cycle of this segment (the distance to its last occurrence) twice:
     * code that repeats a block once, a chorus sung again, are runs of one cycle. One plain
     * line (no bullet, no indentation: "Thank you.") that comes back min_repeats - 1 times
     * in a row, nothing between, is a run too. */
    g->lines_run = s->seen ? g->lines_run + 1 : 0;
    g->lines_run_text = s->seen ? g->lines_run_text + prose : 0;
    /* A segment with no copy in the window trips neither way below (most segments): one
     * test for both, not one on trigger, which the text sets at random. */
    if (!trigger | !nocc) return false;
    uint64_t from, cycle = g->nsegs - 1 - occ[0]; /* need >= 1: occ[0] is set */
    bool run = g->lines_run >= p->lines.min_run && g->lines_run >= 2 * cycle;
    bool same = (plain && cycle == 1 && g->lines_run >= need) || (in_row && g->lines_same >= need);
    if (s->seen && (run || same) && g->lines_run_text * 2 >= g->lines_run) {
        from = g->nsegs - g->lines_run; /* the first return */
    } else {
        if (nocc < need || in_row) return false;
        /* The span from the oldest of those occurrences to now must be made of returns, and
         * of prose at least half: doctests repeat their error messages between code. */
        from = occ[need - 1];
        unsigned seen = 0, prosy = 0, total = 0;
        for (uint64_t k = from; k < g->nsegs; k++) {
            total++;
            seen += g->segs[k & m].seen;
            prosy += g->segs[k & m].prose;
        }
        if ((double)seen < p->lines.min_repeat_ratio * total || prosy * 2 < total) return false;
    }
    /* A segment the prompt asks for, or holds, may come back that many times. */
    if (start >= g->base) {
        uint32_t slack = guard_prompt_slack(g, g->buf + (start - g->base), (size_t)(end - start));
        if (nocc + 1 <= slack) return false;
    }
    guard_set_unit(g, start, end);
    guard_trip(g, "lines", g->segs[from & m].start, now, nocc + 1);
    return true;
}
