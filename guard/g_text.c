/* g_text.c — words and segments: cuts the text into words and into segments (lines and
 * sentences), and hands each completed segment to the lines detector (g_lines.c), each
 * completed line to the template detector (g_template.c) and the words to the novelty
 * detector (g_novelty.c). One pass serves both: their per-byte work is
 * the same (hashing words and segments, judging whether a segment is prose).
 *
 * Words are runs of ASCII letters, digits and '_', and of non-ASCII letters; each CJK
 * character is a word of its own. A segment ends at a newline, at a space after . ! ?, or
 * at a CJK stop. Runs of ASCII letters and digits, most of the text, are hashed in a loop of
 * their own (alnum_run); every other byte goes through words_step and lines_step. A token
 * goes byte after byte through the same steps from guard.c's short path (g_short.h). A
 * segment's hash takes each word's hash (case folded) when the word ends and every other
 * byte as it comes: one hash per byte of a word, not two (byte after byte when no detector
 * keeps words). */
#include <stdlib.h>
#include <string.h>

#include "guard/g_short.h"

/* The steps for one byte that text_pass and guard_text_other (guard.c's short path) both
 * run: inlined in each. With two callers GCC kept them out of line, a call per byte of the
 * whole-file pass (9 % more instructions there). */
#define TEXT_STEP __attribute__((always_inline))

/* Is the ASCII byte c a code character (= ; < > @ [ \ ] _ ` { | }), for judging whether a
 * segment is prose? Two 64-bit masks. */
#define BIT(c) (1ull << ((c)&63))
static inline bool is_code(unsigned char c)
{
    static const uint64_t code[2] = {
        BIT(';') | BIT('<') | BIT('=') | BIT('>'),
        BIT('@') | BIT('[') | BIT('\\') | BIT(']') | BIT('_') | BIT('`') | BIT('{') | BIT('|') |
            BIT('}'),
    };
    return code[c >> 6 & 1] >> (c & 63) & 1;
}
#undef BIT

/* A segment (line or sentence) [seg_start, end) is complete when `now` bytes have been
 * fed: hands it to the lines and novelty detectors. Returns true on a trip. Inlined in its
 * two out-of-line callers, seg_end and newline. */
static inline __attribute__((always_inline)) bool segment_end(guard *g, uint64_t end, uint64_t now,
                                                              bool line)
{
    const guard_params *p = g->p;
    uint32_t len = g->seg_len;
    /* Prose: no code characters, mostly letters, at least three words. A prose sentence
     * (ending in . ! ? or a CJK stop) can trigger the lines detector, and so can an item: a
     * whole line of text without code characters ("12. The Wizard of Oz (1939)",
     * "Sincerely,"), whose digits the segment hash leaves out. A numbered item of one word
     * trips only as copies in a row: an answer key ("7. True", "8. False") repeats one
     * word on purpose. */
    bool prose = len && !g->seg_code && g->seg_alpha * 100 >= len * 85 &&
                 (g->seg_words >= 3 || g->seg_wide >= 9);
    unsigned char e = g->seg_lastc;
    bool sentence = prose && (e == '.' || e == '!' || e == '?' || e == 0x82 || e == 0x81 ||
                              e == 0x9F || e == 0xA6);
    bool item =
        line && !g->seg_code && g->seg_words >= 2 && g->seg_alpha >= 4 && g->seg_alpha * 2 >= len;
    bool one_word = item && g->seg_numbered && g->seg_words < 3;
    /* Text for the cycle detector: three words or more and 16 letters, no code characters,
     * at least half letters (a list item with a date, a title cut at an author's initial;
     * not a row of a protocol table, "2  CARD16  sequence number"). */
    bool text =
        len && !g->seg_code && g->seg_alpha * 2 >= len && g->seg_words >= 3 && g->seg_alpha >= 16;
    unsigned kind =
        (text ? GSEG_TEXT : 0) | (sentence ? GSEG_SENTENCE : 0) | (prose ? GSEG_PROSE : 0);
    /* Plain: a line that starts flush with a letter or a quote, no bullet, no indentation. */
    uint64_t s0 = g->seg_start;
    unsigned char first = s0 >= g->base && s0 < end ? guard_at(g, s0) : 0;
    bool plain =
        (s0 == 0 || (s0 > g->base && guard_at(g, s0 - 1) == '\n')) &&
        (((first | 0x20) >= 'a' && (first | 0x20) <= 'z') || first >= 0x80 || first == '"');
    bool ok = g->seg_alpha > 0;
    uint64_t h = g->seg_hash, start = g->seg_start;
    unsigned nw = g->nsw;
    if (nw & 1) g->sw[nw - 1] = g->pw; /* the word waiting for its pair (word_end) */
    g->seg_hash = 0xCBF29CE484222325ull;
    g->seg_len = g->seg_alpha = g->seg_code = g->seg_words = g->seg_wide = 0;
    g->seg_gap = false;
    g->seg_lead = true;
    g->nsw = 0;
    if (p->lines.enabled && ok &&
        guard_lines_segment(g, h, start, end,
                            (sentence && len >= p->lines.min_segment_bytes) || item, prose || item,
                            plain, one_word, now))
        return true;
    if (p->cycle.enabled && ok && guard_cycle_segment(g, nw, start, end, kind, now)) return true;
    return p->novelty.enabled && nw && guard_novelty_words(g, nw, prose, now);
}

/* segment_end out of line, for a sentence's end and the end of the text. RARE_PATH. */
RARE_PATH static bool seg_end(guard *g, uint64_t end, uint64_t now, bool line)
{
    return segment_end(g, end, now, line);
}

/* A non-space byte joins the current segment (one space stands for each gap). */
static inline void seg_add(guard *g, unsigned char b, uint64_t pos)
{
    /* Branch-free on the gap: word boundaries are too frequent to predict. */
    uint64_t spaced = guard_fnv(g->seg_hash, ' ');
    g->seg_hash = g->seg_gap ? spaced : g->seg_hash;
    g->seg_words += g->seg_gap;
    if (!g->seg_len) {
        g->seg_start = pos;
        g->seg_words = 1;
        g->seg_numbered = false;
    }
    g->seg_gap = false;
    g->seg_lead = false;
    g->seg_lastc = b;
    g->seg_hash = guard_fnv(g->seg_hash, b);
    g->seg_len++;
}

/* A line [start, end) is complete when `now` bytes have been fed: hands its body to the
 * template and block detectors. Returns true on a trip. */
static inline bool line_end(guard *g, uint64_t start, uint64_t end, uint64_t now)
{
    const guard_params *p = g->p;
    if (!p->lines.enabled) return false;
    if (start >= g->base) guard_line_body(g, &start, &end);
    /* A blank line changes neither detector (both return at once): neither is called. */
    if (start == end) return false;
    if (p->lines.template_run && guard_template_line(g, start, end, now)) return true;
    return (p->lines.block_copies || p->lines.art_run) && guard_block_line(g, start, end, now);
}

/* A newline at offset pos ends a segment and a line: one call from the text pass for both
 * (a call and its set-up per line fewer). Returns true on a trip. RARE_PATH. */
RARE_PATH static bool newline(guard *g, uint64_t pos)
{
    uint64_t ls = g->line_start;
    g->line_start = pos + 1;
    /* An empty segment (a blank line, a line after a sentence's end) is in its state after a
     * segment's end already, and has no word: as at the end of the text, nothing is ended. */
    if (g->seg_len && segment_end(g, pos, pos + 1, true)) return true;
    return line_end(g, ls, pos, pos + 1);
}

/* Per byte b at offset pos, for the lines and novelty detectors. Returns true on a trip.
 * `quick` (a constant): b is no comma and the byte before no digit (see text_quick). */
TEXT_STEP static inline bool lines_step(guard *g, unsigned char b, uint64_t pos, bool quick)
{
    unsigned char p1 = g->prev, p2 = g->prev2;
    g->prev2 = p1;
    g->prev = b;
    if (!quick && p1 >= '0' && p1 <= '9' && g->p->lines.enabled && g->p->lines.count_run &&
        guard_count_number(g, pos, pos + 1))
        return true;
    if (b == '\n') return newline(g, pos);
    if (b == ' ' || b == '\t' || b == '\r') {
        if ((p1 == '.' || p1 == '!' || p1 == '?') && g->seg_alpha) /* not "12. " */
            return seg_end(g, pos, pos + 1, false);
        g->seg_gap = g->seg_len > 0;
        return false;
    }
    /* A comma after a letter may end a name of an identifier list (g_template.c); after
     * anything else the item is no name, and the next one spans it. */
    if (!quick && __builtin_expect(b == ',', 0) &&
        (((p1 | 0x20) >= 'a' && (p1 | 0x20) <= 'z') || p1 == '_') && g->p->lines.enabled &&
        g->p->lines.template_run && guard_template_item(g, g->line_start, pos, pos + 1))
        return true;
    seg_add(g, b, pos);
    /* b is no ASCII letter or digit (alnum_run and guard_text_alnum take those): an ASCII
     * byte here is a letter never, a code character maybe; any other byte is a letter. */
    if (b < 0x80) {
        g->seg_code += is_code(b);
        return false;
    }
    g->seg_alpha++;
    g->seg_wide++;
    /* CJK sentence ends: 。 (E3 80 82), ！ (EF BC 81), ？ (EF BC 9F). */
    if ((p2 == 0xE3 && p1 == 0x80 && b == 0x82) ||
        (p2 == 0xEF && p1 == 0xBC && (b == 0x81 || b == 0x9F)))
        return seg_end(g, pos + 1, pos + 1, false);
    return false;
}

/* ---- words ------------------------------------------------------------------------- */

/* Makes room for one more word in the segment's list: 16 words at first, doubled up to
 * GUARD_SEG_WORDS. RARE_PATH. */
RARE_PATH static void words_grow(guard *g)
{
    unsigned cap = g->sw_cap ? g->sw_cap * 2 : 16;
    if (cap > GUARD_SEG_WORDS) cap = GUARD_SEG_WORDS;
    /* On a line's boundary: a pair of words (word_end) is then on one line. */
    gword *sw = aligned_alloc(64, cap * sizeof(*sw));
    if (!sw) abort();
    if (g->nsw > 1) memcpy(sw, g->sw, (g->nsw & ~1u) * sizeof(*sw));
    free(g->sw);
    g->sw = sw;
    g->sw_cap = cap;
}

/* A word ended: it joins the current segment's word list (judged at the segment's end). The
 * list is written two words at a time, on one cache line: a word of an even index waits in
 * pw for the next (segment_end writes it when the count is odd). With many paced streams a
 * word's own write was a cache miss at every word end. `quick` (a constant): the list has
 * room (see text_quick). */
static inline void word_end(guard *g, bool quick)
{
    if (!g->w_len) return;
    const uint64_t wh = g->w.hash;
    if (quick || g->nsw < GUARD_SEG_WORDS) { /* quick: nsw < sw_cap <= GUARD_SEG_WORDS */
        if (!quick && g->nsw == g->sw_cap) words_grow(g);
        /* The pair pw, w goes where it belongs without a branch (whether the count is odd
         * is as unpredictable as the words, and the branch cost the whole-file way 2-3 %):
         * at an odd index to the list (sw_cap is even: nsw < sw_cap has room for both), at
         * an even one onto w and pw, which follows it: pw takes the word, and w, whose
         * word is over, pw's stale copy (reset below, and at the next word's start). */
        const gword pair[2] = {g->pw, g->w};
        const uintptr_t here = (uintptr_t)&g->w,
                        list = (uintptr_t)g->sw + ((uintptr_t)g->nsw - 1) * sizeof(gword);
        memcpy((void *)(here ^ ((here ^ list) & -(uintptr_t)(g->nsw & 1))), pair, sizeof pair);
        g->nsw++;
    }
    /* The segment's hash takes the word's, but a number that opens it ("7. X" is "8. X"). */
    if (!g->seg_lead) g->seg_hash = (g->seg_hash ^ wh) * 0x100000001B3ull;
    g->w_len = 0;
    g->w.hash = 0xCBF29CE484222325ull;
}

static bool is_cjk(uint32_t cp)
{
    return (cp >= 0x2E80 && cp <= 0x2FFF) || (cp >= 0x3040 && cp <= 0x9FFF) ||
           (cp >= 0xAC00 && cp <= 0xD7AF) || (cp >= 0xF900 && cp <= 0xFAFF) ||
           (cp >= 0x20000 && cp <= 0x3FFFF);
}

static bool is_sep_cp(uint32_t cp)
{
    return (cp >= 0x2000 && cp <= 0x2BFF) || (cp >= 0x3000 && cp <= 0x303F) ||
           (cp >= 0xFF00 && cp <= 0xFF20) || cp == 0xA0;
}

static void word_add(guard *g, unsigned char c, uint64_t pos, bool letter)
{
    if (!g->w_len) {
        g->w.start = pos;
        g->w.alpha = letter;
    }
    g->w_len++;
    g->w.hash = guard_fnv(g->w.hash, c >= 'A' && c <= 'Z' ? c | 0x20 : c);
}

/* Splits the stream into words: runs of ASCII letters, digits and '_', and of non-ASCII
 * letters; each CJK character is a word of its own. Must run before lines_step for the
 * same byte, so that a word is in its segment's list when the segment ends. b is the byte
 * at offset pos, never an ASCII letter or digit: alnum_run takes those. `quick` (a
 * constant): b is ASCII and the word list has room (see text_quick). */
TEXT_STEP static inline void words_step(guard *g, unsigned char b, uint64_t pos, bool quick)
{
    if (quick || b < 0x80) {
        g->cp_need = 0;
        if (b == '_')
            word_add(g, b, pos, true);
        else
            word_end(g, quick);
        return;
    }
    if (b >= 0xC0) {
        g->cp_need = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : 1;
        g->cp = b & (b >= 0xF0 ? 0x07 : b >= 0xE0 ? 0x0F : 0x1F);
        g->cp_start = pos;
        return;
    }
    if (!g->cp_need) { /* a stray continuation byte: a separator */
        word_end(g, false);
        return;
    }
    g->cp = (g->cp << 6) | (b & 0x3F);
    if (--g->cp_need) return;
    if (is_sep_cp(g->cp)) {
        word_end(g, false);
        return;
    }
    bool cjk = is_cjk(g->cp);
    if (cjk) /* scripts without spaces: every character is a word */
        word_end(g, false);
    for (uint64_t o = g->cp_start; o <= pos; o++)
        word_add(g, guard_at(g, o), g->cp_start, true);
    if (cjk) word_end(g, false);
}

/* guard_alnum_class (g_short.h). */
const unsigned char guard_alnum_class[256] = {
    ['0' ... '9'] = 1, ['A' ... 'Z'] = 2, ['a' ... 'z'] = 2};

/* The most common bytes, a run of ASCII letters and digits from s[i] (offset fed0 + i) up
 * to lim: does exactly what words_step and lines_step do with each of them, with the word's
 * hash (or without words, the segment's) in a register. One loop finds the run's end and hashes it: most runs are words of a
 * few letters, where finding the end 16 bytes at a time first, then hashing, cost a second
 * loop and its mispredicted exit per word, and more instructions than they saved. Returns
 * the index past the run. */
TEXT_STEP static inline size_t alnum_run(guard *g, const unsigned char *s, size_t i, size_t lim,
                                         uint64_t fed0, bool words)
{
    guard_text_run_start(g, s[i], fed0 + i, words);
    uint64_t wh = g->w.hash, sh = g->seg_hash;
    size_t j = i;
    if (g->seg_lead) { /* a number opening the segment is left out: "7. X" is "8. X" */
        while (j < lim && guard_alnum_class[s[j]] == 1)
            wh = guard_fnv(wh, s[j++]);
        g->seg_lead = j == lim || !guard_alnum_class[s[j]];
    }
    /* The classes' sum: a digit adds 1, a letter 2, so the letters are the sum less the
     * bytes. One pointer, one load of each byte: 14 instructions a byte, where the class
     * shifted and the byte loaded twice took 16. */
    const unsigned char *p = s + j, *const e = s + lim;
    const size_t from = j;
    uint32_t sum = 0;
    for (; p < e; p++) {
        const uint64_t b = *p;
        const uint32_t c = guard_alnum_class[b];
        if (!c) break;
        sum += c;
        /* With words, the segment takes the word's hash when it ends (word_end); lower
         * case (digits have that bit already). */
        if (words)
            wh = guard_fnv(wh, (unsigned char)(b | 0x20));
        else
            sh = guard_fnv(sh, (unsigned char)b);
    }
    j = (size_t)(p - s);
    const uint32_t letters = sum - (uint32_t)(j - from);
    uint32_t run = (uint32_t)(j - i);
    if (words) {
        g->w.hash = wh;
        g->w_len += run;
    }
    g->seg_hash = sh;
    g->seg_len += run;
    g->seg_alpha += letters;
    g->seg_lastc = s[j - 1];
    g->prev2 = run > 1 ? s[j - 2] : g->prev;
    g->prev = s[j - 1];
    return j;
}

/* Any other byte, at offset pos, for the words, lines and novelty detectors. Returns true
 * on a trip. `quick` (a constant): text_quick holds. */
TEXT_STEP static inline bool text_other(guard *g, unsigned char b, uint64_t pos, bool words,
                                        bool quick)
{
    if (words) words_step(g, b, pos, quick);
    return lines_step(g, b, pos, quick);
}

/* Does the step for b call into a detector only as its last act (a segment's end), if at
 * all? Not after a digit (a number may end: the count detector), at a comma (a name may
 * end: the template detector), for a non-ASCII byte or a word list to grow. Most bytes
 * between words: their step then needs no registers saved across a call. */
static inline bool text_quick(const guard *g, unsigned char b, bool words)
{
    unsigned char p1 = g->prev;
    return b < 0x80 && b != ',' && !(p1 >= '0' && p1 <= '9') &&
           !(words && g->w_len && g->nsw == g->sw_cap);
}

/* text_other for the bytes text_quick leaves out. RARE_PATH. */
RARE_PATH static bool text_other_full(guard *g, unsigned char b, uint64_t pos, bool words)
{
    return text_other(g, b, pos, words, false);
}

/* Is c a blank: a space, a tab or a CR? */
static inline bool is_blank(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

/* text_other out of line, for guard.c's short path (g_short.h). */
bool guard_text_other(guard *g, unsigned char b, uint64_t pos, bool words)
{
    /* A blank after a blank changes nothing but prev and prev2 (see text_pass). */
    if (is_blank(b) && is_blank(g->prev)) {
        g->prev2 = g->prev;
        g->prev = b;
        return false;
    }
    if (!text_quick(g, b, words)) return text_other_full(g, b, pos, words);
    return text_other(g, b, pos, words, true);
}

/* The words, lines and novelty detectors' pass (guard_detector). Words are only kept when
 * the novelty detector reads them. */
static size_t text_pass(guard *g, size_t lim, uint64_t fed0)
{
    const bool words = guard_text_words(g->p);
    const unsigned char *s = g->buf + (size_t)(fed0 - g->base);
    size_t i = 0;
    while (i < lim) {
        unsigned char b = s[i];
        if (guard_alnum_class[b]) {
            /* Two copies of the run's loop, words kept or not: no test of `words` per byte. */
            i = words ? alnum_run(g, s, i, lim, fed0, true) : alnum_run(g, s, i, lim, fed0, false);
            /* A space after a word that ends in a letter (most spaces): what text_other does
             * with it, with nothing to test but room in the word list: the word ends, the
             * gap is set (the run joined the segment), no digit or '.' precedes it. */
            if (i == lim || s[i] != ' ' || guard_alnum_class[s[i - 1]] != 2 ||
                (words && g->nsw == g->sw_cap))
                continue;
            if (words) {
                g->cp_need = 0;
                word_end(g, true);
            }
            g->seg_gap = true;
            g->prev2 = s[i - 1];
            g->prev = ' ';
            b = s[i++];
        } else {
            if (text_other(g, b, fed0 + i, words, false)) return i;
            i++;
        }
        /* After a blank (space, tab, CR) the next blanks change nothing but prev and prev2:
         * no word is open, the gap is set already (or the segment just ended), and no digit
         * or '.' precedes them. Indentation, a sixth of a source file, is skipped so. */
        if (is_blank(b)) {
            size_t j = i;
            while (j < lim && is_blank(s[j]))
                j++;
            if (j > i) {
                g->prev2 = s[j - 2];
                g->prev = s[j - 1];
                i = j;
            }
        }
    }
    return lim;
}

/* ---- the detector ------------------------------------------------------------------ */

static void text_init(guard *g)
{
    g->seg_hash = g->w.hash = 0xCBF29CE484222325ull;
    g->seg_lead = true;
}

static void text_release(guard *g)
{
    free(g->sw);
    guard_tables_release(g);
}

/* A reset guard keeps its word list (nsw is 0: its words are never read): an answer whose
 * segment has many words (the bench's stamps end none) grew it anew each time, four
 * allocations and copies. The tables go to the store, as at a release. */
static void text_reset(guard *g, const guard *old)
{
    memcpy(g->tab, old->tab, sizeof(g->tab));
    guard_tables_release(g);
    g->sw = old->sw;
    g->sw_cap = old->sw_cap;
    text_init(g);
}

/* The last word and the last segment are complete at the end of the text. */
static bool text_finish(guard *g)
{
    const guard_params *p = g->p;
    if (guard_text_words(p)) word_end(g, false);
    if (g->seg_len && seg_end(g, g->fed, g->fed, true)) return true;
    return g->line_start < g->fed && line_end(g, g->line_start, g->fed, g->fed);
}

static bool text_on(const guard_params *p)
{
    return p->lines.enabled || p->novelty.enabled || p->cycle.enabled;
}

const guard_detector guard_det_text = {
    .name = "text",
    .on = text_on,
    .init = text_init,
    .release = text_release,
    .reset = text_reset,
    .pass = text_pass,
    .finish = text_finish,
};
