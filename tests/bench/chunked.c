/* chunked.c — see chunked.h. */
#include "tests/bench/chunked.h"

enum {
    S_SIZE,
    S_EXT,
    S_SIZE_LF,
    S_DATA,
    S_DATA_CR,
    S_DATA_LF,
    S_TRAILER,
    S_LENGTH,
    S_CLOSE,
    S_DONE
};

#define MAX_CHUNK_BITS 40

static int hex_digit(char ch)
{
    return ch >= '0' && ch <= '9'   ? ch - '0'
           : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
           : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                    : -1;
}

void body_start(body_decoder *d, body_framing f, uint64_t length)
{
    *d = (body_decoder){0};
    d->state = f == BODY_CHUNKED ? S_SIZE : f == BODY_CLOSE ? S_CLOSE : length ? S_LENGTH : S_DONE;
    d->left = f == BODY_LENGTH ? length : 0;
}

bool body_done(const body_decoder *d)
{
    return d->state == S_DONE;
}

ssize_t body_decode(body_decoder *d, const char *p, size_t n, body_data_fn data, void *ud)
{
    size_t i = 0;
    while (i < n && d->state != S_DONE) {
        char ch = p[i];
        switch (d->state) {
        case S_CLOSE:
        case S_LENGTH:
        case S_DATA: {
            size_t k = n - i;
            if (d->state != S_CLOSE && k > d->left) k = (size_t)d->left;
            if (data(ud, p + i, k) < 0) return -1;
            i += k;
            if (d->state == S_CLOSE) break;
            d->left -= k;
            if (d->left == 0) d->state = d->state == S_LENGTH ? S_DONE : S_DATA_CR;
            break;
        }
        case S_SIZE: {
            int x = hex_digit(ch);
            i++;
            if (x >= 0 && !(d->left >> (MAX_CHUNK_BITS - 4))) {
                d->left = d->left * 16 + (uint64_t)x;
                d->digits++;
            } else if (d->digits && (ch == ';' || ch == ' ' || ch == '\t')) {
                d->state = S_EXT;
            } else if (d->digits && ch == '\r') {
                d->state = S_SIZE_LF;
            } else {
                return -1;
            }
            break;
        }
        case S_EXT:
            i++;
            if (ch == '\r')
                d->state = S_SIZE_LF;
            else if (ch == '\n')
                return -1;
            break;
        case S_SIZE_LF:
            i++;
            if (ch != '\n') return -1;
            d->state = d->left ? S_DATA : S_TRAILER;
            d->line_len = 0;
            break;
        case S_DATA_CR:
        case S_DATA_LF:
            i++;
            if (ch != (d->state == S_DATA_CR ? '\r' : '\n')) return -1;
            if (d->state == S_DATA_CR) {
                d->state = S_DATA_LF;
            } else {
                d->state = S_SIZE;
                d->digits = 0;
            }
            break;
        case S_TRAILER:
            i++;
            if (ch == '\n') {
                if (d->line_len == 0) d->state = S_DONE;
                d->line_len = 0;
            } else if (ch != '\r') {
                d->line_len++;
            }
            break;
        }
    }
    return (ssize_t)i;
}
