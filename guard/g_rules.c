/* g_rules.c — operator rules: a PCRE2 pattern from the configuration matched the text.
 *
 * The rules are checked at every multiple of GUARD_RULE_STEP bytes fed (absolute offsets, so
 * the verdict does not depend on the chunking) over a window of rule_max_match_bytes +
 * GUARD_RULE_STEP, JIT-compiled, hard-partial so that a match still in progress is held back;
 * and once more, complete, at the end of the text. Each byte is scanned about once per rule. */
#include <stdlib.h>
#include <string.h>

#include "guard/guard_int.h"

/* The first-byte table (guard_params' rule_first): for a token it tells in one step,
 * without a loop per rule that exits at an unpredictable byte, where each rule's next
 * possible start lies (lanes). rule_jit has bit i set when rule i goes to pcre2_jit_match
 * directly (rule_match). Both depend only on the rules: made once per params, read by
 * every guard of them. */
void guard_rules_derive(guard_params *p)
{
    memset(p->rule_first, 0, sizeof p->rule_first);
    p->rule_jit = 0;
    p->rule_ovec = 1;
    for (size_t i = 0; i < p->n_rules; i++) {
        const guard_rule *r = &p->rules[i];
        uint32_t n = 0;
        pcre2_pattern_info(r->re, PCRE2_INFO_CAPTURECOUNT, &n);
        if (n + 1 > p->rule_ovec) p->rule_ovec = n + 1;
        if (i >= GUARD_RULE_LANES) continue;
        /* pcre2_match checks a UTF pattern's subject first, pcre2_jit_match does not: those
         * keep the check. */
        uint32_t opts = PCRE2_UTF;
        pcre2_pattern_info(r->re, PCRE2_INFO_ALLOPTIONS, &opts);
        if (!(opts & PCRE2_UTF)) p->rule_jit |= (unsigned char)(1u << i);
        for (unsigned k = 0; r->has_first && k < sizeof(r->first); k++)
            for (unsigned b = 0; r->first[k] >> b; b++)
                if (r->first[k] >> b & 1) p->rule_first[8 * k + b] |= (unsigned char)(1u << i);
    }
}

static void rules_init(guard *g)
{
    g->md = pcre2_match_data_create(g->p->rule_ovec, NULL);
    if (!g->md) abort();
    g->rule_from = guard_xcalloc(g->p->n_rules, sizeof(*g->rule_from));
}

/* A reset guard keeps its match data and its starts (zeroed) when they fit the new params:
 * the same number of rules, as many ovector pairs or more. */
static void rules_reset(guard *g, const guard *old)
{
    const guard_params *p = g->p;
    if (old->p->n_rules != p->n_rules || pcre2_get_ovector_count(old->md) < p->rule_ovec) {
        pcre2_match_data_free(old->md);
        free(old->rule_from);
        rules_init(g);
        return;
    }
    g->md = old->md;
    g->rule_from = old->rule_from;
    memset(g->rule_from, 0, p->n_rules * sizeof(*g->rule_from));
}

static void rules_release(guard *g)
{
    pcre2_match_data_free(g->md);
    free(g->rule_from);
}

/* The first-byte table's entries of the 8 bytes before offset `to`, the one at to - 8 + j
 * in byte j, read once per check for every rule that needs them (rule_match): `to` and
 * whether they are read yet. */
typedef struct {
    uint64_t to, x;
    bool read;
} first_lanes;

static first_lanes lanes_at(uint64_t to)
{
    return (first_lanes){.to = to};
}

/* The first offset in [from, to) at which rule i (with a known set of first bytes) can
 * start a match, or to: when it is among the 8 lanes' bytes, in one step. */
static uint64_t first_start(const guard *g, size_t i, uint64_t from, first_lanes *l)
{
    uint64_t to = l->to;
    if (from < to && to - from <= 8 && to - g->base >= 8 && i < GUARD_RULE_LANES) {
        if (!l->read) {
            const unsigned char *s = g->buf + (to - 8 - g->base), *tab = g->p->rule_first;
            l->x = 0;
            for (unsigned j = 0; j < 8; j++)
                l->x |= (uint64_t)tab[s[j]] << 8 * j;
            l->read = true;
        }
        /* Lane j's bit i to bit j of m (each lane's bit 0 moves to bit j of the top byte). */
        uint64_t m = (((l->x >> i) & 0x0101010101010101ull) * 0x0102040810204080ull) >> 56;
        m &= ~0ull << (8 - (to - from)); /* the lanes from `from` on */
        return m ? to - 8 + (uint64_t)__builtin_ctzll(m) : to;
    }
    const unsigned char *first = g->p->rules[i].first;
    while (from < to && !(first[guard_at(g, from) >> 3] & (1u << (guard_at(g, from) & 7))))
        from++;
    return from;
}

/* Matches rule i against history up to `to` (l->to; l: the first-byte lanes there, shared by
 * the rules of one check), trying only starts from rule_from[i] on
 * (the subject itself begins up to rule_max_match_bytes + GUARD_RULE_STEP earlier, so
 * lookbehinds and \b see real context). Hard-partial unless `final`. Returns PCRE2's code;
 * on a complete or partial match [*ms, *me) is where it lies. Advances rule_from[i] past
 * every start that failed. Each byte is thus scanned about once, not once per check. */
static int rule_match(const guard *g, size_t i, first_lanes *l, bool final, uint64_t *ms,
                      uint64_t *me)
{
    const uint64_t to = l->to;
    const guard_params *p = g->p;
    uint64_t span = (uint64_t)p->rule_max_match_bytes + GUARD_RULE_STEP;
    uint64_t lo = to > span ? to - span : 0;
    if (lo < g->base) lo = g->base;
    uint64_t from = g->rule_from[i] > lo ? g->rule_from[i] : lo;
    const guard_rule *r = &p->rules[i];
    if (r->has_first) { /* skip to a byte that can start a match: most calls end here */
        from = first_start(g, i, from, l);
        if (from >= to) {
            g->rule_from[i] = to;
            return PCRE2_ERROR_NOMATCH;
        }
    }
    if (from >= to && !final) return PCRE2_ERROR_NOMATCH;
    uint32_t opt = (final ? 0 : PCRE2_PARTIAL_HARD) | (lo ? PCRE2_NOTBOL : 0);
    PCRE2_SPTR subj = g->buf + (lo - g->base);
    PCRE2_SIZE len = (PCRE2_SIZE)(to - lo), start = (PCRE2_SIZE)(from - lo);
    /* pcre2_jit_match is what pcre2_match calls for a JIT-compiled pattern, after checks that
     * hold here; without the JIT code for this mode it says so, and pcre2_match then runs the
     * interpreter. */
    int rc = PCRE2_ERROR_JIT_BADOPTION;
    if (i < GUARD_RULE_LANES && p->rule_jit >> i & 1)
        rc = pcre2_jit_match(r->re, subj, len, start, opt, g->md, NULL);
    if (rc == PCRE2_ERROR_JIT_BADOPTION)
        rc = pcre2_match(r->re, subj, len, start, opt, g->md, NULL);
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(g->md);
    if (rc > 0 || rc == PCRE2_ERROR_PARTIAL) {
        *ms = lo + ov[0];
        *me = lo + ov[1];
        g->rule_from[i] = *ms;
    } else {
        g->rule_from[i] = to;
    }
    return rc;
}

/* The rules check at offset `to` (a multiple of GUARD_RULE_STEP, or the end of the text
 * when `final`). Trips on the first complete match, reported at `to`. Returns true on a
 * trip. */
static bool rules_run(guard *g, uint64_t to, bool final)
{
    const guard_params *p = g->p;
    first_lanes l = lanes_at(to);
    for (size_t i = 0; i < p->n_rules; i++) {
        uint64_t ms, me;
        int rc = rule_match(g, i, &l, final, &ms, &me);
        if (rc > 0 && me > ms) {
            guard_set_unit(g, ms, me);
            guard_trip(g, p->rules[i].detector, ms, to, 1);
            return true;
        }
    }
    return false;
}

/* The rules over a piece (guard_detector): they run at every multiple of GUARD_RULE_STEP
 * bytes fed. */
static size_t rules_pass(guard *g, size_t lim, uint64_t fed0)
{
    for (uint64_t to = (fed0 / GUARD_RULE_STEP + 1) * GUARD_RULE_STEP; to <= fed0 + lim;
         to += GUARD_RULE_STEP)
        if (rules_run(g, to, false)) return (size_t)(to - fed0 - 1);
    return lim;
}

static bool rules_finish(guard *g)
{
    return rules_run(g, g->fed, true);
}

/* Bytes from the start of a complete or partial rule match still in progress. Amortised
 * O(new bytes) per rule, plus one pcre2_match call per rule. */
static size_t rules_suspect(const guard *g)
{
    const guard_params *p = g->p;
    size_t best = 0;
    first_lanes l = lanes_at(g->fed);
    for (size_t i = 0; i < p->n_rules; i++) {
        uint64_t ms, me;
        int rc = rule_match(g, i, &l, false, &ms, &me);
        if ((rc > 0 || rc == PCRE2_ERROR_PARTIAL) && g->fed - ms > best)
            best = (size_t)(g->fed - ms);
    }
    return best;
}

static bool rules_on(const guard_params *p)
{
    return p->n_rules > 0;
}

const guard_detector guard_det_rules = {
    .name = "rules",
    .on = rules_on,
    .init = rules_init,
    .release = rules_release,
    .reset = rules_reset,
    .pass = rules_pass,
    .finish = rules_finish,
    .suspect = rules_suspect,
};
