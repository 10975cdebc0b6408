/* fake_record.c — a bounded ring of JSON records. When full the oldest record is dropped
 * (seq keeps counting, so a test can tell that records were lost). */
#include "fake_record.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fake_records_init(fake_records *rs, long max)
{
    memset(rs, 0, sizeof *rs);
    rs->max = max > 0 ? max : 0;
    rs->next_seq = 1;
    if (rs->max && !(rs->ring = calloc((size_t)rs->max, sizeof *rs->ring))) {
        fprintf(stderr, "fake_upstream: out of memory for %ld records\n", max);
        abort();
    }
}

bool fake_records_begin(fake_records *rs, fbuf *b, const char *kind, double at_ms)
{
    if (!rs->max) return false;
    fbuf_reset(b);
    fbuf_printf(b, "{\"seq\":%ld,\"kind\":\"%s\",\"at_ms\":%.3f", rs->next_seq++, kind, at_ms);
    return true;
}

void fake_records_commit(fake_records *rs, fbuf *b)
{
    fbuf_put(b, "}", 1);
    char *copy = malloc(b->len + 1);
    if (!copy) {
        fprintf(stderr, "fake_upstream: out of memory\n");
        abort();
    }
    memcpy(copy, b->p, b->len + 1);
    if (rs->count == rs->max) {
        free(rs->ring[rs->head]);
        rs->ring[rs->head] = copy;
        rs->head = (rs->head + 1) % rs->max;
    } else {
        rs->ring[(rs->head + rs->count) % rs->max] = copy;
        rs->count++;
    }
}

void fake_records_dump(const fake_records *rs, fbuf *out)
{
    fbuf_put(out, "[", 1);
    for (long i = 0; i < rs->count; i++) {
        if (i) fbuf_put(out, ",\n", 2);
        fbuf_puts(out, rs->ring[(rs->head + i) % rs->max]);
    }
    fbuf_put(out, "]", 1);
}

void fake_records_clear(fake_records *rs)
{
    for (long i = 0; i < rs->count; i++) {
        free(rs->ring[(rs->head + i) % rs->max]);
        rs->ring[(rs->head + i) % rs->max] = NULL;
    }
    rs->head = rs->count = 0;
}

void fake_records_free(fake_records *rs)
{
    if (!rs) return;
    fake_records_clear(rs);
    free(rs->ring);
    rs->ring = NULL;
}
