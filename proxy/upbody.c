/* upbody.c — see upbody.h. */
#include "proxy/upbody.h"

#include <string.h>

size_t upbody_head_end(upbody_head *h, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\n') {
            if (h->at) { /* an empty line (or one that began with CR): the head ends */
                h->at = 0;
                return i + 1;
            }
            h->at = 1;
        } else if (h->at == 1) {
            h->at = c == '\r' ? 2 : 0;
        }
        /* at 2 every byte up to the LF belongs to the line that ends the head */
    }
    return 0;
}

enum {
    S_SIZE,      /* the first hex digit of a size line */
    S_SIZE_MORE, /* more hex digits, or the first byte after them */
    S_SIZE_REST, /* the rest of the size line (an extension, a CR): skipped up to its LF */
    S_DATA,      /* `left` data bytes */
    S_DATA_END,  /* after a chunk's data: CRs, then an LF */
    S_END,       /* the terminal chunk's size line was consumed */
};

#define MAX_DIGITS 16

/* A byte's hex digit value, or -1: one load per digit of a size line. */
#define H(c, v) [(unsigned char)(c)] = (v) + 1
static const int8_t hex_plus1[256] = {
    H('0', 0),  H('1', 1),  H('2', 2),  H('3', 3),  H('4', 4),  H('5', 5),  H('6', 6),  H('7', 7),
    H('8', 8),  H('9', 9),  H('a', 10), H('b', 11), H('c', 12), H('d', 13), H('e', 14), H('f', 15),
    H('A', 10), H('B', 11), H('C', 12), H('D', 13), H('E', 14), H('F', 15),
};
#undef H

static int hex_value(char c)
{
    return hex_plus1[(unsigned char)c] - 1;
}

/* The LF that ends a size line was consumed: data follows, or the trailers after "0". */
static void size_line_done(upbody *d)
{
    d->digits = 0;
    d->state = d->left ? S_DATA : S_END;
}

/* After a chunk's data ended at p[i]: the CRs and the LF that follow it, as far as p[0..n)
 * holds them. Anything else is left for the next call (S_DATA_END refuses it). */
static size_t data_end(upbody *d, const char *p, size_t n, size_t i)
{
    while (i < n && p[i] == '\r')
        i++;
    if (i < n && p[i] == '\n') {
        d->state = S_SIZE;
        i++;
    }
    return i;
}

/* The usual input at a chunk's start: a whole chunk, "<hex>\r\n<data>\r\n" (fewer than 16
 * digits, a size above 0), with its CR LF after it. Decoded as the loop below decodes it
 * (the state stays S_SIZE); 0 when p[0..n) starts otherwise (the loop then takes it). */
static size_t whole_chunk(const char *p, size_t n, const char **data, size_t *len)
{
    uint64_t size = 0;
    size_t i = 0;
    int v;
    while (i < n && i < MAX_DIGITS - 1 && (v = hex_value(p[i])) >= 0) {
        size = size << 4 | (uint64_t)v;
        i++;
    }
    if (!i || !size || n - i < 4 || p[i] != '\r' || p[i + 1] != '\n' || size > n - i - 4 ||
        p[i + 2 + size] != '\r' || p[i + 3 + size] != '\n')
        return 0;
    *data = p + i + 2;
    *len = (size_t)size;
    return i + 4 + (size_t)size;
}

ssize_t upbody_next(upbody *d, const char *p, size_t n, const char **data, size_t *len)
{
    size_t i = 0;
    *data = p;
    *len = 0;
    if (d->state == S_SIZE && (i = whole_chunk(p, n, data, len)) != 0) return (ssize_t)i;
    while (i < n) {
        char c = p[i];
        int v;
        switch (d->state) {
        case S_SIZE:
        case S_SIZE_MORE: {
            /* The size's digits in one loop, in locals (p's bytes may alias *d). */
            uint64_t left = d->left;
            uint8_t digits = d->digits;
            while ((v = hex_value(c)) >= 0) {
                if (digits == MAX_DIGITS) return UPBODY_BAD;
                left = left << 4 | (uint64_t)v; /* 16 digits fit: INT64_MAX is checked below */
                digits++;
                if (++i == n) break;
                c = p[i];
            }
            d->left = left;
            d->digits = digits;
            if (!digits || left > (uint64_t)INT64_MAX) return UPBODY_BAD;
            d->state = S_SIZE_MORE;
            if (i == n) return (ssize_t)i;
            if (c == '\r' && i + 1 < n && p[i + 1] == '\n') c = p[++i]; /* the usual CR LF */
            i++;
            if (c != '\n') {
                d->state = S_SIZE_REST;
                break;
            }
            size_line_done(d);
            if (d->state == S_END) return (ssize_t)i;
            break;
        }
        case S_SIZE_REST:
            i++;
            if (c == '\n') {
                size_line_done(d);
                if (d->state == S_END) return (ssize_t)i;
            }
            break;
        case S_DATA: {
            size_t k = n - i < d->left ? n - i : (size_t)d->left;
            d->left -= k;
            *data = p + i;
            *len = k;
            i += k;
            if (d->left == 0) {
                d->state = S_DATA_END;
                i = data_end(d, p, n, i); /* a second call for two bytes costs more */
            }
            return (ssize_t)i;
        }
        case S_DATA_END:
            if (c == '\n')
                d->state = S_SIZE;
            else if (c != '\r')
                return UPBODY_BAD;
            i++;
            break;
        default: /* S_END: nothing more is the decoder's */
            return (ssize_t)i;
        }
    }
    return (ssize_t)i;
}

void upbody_unread(upbody *d, size_t len)
{
    d->left += len;
    if (len) d->state = S_DATA;
}

bool upbody_ended(const upbody *d)
{
    return d->state == S_END;
}

bool upbody_data_follows(const char *p, size_t n)
{
    /* The usual: CR LF, a size line's first digit, and its LF in the 8 bytes after it (up to
     * 6 more digits and a CR): the lowest zero byte of w ^ LFs (little-endian: the first
     * byte is the lowest). */
    if (n > 12 && p[0] == '\r' && p[1] == '\n' && hex_value(p[2]) > 0) {
        uint64_t w;
        memcpy(&w, p + 3, 8);
        w ^= 0x0a0a0a0a0a0a0a0aull;
        uint64_t z = (w - 0x0101010101010101ull) & ~w & 0x8080808080808080ull;
        if (z) return true; /* the LF is at most p[10], a data byte at p[11] or later */
    }
    size_t i = 0;
    while (i < n && p[i] == '\r')
        i++;
    if (i + 1 >= n || p[i] != '\n' || hex_value(p[i + 1]) <= 0) return false;
    for (i += 2; i < n && p[i] != '\n'; i++)
        ;
    return i + 1 < n;
}
