/* g_lines.c — the lines detector: one line or sentence keeps coming back, and the text
 * between its returns is itself made of returns (so "A x A y A z" with fresh x, y, z passes,
 * and a list whose items share a prefix does too).
 *
 * It reads the segments g_text.c cuts the text into. The window remembers the last
 * lines.window segments with a letter (a ring of hashes) and a count per hash bucket, so a
 * segment seen for the first time, most of them, costs O(1); a returning one O(window).
 * Memory, from the first segment on: the ring, 24 bytes a segment, and a byte of bucket
 * counts per GUARD_SEG_BUCKETS of them (2 KiB for the default window). */
#include <stdlib.h>

#include "guard/guard_int.h"

/* The window, made at the first segment: a text that never ends a line or a sentence needs
 * none. The ring is sized to a power of two so that indexing is a mask, not a division, and
 * the bucket counts to GUARD_SEG_BUCKETS per segment of it: they only spare scans, so their
 * number changes no verdict. RARE_PATH. */
RARE_PATH static void lines_alloc(guard *g)
{
    for (g->seg_mask = 1; g->seg_mask < g->p->lines.window; g->seg_mask <<= 1)
        ;
    g->segs = guard_xcalloc(g->seg_mask, sizeof(*g->segs));
    g->seg_count = guard_xcalloc(g->seg_mask * GUARD_SEG_BUCKETS, 1);
    g->seg_bmask = g->seg_mask * GUARD_SEG_BUCKETS - 1;
    g->seg_mask--;
}

void guard_lines_release(guard *g)
{
    free(g->segs);
    free(g->seg_count);
}

/* The lines detector, for a completed segment with a letter. The window keeps every such
 * segment, short ones too (they are what lies between the repeats); only a prose sentence
 * of min_segment_bytes can trigger, because code repeats lines on purpose. `now` is the
 * number of bytes fed when it is decided. Returns true on a trip. */
bool guard_lines_segment(guard *g, uint64_t h, uint64_t start, uint64_t end, bool trigger,
                         bool prose, bool plain, bool in_row, uint64_t now)
{
    const guard_params *p = g->p;
    if (!g->segs) lines_alloc(g);
    unsigned w = p->lines.window, m = g->seg_mask, bm = g->seg_bmask;
    uint64_t first = g->nsegs > w - 1 ? g->nsegs - (w - 1) : 0;
    uint64_t occ[64];
    unsigned nocc = 0, need = p->lines.min_repeats - 1;
    /* Newest first, remembering the last min_repeats-1 earlier occurrences. The bucket
     * counts spare the O(window) scan for the segments seen for the first time (most). */
    if (g->seg_count[h & bm]) {
        /* The ring walked in at most two stretches without a wrap, so that the inner loop
         * counts a slot index down with no mask: segment k - 1 sits in slot top, and the
         * stretch holds len segments, down to slot 0 or to the window's first. */
        for (uint64_t k = g->nsegs; k > first;) {
            size_t top = (size_t)((k - 1) & m),
                   len = (size_t)(k - first < top + 1 ? k - first : top + 1);
            for (size_t j = top + 1; j-- > top + 1 - len;) {
                if (g->segs[j].hash != h) continue;
                if (nocc < need && nocc < 64) occ[nocc] = k - 1 - (top - j);
                nocc++;
            }
            k -= len;
        }
    }
    g->seg_count[h & bm]++;
    if (g->nsegs >= w - 1) g->seg_count[g->segs[(g->nsegs - (w - 1)) & m].hash & bm]--;
    bool again = g->nsegs && g->segs[(g->nsegs - 1) & m].hash == h;
    g->lines_same = again ? g->lines_same + 1 : 0;
    gseg *s = &g->segs[g->nsegs & m];
    s->hash = h;
    s->start = start;
    s->seen = nocc > 0;
    s->prose = prose;
    g->nsegs++;
    /* The run of returns: segments in a row that each came back (a chorus is a short one,
     * a list that cycles a long one), and how many of them are text. A run trips when it is
     * long and covers the cycle of this segment (the distance to its last occurrence) twice:
     * code that repeats a block once, a chorus sung again, are runs of one cycle. One plain
     * line (no bullet, no indentation: "Thank you.") that comes back min_repeats - 1 times
     * in a row, nothing between, is a run too. */
    g->lines_run = s->seen ? g->lines_run + 1 : 0;
    g->lines_run_text = s->seen ? g->lines_run_text + prose : 0;
    if (!trigger) return false;
    uint64_t from, cycle = nocc ? g->nsegs - 1 - occ[0] : UINT64_MAX / 2;
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
