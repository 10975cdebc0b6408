/* fake_record.h — what the fake upstream saw and did, for tests to assert on.
 *
 * Records are kept as finished JSON texts (one object each) in a ring of at most max
 * entries, so GET /_fake/records is a concatenation and the recording cost per request is
 * one allocation. The shapes are documented in tests/fake/README.md. */
#ifndef FAKE_RECORD_H
#define FAKE_RECORD_H

#include "fake_buf.h"

typedef struct fake_records {
    char **ring; /* max slots; ring[(head + i) % max] is the i-th oldest kept */
    long max;    /* 0: recording off */
    long head, count;
    long next_seq; /* seq of the next record (1-based, never reset by clear) */
} fake_records;

void fake_records_init(fake_records *rs, long max);
/* Starts a record: appends {"seq":N,"kind":"KIND","at_ms":T to b (b is reset first) and
 * returns true; false (b untouched) when recording is off. The caller appends
 * ,"key":value pairs and then calls fake_records_commit. */
bool fake_records_begin(fake_records *rs, fbuf *b, const char *kind, double at_ms);
/* Closes the object in b and stores a copy. */
void fake_records_commit(fake_records *rs, fbuf *b);
/* Appends the JSON array of every kept record to out. */
void fake_records_dump(const fake_records *rs, fbuf *out);
void fake_records_clear(fake_records *rs);
/* Frees everything; NULL is a no-op. */
void fake_records_free(fake_records *rs);

#endif
