/* g_short.h — private to guard/: the steps of the detectors for one byte, inline, for
 * guard.c's short path.
 *
 * A token (a piece shorter than GUARD_SHORT bytes, most of what a stream feeds) goes through
 * every detector byte after byte in one loop (guard.c, feed_short) instead of a pass per
 * detector: for a few bytes, each pass's call, set-up and loop exit (at the token's length,
 * which no predictor knows) cost more than the work. Each step does to the guard exactly
 * what its detector's pass does with that byte; what a step needs only now and then stays
 * out of line in the detector's file. These are the detectors that read every byte (leak,
 * repeat and text: g_leak.c, g_repeat.c, g_text.c); the rules and the budget act at one
 * offset each, and the short path calls their passes there. */
#ifndef LG_G_SHORT_H
#define LG_G_SHORT_H

#include "guard/guard_int.h"

/* ---- leak (g_leak.c) ------------------------------------------------------------------- */

/* A byte of leak class cls (non-zero) ends the `now` bytes fed: a token may end here.
 * Returns true on a trip. RARE_PATH. */
bool guard_leak_at(guard *g, unsigned cls, uint64_t now);

/* Byte b ends the `now` bytes fed. Returns true on a trip. */
static inline bool guard_leak_step(guard *g, unsigned char b, uint64_t now)
{
    unsigned cls = g->p->leak_class[b];
    return cls && guard_leak_at(g, cls, now);
}

/* ---- repeat (g_repeat.c) --------------------------------------------------------------- */

/* Follows Markdown code fences over byte b. */
void guard_fence_step(guard *g, unsigned char b);

/* At offset pos, the byte of a piece that ends at `end`: drops the candidates whose period
 * broke by now, tracks period d (0: none), judges (once) the candidates whose run reached
 * their threshold and trips when one still holds. Returns true on a trip; else *next is
 * the offset of the next candidate that will reach its threshold before its period breaks
 * (UINT64_MAX: none). RARE_PATH. */
bool guard_repeat_event(guard *g, uint64_t pos, uint32_t d, uint64_t end, uint64_t *next);

/* The 8 bytes of history ending at offset end (≥ base + 7) as the repeat detector's gram:
 * the byte at end lowest. */
static inline uint64_t guard_gram_at(const guard *g, uint64_t end)
{
    uint64_t v;
    memcpy(&v, g->buf + (end - 7 - g->base), sizeof v);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* The 8-gram's hash: its table slot is the top GUARD_GTAB_BITS bits (guard_gram_slot), its
 * rank among anchors the 32 below them (guard_gram_rank). */
static inline uint64_t guard_gram_hash(uint64_t gram)
{
    return gram * 0x9E3779B97F4A7C15ull;
}

/* The 8-gram table slot of the gram hashed `hash`. */
static inline uint32_t guard_gram_slot(uint64_t hash)
{
    return (uint32_t)(hash >> (64 - GUARD_GTAB_BITS));
}

/* The rank of the gram hashed `hash`: bits the slot does not use, so that the anchors, which
 * rank low, spread over the whole table. */
static inline uint32_t guard_gram_rank(uint64_t hash)
{
    return (uint32_t)(hash >> (32 - GUARD_GTAB_BITS));
}

/* The repeat detector records and looks up an 8-gram only at an anchor: an offset whose
 * gram ranks lowest (ties included) among the grams since the start of the block of
 * GUARD_ANCHOR_BLOCK offsets before its own. A token then touches the table's lines about
 * once in 22 bytes, not at every byte: with many streams every line a token touches is a
 * cache miss, and recording every gram made a 21-byte event write about 15 of the table's 32
 * lines. Every period has anchors: the lowest-ranked gram of its unit is one in every copy
 * once the period has held for two blocks, whatever its length, and so is any gram that ranks
 * below the grams of both copies' blocks, which finds most periods sooner. A period is found
 * some bytes after its 8-gram first repeats, so the holdback starts that much later than
 * with a lookup at every eighth offset (loop bytes a client sees before a trip: +1.9 % with
 * blocks of 8, +5 % with 16). Blocks of 16, not 8: an anchor is a branch as random as the
 * text, and at one byte in 12 it made the whole-file way 5-12 % slower; at one in 22 it is
 * as fast as every eighth offset was (tests/bench/HISTORY.md, gcold and gpace).
 *
 * Is pos, whose 8-gram is hashed `hash`, an anchor? *min is the lowest rank since the block
 * before this one began, *block this block's so far (both 0 in a new guard: no anchor before
 * offset 16). g_repeat.c's repeat_run does the same a block at a time. */
#define GUARD_ANCHOR_BLOCK 16
static inline bool guard_gram_anchor(uint32_t *min, uint32_t *block, uint64_t hash, uint64_t pos)
{
    uint32_t r = guard_gram_rank(hash);
    if ((pos & (GUARD_ANCHOR_BLOCK - 1)) == 0) {
        *min = *block;
        *block = UINT32_MAX;
    }
    bool anchor = r <= *min;
    *min = anchor ? r : *min;
    *block = r < *block ? r : *block;
    return anchor;
}

/* At the anchor pos, whose 8-gram (hash `hash`) ends there: records it and returns the period
 * it shows that is not live yet, or 0. The lookup's "seen before?" branch waits on two
 * dependent loads (the slot, then the history at the distance). The candidates' `breaks` must
 * be past pos for those still live. */
static inline uint32_t guard_gram_period(guard *g, uint16_t *gtab, uint64_t gram, uint64_t hash,
                                         uint64_t pos)
{
    uint32_t h = guard_gram_slot(hash);
    uint16_t last = gtab[h];
    gtab[h] = (uint16_t)(pos + 1);
    if (pos < g->base + 7) return 0;
    /* A slot may hold another 8-gram, or an old one, or none: only a real match is a period,
     * and comparing the 8 bytes is cheaper than cand_add (g_repeat.c) finding out. Whether
     * the slot is set and the distance in range is as random as the slot's last writer, so
     * it is no branch of its own: otherwise the 8 bytes ending at pos itself are read, and
     * the answer masked. */
    uint32_t d = (uint16_t)((uint16_t)(pos + 1) - last);
    bool ok = (last != 0) & (d - 1u < g->p->repeat.max_period) & (pos >= d + g->base + 7);
    if (!(ok & (guard_gram_at(g, ok ? pos - d : pos) == gram))) return 0;
    /* Most periods found are live already (a loop finds its own at every lookup). */
    for (unsigned k = 0; k < g->ncand; k++)
        if (g->cand[k].period == d && g->cand[k].breaks > pos) return 0;
    return d;
}

/* The repeat detector for the byte *at (in the history) at offset pos; gram is the 8 bytes
 * ending there. For a byte or two a compare per candidate costs less than finding where
 * its period breaks, as repeat_run does. Returns true on a trip. */
static inline bool guard_repeat_step(guard *g, uint64_t gram, const unsigned char *at, uint64_t pos)
{
    unsigned char b = *at;
    if (g->fstate != 2 || b == '\n') guard_fence_step(g, b); /* as fence_pass */
    bool due = false, died = false;
    for (unsigned k = 0; k < g->ncand; k++) {
        gcand *c = &g->cand[k];
        bool holds = at[-(ptrdiff_t)c->period] == b;
        c->breaks = holds ? pos + 1 : pos;
        died |= !holds;
        due |= holds && pos >= c->ready_at;
    }
    if (died) {
        unsigned n = 0;
        for (unsigned k = 0; k < g->ncand; k++)
            if (g->cand[k].breaks > pos) g->cand[n++] = g->cand[k];
        g->ncand = n;
    }
    uint64_t hash = guard_gram_hash(gram);
    uint32_t d = 0;
    if (guard_gram_anchor(&g->anchor_min, &g->anchor_block, hash, pos))
        d = guard_gram_period(g, g->gtab, gram, hash, pos);
    uint64_t next;
    return (d || due) && guard_repeat_event(g, pos, d, pos + 1, &next);
}

/* ---- text (g_text.c) ------------------------------------------------------------------- */

/* ASCII letters (2) and digits (1); every other byte 0. */
extern const unsigned char guard_alnum_class[256];

static inline uint64_t guard_fnv(uint64_t h, unsigned char c)
{
    return (h ^ c) * 0x100000001B3ull;
}

/* Are words kept (the detectors that read them are on)? */
static inline bool guard_text_words(const guard_params *p)
{
    return p->novelty.enabled || p->cycle.enabled;
}

/* A run of ASCII letters and digits starts with c at offset pos: it joins the segment (one
 * space for a gap before it) and, when words are kept, a word. */
static inline void guard_text_run_start(guard *g, unsigned char c, uint64_t pos, bool words)
{
    if (g->seg_gap) { /* one space stands for the gap */
        g->seg_hash = guard_fnv(g->seg_hash, ' ');
        g->seg_words++;
        g->seg_gap = false;
    }
    if (!g->seg_len) {
        g->seg_start = pos;
        g->seg_words = 1;
        g->seg_numbered = c <= '9';
    }
    if (words) {
        g->cp_need = 0;
        if (!g->w_len) {
            g->w.start = pos;
            g->w.alpha = c >= 'A';
        }
    }
}

/* The ASCII letter or digit c (guard_alnum_class cls, non-zero) at offset pos: what g_text.c's
 * alnum_run does with it. The byte before it tells whether a run starts. */
static inline void guard_text_alnum(guard *g, unsigned char c, unsigned cls, uint64_t pos,
                                    bool words)
{
    if (!guard_alnum_class[g->prev]) guard_text_run_start(g, c, pos, words);
    if (words) {
        g->w.hash = guard_fnv(g->w.hash, c | 0x20); /* lower case; digits have that bit */
        g->w_len++;
    }
    /* Digits opening the segment are left out of its hash: "7. X" is "8. X". With words
     * kept, the segment takes the word's hash when the word ends (g_text.c). */
    bool lead = g->seg_lead && cls == 1;
    if (!words) g->seg_hash = lead ? g->seg_hash : guard_fnv(g->seg_hash, c);
    g->seg_lead = lead;
    g->seg_len++;
    g->seg_alpha += cls >> 1;
    g->seg_lastc = c;
    g->prev2 = g->prev;
    g->prev = c;
}

/* Any other byte b at offset pos, for the words, lines and novelty detectors. Returns true
 * on a trip. Out of line: inlined in the short path it took the registers of its loop. */
bool guard_text_other(guard *g, unsigned char b, uint64_t pos, bool words);

#endif
