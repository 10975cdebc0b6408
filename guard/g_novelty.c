/* g_novelty.c — the novelty detector: almost no new word trigrams and no new words over a
 * window, the signature of a paraphrase loop ("Let me check 5 again. Wait, let me verify 5
 * once more.").
 *
 * It reads the words of each prose segment g_text.c completes. A table (1,024 entries of 4
 * bytes, tagged with 14 bits of the hash, in sets of two) says how often a trigram, or a
 * word, came within memory_words (of prose) of its last time; a ring over the last
 * novelty.window trigrams counts the novel ones (seen fewer than min_seen times before) and
 * the new words among the words that completed them. It trips when fewer than min_ratio of
 * the trigrams are novel and at most max_new_words words are new: a block said twice is no
 * loop (its trigrams were seen once), nor is a list of one product in several colours (each
 * item brings a word). O(1) per word.
 *
 * A segment outside prose (code, a table row, a short item) is only evidence that the text
 * is going somewhere: each of its words enters the window as a novel trigram, without a
 * look-up, and it never trips. Code and data repeat on purpose; looking their trigrams up
 * cost two thirds of the detector's time on source files.
 *
 * The table is two-way: a key may sit in either slot of its set, and a new one evicts the
 * older. Direct-mapped, a trigram seen 200 words before had lost its slot to another one
 * time in five on a 1,024-entry table, and every loss counted as a novel trigram: a loop
 * with 10 % new trigrams looked like 25 %. */
#include <stdlib.h>
#include <string.h>

#include "guard/guard_int.h"

/* The tables, made at the segment that brings the text's third word: a text of fewer
 * than three words, or one that never ends a segment, needs none. COLD_PATH. */
COLD_PATH static void novelty_alloc(guard *g)
{
    g->ttab = guard_table(g, GT_TTAB, ((size_t)1 << GUARD_TTAB_BITS) * sizeof(*g->ttab));
    g->tri_start = guard_table(g, GT_TRI_START, g->p->novelty.window * sizeof(*g->tri_start));
    g->tri_novel = guard_table(g, GT_TRI_NOVEL, g->p->novelty.window);
}

/* A slot of the ring (tri_novel): bit 0 a novel trigram, bit 1 a new word, TRI_FILLED once
 * written, so that the ring is full when the oldest slot, the next one, is filled;
 * TRI_OTHER: a word outside prose (no trigram, no start kept). */
#define TRI_FILLED 4
#define TRI_OTHER  8

/* Looks the key t up in the table tab and records it as seen at word now_w (the word
 * count, mod 2^16): returns how many times it came before, each within `memory` words of the
 * next (0: new), up to 3. The table is two-way: t sits in either slot of its set, and a new
 * key evicts the older entry. Its set is the key's top GUARD_TTAB_BITS bits, its tag the 14
 * bits below: the keys are products, whose high bits depend on all of their factor's. */
static inline unsigned table_seen(gtri *tab, uint64_t t, uint16_t now_w, unsigned memory)
{
    gtri *set = &tab[(t >> (64 - GUARD_TTAB_BITS)) & ~(uint64_t)1];
    /* the tag in place: the 14 bits below the set's, shifted to bits 18-31 (those above
     * leave the word) */
    uint32_t tag = (uint32_t)(t >> (64 - GUARD_TTAB_BITS - 14)) << 18, s0 = set[0], s1 = set[1];
    unsigned age0 = (uint16_t)(now_w - s0), age1 = (uint16_t)(now_w - s1);
    /* The slot holding t, else the older one; in arithmetic, not branches: whether a key
     * was seen is what the table is asked, so no branch on it is predictable. */
    bool in1 = (s1 ^ tag) < 1u << 18, in0 = (s0 ^ tag) < 1u << 18;
    unsigned i = in1 | (!in0 & (age1 > age0));
    uint32_t e = set[i]; /* read again, by index: a select here became a branch */
    bool hit = (in1 | in0) & ((uint16_t)(now_w - e) <= memory);
    unsigned seen = (e >> 16 & 3) & -(unsigned)hit; /* no branch either */
    set[i] = tag | (seen + (seen < 3)) << 16 | now_w;
    return seen;
}

/* The end of the word that starts at offset `start`, at most `now`. */
static uint64_t word_end_at(const guard *g, uint64_t start, uint64_t now)
{
    uint64_t e = start;
    for (unsigned char c; e < now; e++) {
        c = guard_at(g, e);
        if (!(((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
              c >= 0x80))
            break;
    }
    return e;
}

/* Is the repetition the prompt's? Asked when the window is about to trip at the trigram
 * that starts at ws0 in the segment of nw words, `now` bytes fed. True when the prompt
 * asks for copies, or holds at least half the trigrams of the segment, each as written
 * from its first word to the end of its third: a product recommended in several sizes
 * copies the product's name from the prompt, its numbers aside. A segment of fewer than
 * three words is judged by its text from ws0 on. O(prompt) per trigram. COLD_PATH. */
COLD_PATH static bool novelty_prompt(const guard *g, unsigned nw, uint64_t ws0, uint64_t now)
{
    if (!g->prompt_len) return false;
    const gword *sw = g->sw;
    unsigned held = 0, n = 0;
    for (unsigned i = 2; i < nw; i++) {
        uint64_t s = sw[i - 2].start, e = word_end_at(g, sw[i].start, now);
        if (s < g->base) continue;
        n++;
        held += guard_prompt_slack(g, g->buf + (s - g->base), (size_t)(e - s)) > 0;
    }
    if (n) return 2 * held >= n;
    return ws0 >= g->base && ws0 < now &&
           guard_prompt_slack(g, g->buf + (ws0 - g->base), (size_t)(now - ws0));
}

/* A segment of nw words outside prose: each word enters the window as a novel trigram
 * (more than a window of them replace all of it). Its words join no trigram. They enter
 * when the next prose word is judged (novelty_flush): until then only their number is
 * kept, so that a run of code lines costs one addition a line, not a ring slot a word. */
static void novelty_other(guard *g, unsigned nw)
{
    const unsigned w = g->p->novelty.window;
    g->nov_other = g->nov_other + nw < w ? g->nov_other + nw : w;
}

/* The n slots from p become words outside prose: returns how many of them held a novel
 * trigram (low 16 bits: a window is at most 4,096, guard_params.c) and a new word (high 16
 * bits). A loop the compiler vectorizes. */
static uint32_t fill_other(unsigned char *p, unsigned n)
{
    uint32_t bits = 0;
    for (unsigned i = 0; i < n; i++)
        bits += (p[i] & 1u) | (uint32_t)(p[i] & 2u) << 15;
    memset(p, 1 | TRI_FILLED | TRI_OTHER, n);
    return bits;
}

/* The k words outside prose since the last prose word enter the window, each a novel
 * trigram and no new word (TRI_OTHER: no trigram starts there; the caller has the ring):
 * the slots up to the ring's end, then those from its start. RARE_PATH: once per prose
 * segment after code, which is rare but in source files. */
RARE_PATH static void novelty_flush(guard *g, unsigned k)
{
    const unsigned w = g->p->novelty.window;
    unsigned slot = g->tri_slot, head = k < w - slot ? k : w - slot;
    uint32_t left = fill_other(g->tri_novel + slot, head) + fill_other(g->tri_novel, k - head);
    g->nov_other = 0;
    g->tri_slot = slot + k < w ? slot + k : slot + k - w;
    g->novel += k - (left & 0xFFFF);
    g->fresh -= left >> 16;
}

/* Where the trigram of the window's oldest slot `slot` starts, for a trip: the first
 * trigram of prose from there on (the words outside prose before it are evidence of
 * novelty, not part of a loop; the newest slot is prose). */
static uint64_t window_start(const guard *g, unsigned slot)
{
    const unsigned w = g->p->novelty.window;
    while (g->tri_novel[slot] & TRI_OTHER)
        slot = slot + 1 < w ? slot + 1 : 0;
    return g->tri_start[slot];
}

/* The words of a prose segment of nw words (see guard_novelty_words). The detector's state
 * (the last three words, the window's counts, its ring's next slot) is kept in locals over
 * the segment's words and written back once: the ring of novel bits is bytes, which may
 * alias any field of the guard, so kept in the guard every field was loaded again after
 * each store to the ring. Out of line: the registers it saves are not paid by the segments
 * outside prose, most of a source file's. */
__attribute__((noinline)) static bool novelty_prose(guard *g, unsigned nw, uint64_t now)
{
    const guard_params *p = g->p;
    const gword *sw = g->sw;
    const unsigned w = p->novelty.window, memory = p->novelty.memory_words,
                   min_seen = p->novelty.min_seen, max_new = p->novelty.max_new_words;
    const bool mask_numbers = p->novelty.mask_numbers;
    const double few = p->novelty.min_ratio * w; /* novel trigrams below this trip */
    uint64_t wh0 = g->wh[0], wh1 = g->wh[1], wh2 = g->wh[2];
    uint64_t ws0 = g->ws[0], ws1 = g->ws[1], ws2 = g->ws[2];
    uint32_t nwords = g->nwords;
    /* A trigram may end in this segment (one of numbers alone needs no table, but is no
     * reason to test for the table per word); the words outside prose before it enter the
     * window first. */
    if (!g->ttab && nwords + nw >= 3) novelty_alloc(g);
    if (g->nov_other && g->ttab) novelty_flush(g, g->nov_other);
    unsigned walpha = g->walpha, slot = g->tri_slot, novel = g->novel, fresh = g->fresh;
    gtri *tab = g->ttab;
    unsigned char *tri_novel = g->tri_novel;
    uint64_t *tri_start = g->tri_start;
    bool tripped = false;
    for (unsigned i = 0; i < nw && !tripped; i++) {
        uint64_t h = sw[i].hash;
        bool alpha = sw[i].alpha;
        if (mask_numbers && !alpha) h = 0x9E3779B97F4A7C15ull; /* "7" is "12" */
        wh0 = wh1;
        wh1 = wh2;
        wh2 = h;
        ws0 = ws1;
        ws1 = ws2;
        ws2 = sw[i].start;
        walpha = (walpha << 1 | alpha) & 7;
        if (++nwords < 3 || !walpha) continue;

        /* A word new within memory_words (a key of its own in the same table): a loop
         * brings none, a list of one product in several colours one an item. */
        uint16_t now_w = (uint16_t)nwords;
        bool new_word = alpha && !table_seen(tab, h * 0xFF51AFD7ED558CCDull, now_w, memory);
        /* The trigram's key: each word's hash times its own odd constant (the product's
         * high bits depend on all of the word's). */
        uint64_t key =
            wh0 * 0x9E3779B97F4A7C15ull ^ wh1 * 0xC2B2AE3D27D4EB4Full ^ wh2 * 0x94D049BB133111EBull;
        unsigned seen = table_seen(tab, key, now_w, memory);
        bool is_novel = seen < min_seen;

        /* The slot's trigram leaves the window (none yet while it is 0, as calloc made
         * it). */
        novel -= tri_novel[slot] & 1;
        fresh -= tri_novel[slot] >> 1 & 1;
        tri_novel[slot] = (unsigned char)(is_novel | new_word << 1 | TRI_FILLED);
        tri_start[slot] = ws0;
        slot = slot + 1 < w ? slot + 1 : 0;
        novel += is_novel;
        fresh += new_word;
        if (fresh > max_new || novel >= few || !(tri_novel[slot] & TRI_FILLED)) continue;
        /* Repetition the prompt asks for, or trigrams it holds, are no paraphrase loop
         * (g_prompt.c): the window is judged afresh from here, so that what follows the
         * copy trips only on a window of its own, and the prompt is not searched again
         * for every word of a long copy. */
        if (novelty_prompt(g, nw, ws0, now)) {
            memset(tri_novel, 0, w);
            novel = fresh = slot = 0;
            continue;
        }
        uint64_t from = window_start(g, slot);
        guard_set_unit(g, from, now);
        guard_trip(g, "novelty", from, now, w - novel);
        tripped = true;
    }
    g->wh[0] = wh0;
    g->wh[1] = wh1;
    g->wh[2] = wh2;
    g->ws[0] = ws0;
    g->ws[1] = ws1;
    g->ws[2] = ws2;
    g->walpha = (unsigned char)walpha;
    g->nwords = nwords;
    g->tri_slot = slot;
    g->novel = novel;
    g->fresh = fresh;
    return tripped;
}

/* The novelty detector, for each word of a segment that ended: is the trigram ending there
 * new within memory_words? Trips when fewer than min_ratio of the last `window` trigrams
 * were. Words outside prose only ever count as evidence of novelty (novelty_other: code
 * and templated comments repeat on purpose, but their fresh names still show the text is
 * going somewhere), and a trigram made only of numbers does not count at all (zero tables,
 * version lists). `now` is the number of bytes fed when it is decided. */
bool guard_novelty_words(guard *g, unsigned nw, bool prose, uint64_t now)
{
    if (!nw) return false; /* a blank line, a rule: nothing to load and store back */
    if (prose) return novelty_prose(g, nw, now);
    novelty_other(g, nw);
    return false;
}
