/* g_leak.c — the leak detector: a configured template token (`<|im_end|>`, a second
 * `</think>`) appears in the text, the sign of a chat template leaking into the output.
 *
 * A table of the tokens' first and last bytes, derived once per params and shared by
 * their guards, makes most bytes cost one load and test, and when the tokens use at most
 * four distinct first/last bytes a piece is scanned 16 bytes at a time; only at a token's
 * last byte are the tokens compared. O(1) per byte, O(tokens) at a candidate byte. */
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "guard/g_short.h"

void guard_leak_derive(guard_params *p)
{
    memset(p->leak_class, 0, sizeof p->leak_class);
    p->leak_maxlen = 0;
    for (size_t i = 0; i < p->n_leaks; i++) {
        p->leak_class[(unsigned char)p->leaks[i][0]] |= GUARD_LEAK_FIRST;
        p->leak_class[(unsigned char)p->leaks[i][p->leak_len[i] - 1]] |= GUARD_LEAK_LAST;
        if (p->leak_len[i] > p->leak_maxlen) p->leak_maxlen = p->leak_len[i];
    }
    unsigned char bytes[4] = {0};
    p->n_leak_bytes = 0;
    for (unsigned c = 0; c < 256 && p->n_leak_bytes <= 4; c++) {
        if (!p->leak_class[c]) continue;
        if (p->n_leak_bytes < 4) bytes[p->n_leak_bytes] = (unsigned char)c;
        p->n_leak_bytes++;
    }
    if (p->n_leak_bytes > 4) p->n_leak_bytes = 0;
    for (unsigned k = p->n_leak_bytes; k && k < 4; k++)
        bytes[k] = bytes[0];
    for (unsigned k = 0; k < 4; k++)
        memset(p->leak_splat[k], bytes[k], sizeof p->leak_splat[k]);
}

void guard_disable_leaks(guard *g)
{
    g->leaks_off = true; /* leak_pass, guard.c's short path and leak_suspect then do nothing */
}

/* guard_leak_at (contract in g_short.h): the byte's class says whether it starts a token,
 * and only a byte that ends one compares the tokens. */
RARE_PATH bool guard_leak_at(guard *g, unsigned cls, uint64_t now)
{
    const guard_params *p = g->p;
    g->leak_start = cls & GUARD_LEAK_FIRST ? now : g->leak_start;
    if (!(cls & GUARD_LEAK_LAST)) return false;
    for (size_t i = 0; i < p->n_leaks; i++) {
        size_t n = p->leak_len[i];
        if (now < n || now - n < g->base) continue;
        if (!memcmp(g->buf + (now - n - g->base), p->leaks[i], n)) {
            guard_set_unit(g, now - n, now);
            guard_trip(g, "leak", now - n, now, 1);
            return true;
        }
    }
    return false;
}

#ifdef __SSE2__
/* The bytes of x that equal one of the four leak bytes k[0..4), as a 16-bit mask. */
static inline unsigned leak_hits(const __m128i *k, __m128i x)
{
    __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, k[0]), _mm_cmpeq_epi8(x, k[1])),
                               _mm_or_si128(_mm_cmpeq_epi8(x, k[2]), _mm_cmpeq_epi8(x, k[3])));
    return (unsigned)_mm_movemask_epi8(hit);
}
#endif

/* The index of the first byte of s[0..n) that starts or ends a leak token, or n. s lies in
 * g's history, so a last block shorter than 16 bytes is read as the 16 bytes that end it,
 * with the history before it masked off: the pieces that get here are often 9-15 bytes. */
static inline size_t leak_scan(const guard *g, const unsigned char *s, size_t n)
{
    const guard_params *p = g->p;
    size_t i = 0;
#ifdef __SSE2__
    if (p->n_leak_bytes) {
        const __m128i k[4] = {_mm_loadu_si128((const __m128i *)(const void *)p->leak_splat[0]),
                              _mm_loadu_si128((const __m128i *)(const void *)p->leak_splat[1]),
                              _mm_loadu_si128((const __m128i *)(const void *)p->leak_splat[2]),
                              _mm_loadu_si128((const __m128i *)(const void *)p->leak_splat[3])};
        for (; i + 16 <= n; i += 16) {
            unsigned m = leak_hits(k, _mm_loadu_si128((const __m128i *)(const void *)(s + i)));
            if (m) return i + (unsigned)__builtin_ctz(m);
        }
        size_t rest = n - i;
        if (rest && (size_t)(s + n - g->buf) >= 16) {
            const unsigned char *end16 = s + n - 16;
            unsigned m = leak_hits(k, _mm_loadu_si128((const __m128i *)(const void *)end16));
            m >>= 16 - rest;
            return m ? i + (unsigned)__builtin_ctz(m) : n;
        }
    }
#endif
    while (i < n && !p->leak_class[s[i]])
        i++;
    return i;
}

/* The rest of a piece from s[i], a byte that starts or ends a leak token: guard_leak_step
 * at the bytes leak_scan finds. RARE_PATH: kept out of the common pass, which then needs no
 * registers saved. */
RARE_PATH static size_t leak_steps(guard *g, const unsigned char *s, size_t i, size_t lim,
                                   uint64_t fed0)
{
    while (i < lim) {
        if (guard_leak_step(g, s[i], fed0 + i + 1)) return i;
        i++;
        i += leak_scan(g, s + i, lim - i);
    }
    return lim;
}

/* The leak detector over a piece of GUARD_SHORT bytes or more (guard_detector; a token goes
 * through guard_leak_step). It reads the piece from the history, where feed_piece copied
 * it. */
static size_t leak_pass(guard *g, size_t lim, uint64_t fed0)
{
    if (g->leaks_off) return lim;
    const unsigned char *s = g->buf + (size_t)(fed0 - g->base);
    size_t i = leak_scan(g, s, lim);
    return i < lim ? leak_steps(g, s, i, lim, fed0) : lim;
}

/* Longest tail that is a proper prefix of a leak token, when a byte that starts one is
 * among the last max length. O(max length) byte checks, and a compare per token only where
 * a token could start. RARE_PATH, as leak_steps. */
RARE_PATH static size_t leak_prefix(const guard *g)
{
    const guard_params *p = g->p;
    size_t have = (size_t)(g->fed - g->base);
    /* Longest first; a tail can only match where it starts with a token's first byte. */
    for (size_t k = p->leak_maxlen - 1; k > 0; k--) {
        if (k > have) continue;
        const unsigned char *t = g->buf + (g->fed - k - g->base);
        if (!(p->leak_class[t[0]] & GUARD_LEAK_FIRST)) continue;
        for (size_t i = 0; i < p->n_leaks; i++)
            if (p->leak_len[i] > k && !memcmp(t, p->leaks[i], k)) return k;
    }
    return 0;
}

static size_t leak_suspect(const guard *g)
{
    /* No byte that starts a token among the last max length: nothing to hold. */
    if (g->leaks_off || g->fed - g->leak_start >= g->p->leak_maxlen) return 0;
    return leak_prefix(g);
}

static bool leak_on(const guard_params *p)
{
    return p->n_leaks > 0;
}

const guard_detector guard_det_leak = {
    .name = "leak",
    .on = leak_on,
    .pass = leak_pass,
    .suspect = leak_suspect,
};
