/* guard_int.h — private to guard/: the layout of guard_params and of a guard, and the one
 * interface every detector implements.
 *
 * guard.c owns the guard: its history of the bytes fed, the feeding loop, the verdict and
 * the holdback. Each detector lives in a file of its own (g_leak.c, g_rules.c, g_repeat.c,
 * g_text.c with g_lines.c, g_template.c and g_novelty.c, g_budget.c) and is reached only through its
 * guard_detector entry, as Redis reaches t_string.c and t_list.c through one command table:
 * to read or replace one detector, read its file and the part of struct guard marked as its
 * own. guard_params.c holds the defaults, cloning and the JSON settings.
 *
 * Nothing outside guard/ includes this file; the public contract is guard.h. */
#ifndef LG_GUARD_INT_H
#define LG_GUARD_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <string.h>

#include "guard/guard.h"

/* Classes of repeating unit. A unit of ordinary prose or punctuation ("lambda ", "?!",
 * "。") is judged by the period table alone; the other classes are shapes that real code
 * and documents repeat on purpose, so they need more bytes and more repeats. */
typedef enum {
    GR_NORMAL = 0,
    GR_RULE,  /* separators, whitespace, box drawing: "----", "═══", "    " */
    GR_DATA,  /* digits without words: "0, ", "0x00, ", "{0, 0}, " */
    GR_ITEM,  /* one short word in a list: "None, ", "null,", "'', " */
    GR_LINE,  /* whole lines of code: "assert f(1) == 1\n", "    None,\n" */
    GR_TABLE, /* anything with a '|': "| yes | no |\n", "| --- " */
    GR_BLOB,  /* one token with no spaces: base64 "AAAA", "xxxxxxxx" */
    GR_CODE,  /* code punctuation: "), POINTER(BIGNUM", "<td>&nbsp;</td>", blocks */
    GR_TEXT,  /* lines of words that are no sentences: "Sincerely,\n\n", "- Smart retail\n" */
    GR_ART,   /* lines without a letter or digit: " _____\n", ".-..-.\n", a blank Braille row */
    GR_COUNT,
} guard_rclass;

#define GUARD_MAX_PERIOD_STEPS 16
#define GUARD_MAX_LEAKS        16
#define GUARD_MAX_LEAK_LEN     64
#define GUARD_HISTORY          8192 /* bytes of history a guard always keeps (max period ≤ 1/2) */

typedef struct guard_rule {
    char *name;
    char *detector; /* "rule:<name>" */
    char *pattern;
    pcre2_code *re;
    bool has_first;          /* first[] is known: a match can only start on those bytes */
    unsigned char first[32]; /* bitset of possible first bytes (a superset) */
} guard_rule;

struct guard_params {
    lg_channel ch;
    bool enabled;

    struct {
        bool enabled;
        uint32_t min_bytes;
        uint32_t max_period;
        size_t n_steps;
        struct {
            uint32_t max_period;
            double repeats;
        } steps[GUARD_MAX_PERIOD_STEPS];
        double fence_factor;
        struct {
            uint32_t min_bytes;
            double min_repeats;
            uint32_t max_period; /* characters; 0: no limit */
        } cls[GR_COUNT];
        /* Derived (guard_params_derive): the tail length a unit of p bytes needs before
         * its class is looked at, the lower bound of every class's threshold. */
        uint32_t base_need[GUARD_HISTORY / 2 + 1];
    } repeat;

    struct {
        bool enabled;
        unsigned min_repeats;
        unsigned window; /* segments remembered */
        unsigned min_segment_bytes;
        double min_repeat_ratio;
        unsigned min_run; /* returns in a row that trip, text at least half */
        /* The template detector (g_template.c): lines in a row on one template that trip
         * (0: off), and the bytes and share of the longer line the template must hold. */
        unsigned template_run;
        unsigned template_bytes;
        double template_share;
        /* The counting detector (g_count.c): numbers in a row that count up with the same
         * text between them that trip (0: off). */
        unsigned count_run;
        /* The block detector (g_block.c): copies and lines a block of lines needs (0
         * copies: off). */
        unsigned block_copies;
        unsigned block_lines;
        /* Art lines in a row with one texture that trip (g_block.c; 0: off). */
        unsigned art_run;
    } lines;

    struct {
        bool enabled;
        unsigned window; /* trigrams judged together */
        double min_ratio;
        unsigned memory_words;  /* how far back a trigram counts as seen */
        unsigned min_seen;      /* earlier occurrences that make a trigram not novel (1-3) */
        bool mask_numbers;      /* a word starting with a digit counts as any number */
        unsigned max_new_words; /* words new within memory_words the window may hold */
    } novelty;

    struct {
        bool enabled;
        unsigned window;       /* segments remembered: the longest cycle + 1 */
        unsigned copies;       /* copies of the cycle, the first included, that trip */
        unsigned min_segments; /* segments of the replay equal with their numbers */
        uint32_t min_bytes;    /* bytes of the replay */
        /* A replay equal only with its numbers aside: copies that trip (0: never) and its
         * segments (g_cycle.c). */
        unsigned masked_copies;
        unsigned masked_min_segments;
        /* A mixed replay (g_cycle.c): segments judged together (0: off, at most 32), how
         * many of them may be new, the changes of order they need. */
        unsigned mix_window, mix_new, mix_breaks;
        /* A sentence of this many bytes said a third time after a replay of the passage
         * around it (g_cycle.c; 0: off). */
        uint32_t third_bytes;
        /* A fuzzy replay (g_cycle.c): the share of two rounds equal to the round before
         * that trips (0: off). */
        double fuzzy_share;
    } cycle;

    guard_rule *rules;
    size_t n_rules;
    uint32_t rule_max_match_bytes;
    /* Derived (guard_rules_derive), read-only and shared by every guard of these params:
     * per byte value, bit i when rule i (< GUARD_RULE_LANES) has a known set of first bytes
     * and the byte is one; bit i of rule_jit when rule i (< GUARD_RULE_LANES) goes to
     * pcre2_jit_match directly; the ovector pairs a match of any rule fills. */
    unsigned char rule_first[256];
    unsigned char rule_jit;
    uint32_t rule_ovec;

    size_t n_leaks;
    char leaks[GUARD_MAX_LEAKS][GUARD_MAX_LEAK_LEN + 1];
    size_t leak_len[GUARD_MAX_LEAKS];
    /* Derived (guard_leak_derive), read-only and shared by every guard of these params:
     * per byte value, GUARD_LEAK_FIRST / GUARD_LEAK_LAST when it starts / ends a token; the
     * longest token (0: none); for a 16-byte scan, when at most 4 bytes start or end one
     * (else n_leak_bytes is 0), those bytes each repeated 16 times (the rest repeat the
     * first). */
    unsigned char leak_class[256];
    size_t leak_maxlen;
    unsigned char leak_splat[4][16];
    unsigned n_leak_bytes;

    uint64_t budget_bytes;               /* 0: off */
    uint64_t empty_answer_min_reasoning; /* 0: off */
    size_t holdback_max;
};

const char *guard_rclass_name(guard_rclass c);

#define GUARD_LEAK_FIRST 1
#define GUARD_LEAK_LAST  2
/* Fills the params' derived leak tables from their leak tokens (g_leak.c). */
void guard_leak_derive(guard_params *p);
/* The rules' derived fields (g_rules.c), after any change of the rules. */
#define GUARD_RULE_LANES 8
void guard_rules_derive(guard_params *p);

/* Repeats the period table asks of a unit of `period` bytes or characters; 0 past it. */
double guard_steps_repeats(const guard_params *p, uint32_t period);
/* max(min_bytes, repeats × period) rounded up, or UINT32_MAX for repeats 0. */
uint32_t guard_need_for(uint32_t period, double repeats, uint32_t min_bytes);

/* ---- a guard --------------------------------------------------------------------------- */

#define GUARD_BUF (2 * GUARD_HISTORY) /* linear history, slid down by half when full */
#define GUARD_BUF_FIRST                                                                            \
    1024 /* the history starts this small and doubles up to GUARD_BUF:                             \
            most answers are short, and memory per stream counts */
/* The 8-gram table has 2^10 slots, 2 KiB. 2^12 cost 4 KiB more per guard than 2^11 for 139
 * bytes less of loop shown to clients over the 1,800 loops of the recall corpus (22 loops,
 * ≤ 19 bytes each); 2^10 costs 2 KiB less than 2^11 for 255 bytes more over the 276 trips
 * of AlpacaEval's answers and 1,267 files fed in tokens (0.2 %; tests/bench/HISTORY.md,
 * gv3): a period whose 8-gram's slot was taken since is found at a later lookup. The
 * verdicts are the same. */
#define GUARD_GTAB_BITS     10
#define GUARD_NCAND         8
#define GUARD_PROMPT_COUNTS 8
#define GUARD_SHORT         9 /* pieces shorter than this (a token) go byte after byte */
#define GUARD_RULE_STEP     64
#define GUARD_TTAB_BITS     10
#define GUARD_UNIT_MAX      256
#define GUARD_SEG_BUCKETS   8 /* hash buckets per segment of the lines window */
#define GUARD_CYC_BUCKETS   256
#define GUARD_FUZZY_LAG     16  /* fuzzy replays of 2-16 segments (g_cycle.c) */
#define GUARD_SEG_WORDS     128 /* words of one segment the novelty detector reads */

/* The text detectors' tables (guard_table): the lines window and its buckets, the template's
 * and the block's state, the novelty table and ring, the cycle ring. */
enum { GT_SEGS, GT_SEG_LAST, GT_TPL, GT_BLK, GT_TTAB, GT_TRI_START, GT_TRI_NOVEL, GT_CYC, GT_N };

/* A helper the per-byte loops call only now and then (a new period, a candidate at its
 * threshold, the end of a sentence) stays out of line: inlined into them it took the
 * registers those loops keep their state in, and they spilled it to the stack on every
 * byte. Out of line: 4.2 % fewer instructions on the bench's stamps, 2.6 % on guard_bench's
 * real text (cachegrind), verdicts unchanged. */
#define RARE_PATH __attribute__((noinline))

/* Code that runs once per guard (a table's allocation) or at a verdict (a candidate
 * judged, a trip): out of line as RARE_PATH, and out of the way of the code that runs per
 * byte and per line (GCC puts it with the other cold code, in .text.unlikely, and lays out
 * the branches to it as not taken). Measured with an L1i of 32 KiB (cachegrind --I1=32768,
 * 8,64; this VM's is 64 KiB), the guard's per-line detectors otherwise evicted each other's
 * code and the per-byte loops' (tests/bench/HISTORY.md, gwall). */
#define COLD_PATH __attribute__((noinline, cold))

/* A live candidate period. Its run (the consecutive bytes ending now with s[i] == s[i -
 * period]) is not counted byte by byte: it is the bytes fed since `start`. 32 bytes, two to
 * a cache line: a token reads every live one. */
typedef struct gcand {
    uint64_t start;    /* offset of the run's first byte */
    uint64_t ready_at; /* offset of the byte at which run + period reaches the periodic tail
                          length that trips */
    uint64_t breaks;   /* set as each feed starts (repeat_pass) or per byte
                          (guard_repeat_step): the first offset being fed that breaks the
                          period, or the one past them */
    uint32_t period;
    bool judged; /* ready_at includes the unit's class and fence context */
} gcand;
_Static_assert(sizeof(gcand) == 32, "two candidates to a cache line");

typedef struct gseg {
    uint64_t hash;
    uint64_t start; /* absolute offset of the segment's first byte */
    bool seen;      /* its hash was already in the window when it arrived */
    bool prose;
    uint16_t prev; /* how many segments before it the previous one of its bucket came (0:
                      none in the window) */
} gseg;

/* A word of the current segment, judged when the segment ends (16 bytes, not 24: memory per
 * stream counts). */
typedef struct gword {
    uint64_t hash;
    uint64_t start : 63, alpha : 1;
} gword;

/* A segment remembered by the cycle detector (g_cycle.c): its skeletons with and without
 * numbers, and how many segments before it the previous one of its bucket came (0: none in
 * the ring). */
typedef struct gcyc {
    uint32_t exact, masked;
    uint32_t start; /* low 32 bits of its first byte's offset */
    uint32_t num;   /* its first number after an item number; UINT32_MAX: none */
    uint16_t prev;
    uint16_t len; /* its bytes, at most UINT16_MAX */
} gcyc;

/* A trigram table entry, 4 bytes: memory per stream counts. Bits 0-15: the low 16 bits of
 * the index of the word that last completed it; 16-17 `seen`, how many times it came within
 * memory_words of the time before, up to 3; 18-31 the tag, 14 bits of the trigram's hash.
 * A wrong "seen" needs a tag collision in one of two slots, 1 in 8,192. */
typedef uint32_t gtri;

struct guard {
    /* With many streams each token finds its guard cold: every cache line it reads is a
     * miss. guard_new aligns the guard to a line, and its fields are laid out by how often a
     * token reads them, then by owner: the first 3 lines hold what every token reads (they
     * were spread over 9, then took 5, then 4, and two more for the list of detectors on and
     * one for the count detector's state), the 4th what some tokens read (a segment's or a
     * line's first byte, a character of several bytes, a fence, a number of at most 9
     * digits, a verdict), the candidates the next one or two, when there are any. The
     * assertions after the struct keep them so. */

    /* ---- lines 0-2: read by every token ---- */
    /* guard.c: the history, buf[i] the byte at absolute offset base + i; it holds the fed -
     * base bytes fed since base. */
    const guard_params *p;
    uint64_t fed;
    unsigned char *buf;
    uint64_t base;
    uint32_t bcap; /* bytes allocated (GUARD_BUF_FIRST .. GUARD_BUF) */
    unsigned on;   /* bit k: guard.c's table entry k is on (its passes, steps and hooks run) */
    bool finished;
    bool tripped;
    bool content_seen; /* a non-whitespace byte was fed (empty_answer) */

    /* leak (g_leak.c); its tables are the params' */
    bool leaks_off;      /* guard_disable_leaks */
    uint64_t leak_start; /* offset + 1 of the last byte that can start a token */

    /* g_text.c: the current segment (line or sentence) and its words. */
    uint64_t seg_hash;
    gword *sw; /* the segment's first words, up to GUARD_SEG_WORDS; grown on demand from 16
                  (most segments are short), on a cache line's boundary */
    gword w;   /* the current word: its hash so far, first byte, whether it starts with a
                 letter */
    gword pw;  /* right after w: word nsw - 1 when nsw is odd (word_end writes sw's words in
                 pairs) */
    uint32_t seg_len, seg_alpha, seg_code, seg_words; /* non-space bytes, letters, code chars */
    unsigned nsw, sw_cap;
    uint32_t w_len;
    unsigned char cp_need; /* continuation bytes still expected */
    unsigned char seg_lastc;
    bool seg_lead; /* only digits so far: a list number, left out of the hash */
    bool seg_gap;
    unsigned char prev, prev2;

    /* count (g_count.c): the text before the last number (its offset << 8 | its length + 1;
     * 0: none) and the end of the last number; how many numbers in a row counted up. In
     * these lines: a stamp's number ends at every token. */
    uint64_t cnt_gap, cnt_last_end;
    unsigned cnt_run;

    /* repeat (g_repeat.c) */
    uint32_t anchor_min, anchor_block; /* the anchors' lowest ranks (guard_gram_anchor) */
    unsigned char ncand;
    unsigned char fstate; /* code fences (below): 0 leading spaces, 1 in a fence run, 2 rest of
                             line */
    uint64_t gram;
    uint16_t *gtab; /* 8-gram hash -> low 16 bits of the offset + 1 of its last byte, at
                       anchors; a stale or colliding entry is caught by the run measurement */

    /* ---- line 3: read by some tokens ---- */
    lg_channel ch; /* guard.c: for the verdict */

    /* g_text.c: the current segment's letters of several bytes and first byte, the code
     * point being decoded and its first byte, whether the segment's first word is a
     * number. */
    uint32_t seg_wide;
    uint64_t seg_start, cp_start;
    uint32_t cp;
    bool seg_numbered;

    /* repeat (g_repeat.c): Markdown code fences (``` or ~~~ at the head of a line, ≤ 3
     * spaces in). */
    unsigned char fch, open_ch;
    bool in_fence;
    unsigned fcol, frun;
    unsigned open_len;

    /* count (g_count.c): the last number (at most DIGITS_MAX digits; a longer one is not
     * kept), the offset where the count began. */
    uint32_t cnt_value;
    uint64_t cnt_from;

    _Alignas(64) gcand cand[GUARD_NCAND]; /* the live candidates, ncand of them */

    /* lines (g_lines.c): allocated at the first segment */
    gseg *segs;
    unsigned seg_mask;
    uint16_t *seg_last; /* per hash bucket (seg_bmask + 1 of them): the newest segment's
                           number + 1, mod 2^16; 0: none */
    unsigned seg_bmask;
    uint64_t nsegs;
    unsigned lines_run, lines_run_text; /* the trailing run of returns, and its text ones */
    unsigned lines_same;                /* segments in a row equal to the one before */

    uint64_t line_start;   /* g_text.c: the current line's first byte */
    struct gtemplate *tpl; /* template (g_template.c): its last lines and runs; NULL until
                              the first line */

    struct gblock *blk; /* block (g_block.c): its ring of lines; NULL when off */

    /* novelty (g_novelty.c) */
    uint64_t wh[3], ws[3];
    unsigned char walpha; /* bit i: word i of the trigram starts with a letter */
    uint32_t nwords;
    gtri *ttab;
    uint64_t *tri_start;      /* ring over the novelty window: first byte of each trigram */
    unsigned char *tri_novel; /* per window slot: novel trigram, new word, filled bits */
    unsigned tri_slot;        /* the ring's next slot: its oldest trigram once it is full */
    unsigned novel;           /* novel trigrams in the window */
    unsigned fresh;           /* words new within memory_words among the window's last words */
    unsigned nov_other;       /* words outside prose not yet in the window (at most window) */

    /* cycle (g_cycle.c): the ring of segments, how many there were, and the replay: its
     * lag, segments, those equal with their numbers, bytes, prose bytes and first byte. */
    gcyc *cyc;
    unsigned cyc_mask;  /* the ring holds cyc_mask + 1 segments, >= window */
    uint16_t *cyc_last; /* GUARD_CYC_BUCKETS, made with the ring: per low bits of the masked
                           skeleton, the newest segment's number + 1, mod 2^16; 0: none */
    uint64_t cyc_n, cyc_from;
    unsigned cyc_quiet; /* segments since the last text one, up to window + 1 */
    unsigned cyc_lag, cyc_run, cyc_exact, cyc_stepped;
    /* the replay's bytes, those of text, and of sentences */
    uint32_t cyc_bytes, cyc_text_bytes, cyc_sentence_bytes;
    /* bit k, for the segment k before the newest: it came before; it did right after a
     * return, at a new lag; it is text; it came twice before (mixed replays) */
    uint32_t cyc_ret, cyc_brk, cyc_text, cyc_third;
    /* fuzzy replays: bit k, for the segment k before the newest: it is prose; per lag
     * L = 2 … GUARD_FUZZY_LAG, the segments of 2L equal to the one L before that trip */
    uint32_t cyc_prose;
    unsigned char cyc_fz_need[GUARD_FUZZY_LAG - 1];
    unsigned char cyc_fz_lo[GUARD_FUZZY_LAG - 1]; /* per L: fewer returns, no lag >= L trips */

    /* The tables above (segs … cyc) this answer holds, with their sizes (guard_table), and
     * where they come from and go back to (NULL: malloc). */
    struct guard_tab {
        void *p;
        size_t size;
    } tab[GT_N];
    struct guard_store *store;

    /* rules (g_rules.c) */
    pcre2_match_data *md;
    /* Per rule: no match can start before this offset (every earlier start already failed
     * before reaching the end of the text). Advanced by checks and by guard_suspect, which
     * is why it lives behind a pointer: the suspect query takes a const guard. */
    uint64_t *rule_from;

    /* The request's prompt (g_prompt.c): the last bytes of its text, and the largest count
     * of copies it asks for. */
    char *prompt;
    size_t prompt_len, prompt_cap;
    uint32_t prompt_asked;
    struct gprompt_of {
        uint32_t n;
        char w[16]; /* lower case */
    } * prompt_of;  /* "100 None": n copies of a unit holding word w; GUARD_PROMPT_COUNTS,
                       made at the first such pair (most prompts have none) */
    unsigned prompt_nof;
    uint32_t prompt_number; /* the largest number in the prompt (g_count.c's slack) */

    /* The verdict (guard.c); unit is allocated when it trips. */
    guard_verdict v;
    char *unit;
};
/* The lines guard_warm prefetches: what every token reads (0-2) and what some do (3). */
#define GUARD_HOT_LINES 4
_Static_assert(offsetof(struct guard, ch) <= 192, "what every token reads is 3 cache lines");
_Static_assert(offsetof(struct guard, cand) == 64 * GUARD_HOT_LINES,
               "what some tokens read is the 4th");
_Static_assert(offsetof(struct guard, pw) == offsetof(struct guard, w) + sizeof(gword),
               "word_end writes w and pw as a pair");

/* ---- the detector interface ------------------------------------------------------------ */

/* One detector. The guard feeds text in pieces (see guard.c, feed_piece): every detector
 * reads the same piece, in table order, from the history where the guard has copied it.
 * A piece shorter than GUARD_SHORT goes instead byte after byte through guard.c's short
 * path, which calls the steps in g_short.h for the detectors that read every byte, and the
 * passes of the others over the bytes up to the one where they act: a new detector needs
 * its place there too. Hooks may be NULL where a detector has nothing to do.
 *
 *   on       — is it configured for this guard's params? Asked once, by guard_new; a
 *              detector that is off is never called again for that guard (NULL: always on).
 *   init     — sets up the detector's part of a new guard (called by guard_new, on or off).
 *   release  — frees what init allocated (guard_free).
 *   reset    — sets up its part of a guard being reset (guard_reset) from `old`, a copy of
 *              that guard in which it was on, taking over what old's init allocated; the
 *              result must be what init makes (NULL: old's part is released, init runs).
 *   pass     — judges the piece's bytes [fed0, fed0 + lim) (all in the history) and returns
 *              the index of the byte it trips at, or lim. A later detector is only shown the
 *              bytes before an earlier one's trip, so the verdict is that of consulting the
 *              detectors byte after byte in table order.
 *   finish   — the end of the text: flushes pending state; returns true on a trip.
 *   suspect  — how many trailing bytes could still become what it trips on (holdback).
 *
 * A pass's state after a piece must depend only on the bytes fed so far, never on where the
 * caller's chunks ended: that is what makes verdicts chunking-invariant. */
typedef struct guard_detector {
    const char *name;
    bool (*on)(const guard_params *p);
    void (*init)(guard *g);
    void (*release)(guard *g);
    void (*reset)(guard *g, const guard *old);
    size_t (*pass)(guard *g, size_t lim, uint64_t fed0);
    bool (*finish)(guard *g);
    size_t (*suspect)(const guard *g);
} guard_detector;

extern const guard_detector guard_det_leak, guard_det_rules, guard_det_repeat, guard_det_text,
    guard_det_budget;

/* ---- shared by the detectors (guard.c) ---------------------------------------------------- */

/* The byte at absolute offset off, which must be in the history. */
static inline unsigned char guard_at(const guard *g, uint64_t off)
{
    return g->buf[off - g->base];
}

static inline bool guard_is_cont(unsigned char c)
{
    return (c & 0xC0) == 0x80;
}

/* Copies history [start, end) into the verdict's unit, cut to GUARD_UNIT_MAX bytes on a
 * UTF-8 boundary. Bytes older than the history are skipped. COLD_PATH (as guard_trip). */
COLD_PATH void guard_set_unit(guard *g, uint64_t start, uint64_t end);
/* Records the verdict; `at_byte` is the number of bytes fed when decided. COLD_PATH. */
COLD_PATH void guard_trip(guard *g, const char *detector, uint64_t loop_start, uint64_t at_byte,
                          unsigned repeats);
/* calloc that aborts on OOM (the guard's contract: never NULL). */
void *guard_xcalloc(size_t n, size_t sz);
/* Table t of the text detectors (GT_*) of `size` bytes, all zero, for g's answer: one of
 * that size from g's store, else a new one (g_store.c). The detector asks for it where it
 * first needs it in an answer; g holds it (g->tab) until guard_tables_release. */
void *guard_table(guard *g, unsigned t, size_t size);
/* Gives g's tables to its store (those the store has no room for, and all without one, are
 * freed); g->tab is left empty. */
void guard_tables_release(guard *g);

/* Prompt-aware slack (g_prompt.c): how many copies of the unit u[0..n) the prompt allows
 * (the count it asks for, or how often it holds the unit, plus one); 0 without a prompt or
 * reason. O(prompt). */
uint32_t guard_prompt_slack(const guard *g, const unsigned char *u, size_t n);
void guard_prompt_release(guard *g);

/* The segment consumers of g_text.c's segmenter (g_lines.c, g_novelty.c): */
/* A completed segment with a letter, hashed h, [start, end); `trigger`: it is a sentence or
 * an item that may trip; `prose`: it is text; `plain`: a line flush left without a bullet;
 * `in_row`: it trips only as copies in a row. Returns true on a trip. */
bool guard_lines_segment(guard *g, uint64_t h, uint64_t start, uint64_t end, bool trigger,
                         bool prose, bool plain, bool in_row, uint64_t now);
/* The body [start, end) of a completed line (guard_line_body; start below the history's
 * base: a line longer than the history), for the template detector. Returns true on a
 * trip. */
bool guard_template_line(guard *g, uint64_t start, uint64_t end, uint64_t now);
/* A comma at `end` ends an item of the line that began at line_start (the template
 * detector's identifier items). Returns true on a trip. */
bool guard_template_item(guard *g, uint64_t line_start, uint64_t end, uint64_t now);
/* The same for the block detector (g_block.c), on when lines.block_copies or art_run is
 * set. */
bool guard_block_line(guard *g, uint64_t start, uint64_t end, uint64_t now);
/* Narrows the line [*s, *e) to its body: without indentation, a list marker (bullet, or
 * digits and '.' or ')') and trailing spaces (g_template.c). */
void guard_line_body(const guard *g, uint64_t *s, uint64_t *e);
/* A number ended at `end` (the byte there is neither a letter nor a digit), for the
 * counting detector. Returns true on a trip. */
bool guard_count_number(guard *g, uint64_t end, uint64_t now);
/* The cycle detector (g_cycle.c), for a completed segment with a letter [start, end) whose
 * nw words are in g->sw, of the kinds `kind` (GSEG_* bits). Returns true on a trip. */
enum {
    GSEG_TEXT = 1,     /* 3 words, 16 letters, no code characters, at least half letters */
    GSEG_SENTENCE = 2, /* prose, as for the lines detector, ending in . ! ? or a CJK stop */
    GSEG_PROSE = 4,    /* prose, as for the lines detector */
};
bool guard_cycle_segment(guard *g, unsigned nw, uint64_t start, uint64_t end, unsigned kind,
                         uint64_t now);
/* The nw words of a segment that ended, in g->sw (hash, first byte, starts with a letter).
 * Returns true on a trip. */
bool guard_novelty_words(guard *g, unsigned nw, bool prose, uint64_t now);

#endif
