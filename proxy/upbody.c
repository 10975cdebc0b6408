/* upbody.c — see upbody.h. */
#include "proxy/upbody.h"

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
    S_SIZE_MORE, /* more hex digits, an extension or CR */
    S_EXT,       /* a chunk extension: skipped up to CR */
    S_SIZE_LF,   /* the size line's LF */
    S_DATA,      /* `left` data bytes */
    S_DATA_CR,   /* the CRLF after a chunk's data */
    S_DATA_LF,
    S_END, /* the terminal chunk's size line was consumed */
};

#define MAX_DIGITS 16

static int hex_value(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

ssize_t upbody_next(upbody *d, const char *p, size_t n, const char **data, size_t *len)
{
    size_t i = 0;
    *data = p;
    *len = 0;
    while (i < n) {
        char c = p[i];
        int v;
        switch (d->state) {
        case S_SIZE:
        case S_SIZE_MORE:
            v = hex_value(c);
            if (v >= 0) {
                if (d->digits == MAX_DIGITS || d->left > (uint64_t)INT64_MAX >> 4)
                    return UPBODY_BAD;
                d->left = d->left << 4 | (uint64_t)v;
                d->digits++;
                d->state = S_SIZE_MORE;
            } else if (d->state == S_SIZE) {
                return UPBODY_BAD;
            } else if (c == '\r') {
                d->state = S_SIZE_LF;
            } else if (c == ';' || c == ' ' || c == '\t') {
                d->state = S_EXT;
            } else {
                return UPBODY_BAD;
            }
            i++;
            break;
        case S_EXT:
            if (c == '\n' || c == '\0') return UPBODY_BAD;
            if (c == '\r') d->state = S_SIZE_LF;
            i++;
            break;
        case S_SIZE_LF:
            if (c != '\n') return UPBODY_BAD;
            i++;
            d->digits = 0;
            if (d->left == 0) {
                d->state = S_END;
                return (ssize_t)i;
            }
            d->state = S_DATA;
            break;
        case S_DATA: {
            size_t k = n - i < d->left ? n - i : (size_t)d->left;
            d->left -= k;
            if (d->left == 0) d->state = S_DATA_CR;
            *data = p + i;
            *len = k;
            return (ssize_t)(i + k);
        }
        case S_DATA_CR:
        case S_DATA_LF:
            if (c != (d->state == S_DATA_CR ? '\r' : '\n')) return UPBODY_BAD;
            d->state = d->state == S_DATA_CR ? S_DATA_LF : S_SIZE;
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
