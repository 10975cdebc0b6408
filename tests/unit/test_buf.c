/* test_buf.c — the byte queue (lg_fifo): whatever mix of appends and takes of whatever
 * sizes, the bytes come out in the order they went in, none lost or repeated, and the
 * queue reports how many it holds. And a thread's cache of spare blocks: a buffer made from
 * one holds only its own bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "proxy/buf.h"

/* Appends `total` bytes numbered 0, 1, 2, … (mod 251) in pieces of 1..max_in, taking in
 * pieces of 1..max_out between appends, and checks every byte taken and the length. */
static void run_mix(size_t total, size_t max_in, size_t max_out)
{
    lg_fifo f = {0};
    unsigned r = 7;
    size_t in = 0, out = 0;
    unsigned char piece[4096], got[4096];
    while (out < total) {
        r = r * 1103515245u + 12345u;
        if (in < total && (r >> 16) % 3) {
            size_t n = 1 + (r >> 8) % max_in;
            if (n > total - in) n = total - in;
            for (size_t i = 0; i < n; i++)
                piece[i] = (unsigned char)((in + i) % 251);
            lg_fifo_append(&f, piece, n);
            in += n;
        } else {
            size_t want = 1 + (r >> 8) % max_out;
            size_t k = lg_fifo_take(&f, got, want);
            assert_true(k <= want);
            assert_int_equal(k, want < in - out ? want : in - out);
            for (size_t i = 0; i < k; i++)
                assert_int_equal(got[i], (out + i) % 251);
            out += k;
        }
        assert_int_equal(lg_fifo_len(&f), in - out);
    }
    assert_int_equal(lg_fifo_take(&f, got, sizeof got), 0);
    lg_fifo_free(&f);
    assert_int_equal(lg_fifo_len(&f), 0);
}

/* The queue grows long (appends outpace takes), then drains in small pieces. */
static void test_long_queue_small_takes(void **state)
{
    (void)state;
    run_mix(1 << 20, 4096, 64);
}

/* Takes about as large as appends: the queue empties often and restarts at the front. */
static void test_balanced(void **state)
{
    (void)state;
    run_mix(1 << 18, 512, 512);
    run_mix(1 << 16, 1, 1);
}

/* An emptied queue takes appends again; free leaves a reusable empty queue. */
static void test_reuse(void **state)
{
    (void)state;
    lg_fifo f = {0};
    char out[8];
    lg_fifo_append(&f, "abcdef", 6);
    assert_int_equal(lg_fifo_take(&f, out, 4), 4);
    assert_memory_equal(out, "abcd", 4);
    lg_fifo_append(&f, "gh", 2);
    assert_int_equal(lg_fifo_len(&f), 4);
    assert_int_equal(lg_fifo_take(&f, out, 8), 4);
    assert_memory_equal(out, "efgh", 4);
    lg_fifo_free(&f);
    lg_fifo_append(&f, "x", 1);
    assert_int_equal(lg_fifo_take(&f, out, 8), 1);
    assert_int_equal(out[0], 'x');
    lg_fifo_free(&f);
}

/* Shrinking frees only an empty queue's memory beyond `keep`; the queue stays usable. */
static void test_shrink(void **state)
{
    (void)state;
    lg_fifo f = {0};
    char big[5000], out[5000];
    memset(big, 'b', sizeof big);
    lg_fifo_append(&f, big, sizeof big); /* a burst */
    lg_fifo_shrink(&f, 1024);            /* still queued: kept */
    assert_int_equal(lg_fifo_len(&f), sizeof big);
    assert_int_equal(lg_fifo_take(&f, out, sizeof out), sizeof big);
    assert_memory_equal(out, big, sizeof big);
    assert_true(f.b.cap > 1024);
    lg_fifo_shrink(&f, 1024); /* drained: its memory goes */
    assert_null(f.b.p);
    assert_int_equal(f.b.cap, 0);
    lg_fifo_append(&f, "ab", 2); /* a trickle's small memory stays */
    assert_int_equal(lg_fifo_take(&f, out, 8), 2);
    size_t cap = f.b.cap;
    lg_fifo_shrink(&f, 1024);
    assert_int_equal(f.b.cap, cap);
    assert_non_null(f.b.p);
    lg_fifo_append(&f, "cd", 2);
    assert_int_equal(lg_fifo_take(&f, out, 8), 2);
    assert_memory_equal(out, "cd", 2);
    lg_fifo_free(&f);
}

/* A thread's cache (buf.h): a buffer made or grown from a spare block holds exactly what
 * was appended to it, never a byte of the block's last user, and gets the block of the
 * capacity the allocator would have given. */
static void test_cache_no_carry_over(void **state)
{
    (void)state;
    lg_buf_cache_begin();
    lg_buf a = LG_BUF_INIT, b = LG_BUF_INIT, c = LG_BUF_INIT, d = LG_BUF_INIT;
    char secret[101];
    memset(secret, 'S', 100);
    secret[100] = '\0';

    lg_buf_append(&a, secret, 40); /* one user's 64-byte block */
    char *a_block = a.p;
    assert_int_equal(a.cap, 64);
    lg_buf_free(&a);
    assert_null(a.p);
    lg_buf_reserve(&b, 0); /* the next user gets it, empty */
    assert_ptr_equal(b.p, a_block);
    assert_int_equal(b.len, 0);
    assert_string_equal(b.p, "");
    lg_buf_append_str(&b, "hi");
    assert_string_equal(b.p, "hi");
    assert_int_equal(b.cap, 64);
    lg_buf_free(&b);

    lg_buf_append(&d, secret, 100); /* a 128-byte block with 100 bytes of its user */
    char *d_block = d.p;
    assert_int_equal(d.cap, 128);
    lg_buf_free(&d);
    lg_buf_append(&c, "0123456789012345678901234567890123456789012345678901234567", 58);
    char *c_small = c.p; /* the 64-byte block b gave back */
    assert_ptr_equal(c_small, a_block);
    lg_buf_append(&c, "abcdefghij", 10); /* grows into d's block */
    assert_ptr_equal(c.p, d_block);
    assert_int_equal(c.cap, 128);
    assert_int_equal(c.len, 68);
    assert_int_equal(strlen(c.p), 68);
    assert_memory_equal(c.p + 58, "abcdefghij", 10);
    assert_null(memchr(c.p, 'S', c.len + 1));
    char *stolen = lg_buf_steal(&c); /* the caller's now: not the cache's */
    lg_buf_reserve(&a, 0);           /* c's old 64-byte block, kept when c grew */
    assert_ptr_equal(a.p, c_small);
    assert_string_equal(a.p, "");
    free(stolen);

    lg_fifo f = {0}; /* a queue from a spare reads only its own bytes */
    lg_buf_free(&a);
    lg_fifo_append(&f, "xy", 2);
    char out[8];
    assert_int_equal(lg_fifo_take(&f, out, sizeof out), 2);
    assert_memory_equal(out, "xy", 2);
    lg_fifo_free(&f);
    lg_buf_cache_end();
}

/* The cache keeps at most LG_BUF_CACHE_KEEP blocks of a size up to 2 KiB, at most
 * LG_BUF_CACHE_KEEP_BIG of a size up to 128 KiB, and none larger; the rest go back to the
 * allocator (ASan's leak check sees any block lost), and a thread after lg_buf_cache_end
 * frees as before. A kept large block serves the next buffer that grows to its size. */
static void test_cache_bounded(void **state)
{
    (void)state;
    enum { N = LG_BUF_CACHE_KEEP + 4, NB = LG_BUF_CACHE_KEEP_BIG + 2 };
    lg_buf bufs[N], bursts[NB], big = LG_BUF_INIT;
    lg_buf_cache_begin();
    for (int i = 0; i < N; i++) {
        bufs[i] = (lg_buf)LG_BUF_INIT;
        lg_buf_append_str(&bufs[i], "block");
    }
    for (int i = 0; i < N; i++)
        lg_buf_free(&bufs[i]);
    for (int i = 0; i < NB; i++) {
        bursts[i] = (lg_buf)LG_BUF_INIT;
        lg_buf_reserve(&bursts[i], 9000); /* 16 KiB */
        assert_int_equal(bursts[i].cap, 16384);
    }
    char *kept = bursts[LG_BUF_CACHE_KEEP_BIG - 1].p; /* the last one the cache took */
    for (int i = 0; i < NB; i++)
        lg_buf_free(&bursts[i]);
    lg_buf_append_str(&big, "x");
    lg_buf_reserve(&big, 10000); /* grows to 16 KiB: the block kept last */
    assert_ptr_equal(big.p, kept);
    assert_string_equal(big.p, "x");
    lg_buf_free(&big);
    lg_buf_reserve(&big, 200000); /* 256 KiB: never from nor into the cache */
    assert_int_equal(big.cap, 262144);
    lg_buf_free(&big);
    lg_buf_cache_end();
    lg_buf_append_str(&big, "after"); /* no cache: an ordinary buffer */
    assert_string_equal(big.p, "after");
    lg_buf_free(&big);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_long_queue_small_takes),
        cmocka_unit_test(test_balanced),
        cmocka_unit_test(test_reuse),
        cmocka_unit_test(test_shrink),
        cmocka_unit_test(test_cache_no_carry_over),
        cmocka_unit_test(test_cache_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
