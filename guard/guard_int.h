/* guard_int.h — private to guard/: the layout of guard_params, shared by guard.c (the
 * detectors) and guard_params.c (defaults, cloning and the JSON settings).
 *
 * Nothing outside guard/ includes this file; the public contract is guard.h. */
#ifndef LG_GUARD_INT_H
#define LG_GUARD_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

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
    } lines;

    struct {
        bool enabled;
        unsigned window; /* trigrams judged together */
        double min_ratio;
        unsigned memory_words; /* how far back a trigram counts as seen */
    } novelty;

    guard_rule *rules;
    size_t n_rules;
    uint32_t rule_max_match_bytes;

    size_t n_leaks;
    char leaks[GUARD_MAX_LEAKS][GUARD_MAX_LEAK_LEN + 1];
    size_t leak_len[GUARD_MAX_LEAKS];

    uint64_t budget_bytes;               /* 0: off */
    uint64_t empty_answer_min_reasoning; /* 0: off */
    size_t holdback_max;
};

const char *guard_rclass_name(guard_rclass c);

/* Repeats the period table asks of a unit of `period` bytes or characters; 0 past it. */
double guard_steps_repeats(const guard_params *p, uint32_t period);
/* max(min_bytes, repeats × period) rounded up, or UINT32_MAX for repeats 0. */
uint32_t guard_need_for(uint32_t period, double repeats, uint32_t min_bytes);

#endif
