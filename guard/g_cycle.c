/* g_cycle.c — the cycle detector: the text replays its own recent sentences, one after
 * another, in the same order: a sentence or line said again and again ("Thank you." ×5), a
 * two-line reasoning cycle ("Wait, …" / "$\boxed{5}$"), a dialogue or a chapter of ten
 * paragraphs coming round again with only its numbers changed ("Chapter 4:" / "Chapter 6:");
 * or it draws its lines again and again from a few it said before, in any order.
 *
 * It reads the segments (lines and sentences) g_text.c completes, each as its list of words.
 * A segment has two skeletons: its words (case folded, a leading item number left out) and
 * its words without the numbers. The ring remembers the last cycle.window skeletons. A replay
 * at lag L is a run of segments each equal, numbers aside, to the one L before; it trips when
 * it has come round (copies − 1) times (run ≥ L × (copies − 1)), holds min_segments segments
 * equal with their numbers, at least two thirds of the run, and min_bytes, at least half of
 * them text (three words and 16 letters, no code characters, letters at least half). Four
 * more shapes trip it:
 *   numbers aside — a replay equal only with its numbers aside that has come round
 *       (masked_copies − 1) times over masked_min_segments, a cycle of two segments or more,
 *       half of it sentences, its first number not moving by the same step each round;
 *   mixed — the last mix_window segments all came before but mix_new, half of them a third
 *       time, the order changing at least mix_breaks times, three quarters of them text;
 *   third copy — a sentence of third_bytes comes a third time, its last copy replayed with
 *       the segments on both sides of it;
 *   fuzzy — two rounds of a cycle of 2-16 segments, fuzzy_share of them (but not all) and
 *       two thirds of their bytes equal to the round before, half prose.
 *
 * Why these bounds, measured on real answers: one sentence said again with its numbers
 * changed ("Check if n is equal to 4." for n = 1 … 27, one product in several sizes) is a
 * list, not a loop; two or more taking turns with new numbers each round are a procedure
 * going round (sudoku steps "The cell in row 8 … can only be 7." / "… filled with 2." over
 * grids that never converge); a replay that has not yet come round (thirteen items of a list
 * of fifty told again, a song's chorus sung twice after its verses) is content; code repeats
 * lines on purpose, so half the run must be text. A summary that lists earlier items again
 * says each a second time, and a chorus is one replay however often it comes; book titles
 * drawn again and again from a handful, in no fixed order, are a loop. An essay that
 * restates its thesis does so between other sentences; one that restarts a section it
 * already copied replays the sentences around it. A dialogue whose refrain block comes back
 * with a line changed each time is never an exact replay, while a song's verses change
 * every line.
 *
 * Cost: nothing per byte; per segment a hash over its words, a compare, a walk of the chain
 * of the segments in the ring that share its bucket (256 buckets) and its first number;
 * the fuzzy lags only at a segment that came before. Memory: the ring, 20 bytes a segment,
 * and 512 bytes of buckets. */
#include <limits.h>
#include <stdlib.h>

#include "guard/guard_int.h"

/* The ring and its buckets' heads (one block), made at the first segment (memory per
 * stream counts: a text that never ends a line or a sentence needs none); a power of two,
 * so that indexing is a mask, not a division. COLD_PATH. */
COLD_PATH static void cycle_alloc(guard *g)
{
    for (g->cyc_mask = 1; g->cyc_mask < g->p->cycle.window; g->cyc_mask <<= 1)
        ;
    size_t ring = g->cyc_mask * sizeof(*g->cyc);
    g->cyc = guard_table(g, GT_CYC, ring + GUARD_CYC_BUCKETS * sizeof(*g->cyc_last));
    g->cyc_last = (uint16_t *)((char *)g->cyc + ring);
    g->cyc_mask--;
    /* Per lag L of the fuzzy replays, the equal segments of 2L that trip (ceiling). */
    for (unsigned l = 2; l <= GUARD_FUZZY_LAG; l++) {
        double need = g->p->cycle.fuzzy_share * 2 * l;
        unsigned n = (unsigned)need;
        g->cyc_fz_need[l - 2] = (unsigned char)(n < need ? n + 1 : n ? n : 1);
    }
    /* Per lag L, the fewest returns among the last 2L segments with which a lag L' >= L can
     * still have enough (each lag adds two segments, so two returns at most). */
    int lo = INT_MAX;
    for (unsigned l = GUARD_FUZZY_LAG; l >= 2; l--) {
        int need = g->cyc_fz_need[l - 2];
        lo = need < lo - 2 ? need : lo - 2;
        g->cyc_fz_lo[l - 2] = (unsigned char)(lo > 0 ? lo : 0);
    }
}

static inline uint32_t step(uint32_t h, uint64_t w)
{
    uint64_t x = (h ^ w) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> 32);
}

/* The skeletons of the segment whose nw words are in g->sw: *exact over every word but a
 * leading number, *masked over the words that start with a letter; *num: the index of its
 * first number after a leading item number (a word not starting with a letter, past word
 * 0), or nw for none. Returns how many words start with a letter. */
static unsigned skeletons(const guard *g, unsigned nw, uint32_t *exact, uint32_t *masked,
                          unsigned *num)
{
    uint32_t m = 0x811C9DC5u;
    unsigned i = 1;
    const gword *sw = g->sw;
    bool lead = nw && sw[0].alpha; /* word 0 counts in the exact skeleton when it is no number */
    if (lead) m = step(m, sw[0].hash);
    /* Up to the first number past word 0 (most segments have none) the two skeletons are
     * one, and every word but a leading number starts with a letter. */
    for (; i < nw && sw[i].alpha; i++)
        m = step(m, sw[i].hash);
    uint32_t e = m;
    unsigned k = i < nw ? i : nw, words = i - 1 + lead;
    /* From there without branches: whether a word starts with a letter follows the text. */
    for (; i < nw; i++) {
        uint64_t h = sw[i].hash;
        bool alpha = sw[i].alpha;
        uint32_t mh = step(m, h);
        e = step(e, h);
        m ^= (m ^ mh) & -(uint32_t)alpha; /* a mask: a select here became a branch */
        words += alpha;
    }
    *exact = e;
    *masked = m;
    *num = k;
    return words;
}

/* The value of the segment's word k, a number (its first 9 digits; the segment ends at
 * `end`). */
static uint32_t number_at(const guard *g, unsigned k, uint64_t end)
{
    uint32_t v = 0;
    for (uint64_t o = g->sw[k].start, e = o + 9; o < e && o < end && o >= g->base; o++) {
        unsigned char c = guard_at(g, o);
        if (c < '0' || c > '9') break;
        v = v * 10 + (c - '0');
    }
    return v;
}

/* Can the mixed replay trip at segment i: mix_new or fewer of the last mix_window segments
 * did not come before? Most segments: no, two or more of them did not, more than mix_new
 * (1) allows: told first. Else their bits are cleared one by one, mix_new of them at most:
 * a popcount for every segment was a library call (no -mpopcnt). */
static inline bool mix_may(const guard *g, uint64_t i)
{
    const guard_params *p = g->p;
    unsigned n = p->cycle.mix_window, budget = p->cycle.mix_new;
    uint32_t fresh = ~g->cyc_ret & (uint32_t)(((uint64_t)1 << n) - 1);
    if (fresh & (fresh - 1) && budget < 2) return false;
    if (!n || i + 1 < n) return false;
    for (unsigned k = 0; k < budget && fresh; k++)
        fresh &= fresh - 1;
    return !fresh;
}

/* The mixed replay: the last mix_window segments all came before (but mix_new of them:
 * mix_may holds), and not as one replay: the order changed at least mix_breaks times ("A C
 * B A B C": a few lines drawn again and again in any order). A chorus sung again, even
 * twice, is one replay, and a song's verses are new lines. RARE_PATH. */
RARE_PATH static bool mix_trips(guard *g, unsigned nw, uint64_t i, uint64_t end, unsigned copies,
                                uint64_t now)
{
    const guard_params *p = g->p;
    unsigned n = p->cycle.mix_window;
    /* An item of a numbered list the prompt asks for ("write 50 stories": its number at most
     * the prompt's largest) may draw on the items before it: the list is within what was
     * asked. */
    if (g->prompt_number && nw && !g->sw[0].alpha && number_at(g, 0, end) <= g->prompt_number)
        return false;
    uint32_t win = n >= 32 ? 0xFFFFFFFFu : (1u << n) - 1;
    unsigned ret = (unsigned)__builtin_popcount(g->cyc_ret & win);
    unsigned brk = (unsigned)__builtin_popcount(g->cyc_brk & win);
    unsigned third = (unsigned)__builtin_popcount(g->cyc_third & win);
    if (brk < p->cycle.mix_breaks || third * 2 < n) return false;
    /* Three quarters of the segments' bytes text: a changelog's entries recombine their
     * author, date and "New release" lines, but the dates and addresses are no text. */
    uint32_t seg_bytes = 0, text_bytes = 0;
    for (unsigned k = 0; k < n; k++) {
        unsigned len = g->cyc[(i - k) & g->cyc_mask].len;
        seg_bytes += len;
        text_bytes += (g->cyc_text >> k & 1) ? len : 0;
    }
    const gcyc *first = &g->cyc[(i + 1 - n) & g->cyc_mask];
    uint32_t bytes = (uint32_t)end - first->start;
    if (bytes < p->cycle.min_bytes || text_bytes * 4 < seg_bytes * 3) return false;
    uint64_t from = end - bytes, s0 = end - ((uint32_t)end - g->cyc[i & g->cyc_mask].start);
    if (s0 >= g->base &&
        copies <= guard_prompt_slack(g, g->buf + (s0 - g->base), (size_t)(end - s0)))
        return false;
    guard_set_unit(g, s0, end);
    guard_trip(g, "cycle", from, now, ret);
    return true;
}

/* A passage said again word for word, and one of its long sentences a third time: the
 * segment i's last copy (lag u) sat in a replay of the copy before (lag v), the segments on
 * both sides of it equal to those on both sides of that one. An essay that quotes its
 * thesis a third time, a list that names an item again, do not replay the sentences around
 * it. RARE_PATH. */
RARE_PATH static bool third_trips(guard *g, uint64_t i, unsigned u, unsigned v, uint64_t start,
                                  uint64_t end, uint64_t now)
{
    unsigned m = g->cyc_mask;
    if (u < 2 || v + 1 >= g->p->cycle.window || v + 1 > i) return false;
    const gcyc *c = g->cyc;
    if (c[(i - u - 1) & m].exact != c[(i - v - 1) & m].exact ||
        c[(i - u + 1) & m].exact != c[(i - v + 1) & m].exact)
        return false;
    uint64_t from = end - ((uint32_t)end - c[(i - u - 1) & m].start);
    if (start >= g->base &&
        3 <= guard_prompt_slack(g, g->buf + (start - g->base), (size_t)(end - start)))
        return false;
    guard_set_unit(g, start, end);
    guard_trip(g, "cycle", from, now, 3);
    return true;
}

/* The fuzzy replay: the last two rounds of a cycle of L segments (2 ≤ L ≤ GUARD_FUZZY_LAG)
 * each equal to the one L before, at least fuzzy_share of them but not all (those are an
 * exact replay's), and two thirds of their bytes, half of them prose: a dialogue whose
 * block of lines comes round a third time with a line or two changed. A song's verses
 * change every line, and its chorus alone is less than that share of a round. The count
 * only grows at a segment that came before, so only those are judged, and only at the
 * lags where enough of the last 2L came before (cyc_ret): the caller asks only at a
 * segment that came before (bit 0 of cyc_ret). RARE_PATH. */
RARE_PATH static bool fuzzy_trips(guard *g, uint64_t i, uint64_t start, uint64_t end, uint64_t now)
{
    const guard_params *p = g->p;
    const uint32_t r = g->cyc_ret;
    /* rets: returns among the last 2l segments, counted on as l grows. */
    unsigned m = g->cyc_mask, rets = (r & 1) + (r >> 1 & 1);
    for (unsigned l = 2; l <= GUARD_FUZZY_LAG; l++) {
        unsigned span = 2 * l, need = g->cyc_fz_need[l - 2];
        rets += (r >> (span - 2) & 1) + (r >> (span - 1) & 1);
        if (rets < g->cyc_fz_lo[l - 2]) break; /* no longer lag can have enough */
        if (rets < need || i + 1 < span + l || 3 * l >= p->cycle.window) continue;
        unsigned eq = 0;
        uint32_t eqmask = 0;
        for (unsigned k = 0; k < span; k++) {
            unsigned bit = g->cyc[(i - k) & m].exact == g->cyc[(i - k - l) & m].exact;
            eq += bit;
            eqmask |= (uint32_t)bit << k;
        }
        if (eq < need || eq == span) continue;
        /* Two thirds of the bytes came round too: a questionnaire's answer options ("Very
         * familiar", "Familiar", …) come round under longer questions that change. */
        uint32_t seg_bytes = 0, eq_bytes = 0, prose_bytes = 0;
        for (unsigned k = 0; k < span; k++) {
            unsigned len = g->cyc[(i - k) & m].len;
            seg_bytes += len;
            eq_bytes += (eqmask >> k & 1) ? len : 0;
            prose_bytes += (g->cyc_prose >> k & 1) ? len : 0;
        }
        if (seg_bytes < p->cycle.min_bytes || prose_bytes * 2 < seg_bytes ||
            eq_bytes * 3 < seg_bytes * 2)
            continue;
        if (start >= g->base &&
            3 <= guard_prompt_slack(g, g->buf + (start - g->base), (size_t)(end - start)))
            continue;
        uint64_t from = end - ((uint32_t)end - g->cyc[(i + 1 - span) & m].start);
        guard_set_unit(g, start, end);
        guard_trip(g, "cycle", from, now, 3);
        return true;
    }
    return false;
}

/* The replay at lag cyc_lag, of min_bytes and half text, for segment [start, end): does it
 * trip? RARE_PATH. */
RARE_PATH static bool replay_trips(guard *g, uint64_t start, uint64_t end, uint64_t now)
{
    const guard_params *p = g->p;
    unsigned lag = g->cyc_lag, run = g->cyc_run, need = p->cycle.min_segments;
    bool by_exact = run >= need && run >= lag * (p->cycle.copies - 1) && g->cyc_exact >= need &&
                    g->cyc_exact * 3 >= run * 2;
    /* Equal only with the numbers aside, a replay must come round more often, be a cycle of
     * two segments or more and half sentences: one sentence said again with new numbers is a
     * list (one product in several sizes), two or more taking turns with new numbers each
     * time are a procedure going round ("The cell in row 8 can only be 7." / "… must hold
     * 2."), and code, protocol tables and changelogs step their numbers through lines on
     * purpose. */
    bool by_masked = p->cycle.masked_copies && lag >= 2 && run >= p->cycle.masked_min_segments &&
                     run >= lag * (p->cycle.masked_copies - 1) && g->cyc_stepped * 3 < run &&
                     g->cyc_sentence_bytes * 2 >= g->cyc_bytes;
    if (!by_exact && !by_masked) return false;
    /* A sentence the prompt asks for, or holds, may come back that many times. */
    unsigned copies = 1 + run / lag;
    if (start >= g->base &&
        copies <= guard_prompt_slack(g, g->buf + (start - g->base), (size_t)(end - start)))
        return false;
    guard_set_unit(g, start, end);
    guard_trip(g, "cycle", g->cyc_from, now, copies);
    return true;
}

bool guard_cycle_segment(guard *g, unsigned nw, uint64_t start, uint64_t end, unsigned kind,
                         uint64_t now)
{
    bool text = kind & GSEG_TEXT;
    const guard_params *p = g->p;
    unsigned w = p->cycle.window;
    /* A segment a window of segments past the last text (a long stretch of code or data) is
     * left out: half of a replay must be text, and one whose cycle, at most a window, holds
     * no text has none; the stretch's first window of segments stays in the ring, to be
     * compared with what follows. */
    unsigned quiet = text ? 0 : g->cyc_quiet + (g->cyc_quiet <= w);
    g->cyc_quiet = quiet;
    if (quiet > w) return false;
    if (!g->cyc) {
        /* The ring's first segment has no copy before it, which every replay needs (a mixed
         * one of mix_window 1 too: no third copy); at the text's end (guard_finish) none
         * follows, and the ring is not made. */
        if (g->finished) return false;
        cycle_alloc(g);
    }
    unsigned m = g->cyc_mask;
    uint32_t exact, masked;
    unsigned num_word;
    /* A line of numbers and box drawing ("╟── 1 ╾ 2") has no skeleton to compare: it is
     * left out, as blank lines are. */
    if (!skeletons(g, nw, &exact, &masked, &num_word)) return false;
    uint64_t i = g->cyc_n++;
    gcyc *s = &g->cyc[i & m];
    uint32_t len = (uint32_t)(end - start);

    /* Its copies in the ring, numbers aside (how many, and the newest), and the lags of the
     * last two equal with it with their numbers: each bucket remembers its newest segment
     * and each segment the one before it in its bucket, so one walk visits only the
     * segments of its bucket (most segments: none). */
    uint16_t *last = &g->cyc_last[masked & (GUARD_CYC_BUCKETS - 1)];
    unsigned prev = *last ? (uint16_t)(i + 1 - *last) : 0; /* the one before in its bucket */
    unsigned seen = 0, newest = 0, near[2] = {0, 0}, nnear = 0;
    for (unsigned k = prev; k && k < w && k <= i;) {
        const gcyc *e = &g->cyc[(i - k) & m];
        if (e->masked == masked && !seen++) newest = k;
        if (e->exact == exact && nnear < 2) near[nnear++] = k;
        k = e->prev ? k + e->prev : 0;
    }
    /* Does it continue the replay at lag L? Else the newest earlier copy starts a new one. */
    const gcyc *o = g->cyc_lag ? &g->cyc[(i - g->cyc_lag) & m] : NULL;
    /* A return right after a return, at a new lag: the order changed (mixed replays). */
    bool broke = false;
    if (!o || o->masked != masked) {
        broke = g->cyc_lag != 0;
        g->cyc_lag = newest;
        o = newest ? &g->cyc[(i - newest) & m] : NULL;
        g->cyc_run = g->cyc_exact = g->cyc_stepped = 0;
        g->cyc_bytes = g->cyc_text_bytes = g->cyc_sentence_bytes = 0;
        g->cyc_from = start;
    }
    /* The first number after a leading item number, or UINT32_MAX for none. */
    uint32_t num = num_word < nw ? number_at(g, num_word, end) : UINT32_MAX;
    if (g->cyc_lag) {
        g->cyc_run++;
        g->cyc_exact += o->exact == exact;
        /* Counting: the number moved by the same step as one lag before ("Check if n is 11."
         * after 10 and 9). */
        const gcyc *o2 =
            2 * g->cyc_lag < w && 2 * g->cyc_lag <= i ? &g->cyc[(i - 2 * g->cyc_lag) & m] : NULL;
        g->cyc_stepped += o2 && o->exact != exact && num != UINT32_MAX && num != o->num &&
                          o2->masked == masked && num - o->num == o->num - o2->num;
        g->cyc_bytes += len;
        g->cyc_text_bytes += text ? len : 0;
        g->cyc_sentence_bytes += kind & GSEG_SENTENCE ? len : 0;
    }
    s->prev = prev < w ? (uint16_t)prev : 0;
    *last = (uint16_t)(i + 1);
    s->exact = exact;
    s->masked = masked;
    s->start = (uint32_t)start;
    s->num = num;
    s->len = len < UINT16_MAX ? (uint16_t)len : UINT16_MAX;
    g->cyc_ret = g->cyc_ret << 1 | (g->cyc_lag != 0);
    g->cyc_third = g->cyc_third << 1 | (seen >= 2);
    g->cyc_brk = g->cyc_brk << 1 | (broke && g->cyc_lag != 0);
    g->cyc_text = g->cyc_text << 1 | text;
    if (mix_may(g, i) && mix_trips(g, nw, i, end, seen + 1, now)) return true;
    if (nnear == 2 && kind & GSEG_SENTENCE && p->cycle.third_bytes && len >= p->cycle.third_bytes &&
        third_trips(g, i, near[0], near[1], start, end, now))
        return true;
    g->cyc_prose = g->cyc_prose << 1 | ((kind & GSEG_PROSE) != 0);
    /* Half of a fuzzy replay is prose: none without prose among the last 32 segments. */
    if (p->cycle.fuzzy_share > 0 && (g->cyc_ret & 1) && g->cyc_prose &&
        fuzzy_trips(g, i, start, end, now))
        return true;
    return g->cyc_lag && g->cyc_bytes >= p->cycle.min_bytes &&
           g->cyc_text_bytes * 2 >= g->cyc_bytes && replay_trips(g, start, end, now);
}
