/* fuzz_guard.c — libFuzzer target for the guard.
 *
 * Input: one options byte (bits 0-1 channel, bit 2 call guard_finish, bit 3 use operator
 * rules, bit 4 a 16-byte holdback cap), then the piece table of fuzz_cuts.h, then the text.
 * Properties (abort on violation): the verdict — tripped or not, detector, loop_start,
 * at_byte, unit, repeats — is the same whether the text is fed whole, in the pieces the
 * input chooses, or (for short inputs) one byte at a time; a trip is reported by the call
 * that fed its at_byte; guard_suspect never exceeds the bytes fed nor the cap, and on valid
 * UTF-8 never splits a character, and after a call it depends only on the bytes fed so far
 * (for short inputs, every piece boundary is checked against the byte-at-a-time run);
 * loop_start <= at_byte <= bytes fed. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guard/guard.h"
#include "tests/fuzz/fuzz_cuts.h"

typedef struct outcome {
    bool tripped;
    const char *detector;
    uint64_t loop_start, at_byte;
    char unit[260];
    size_t unit_len;
    unsigned repeats;
} outcome;

static guard_params *params[LG_CH_COUNT][2][2]; /* channel, rules, small cap */

static const guard_params *get_params(lg_channel ch, bool rules, bool small)
{
    guard_params **pp = &params[ch][rules][small];
    if (!*pp) {
        char err[256];
        *pp = guard_params_new(ch);
        cJSON *o = cJSON_Parse(rules ? "{\"rules\":[{\"name\":\"ai\",\"pattern\":\"(?i)as an "
                                       "ai\\\\b\"},{\"name\":\"ab\",\"pattern\":\"a+b{3,}\"}],"
                                       "\"holdback_max_bytes\":4096}"
                                     : "{}");
        if (!o || guard_params_apply_json(*pp, o, "fuzz", err, sizeof(err)) < 0) abort();
        cJSON_Delete(o);
        if (small) {
            o = cJSON_Parse("{\"holdback_max_bytes\":16}");
            if (guard_params_apply_json(*pp, o, "fuzz", err, sizeof(err)) < 0) abort();
            cJSON_Delete(o);
        }
    }
    return *pp;
}

static bool valid_utf8(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t len = c < 0x80                ? 1
                     : c >= 0xC2 && c < 0xE0 ? 2
                     : c >= 0xE0 && c < 0xF0 ? 3
                     : c >= 0xF0 && c < 0xF5 ? 4
                                             : 0;
        if (!len || i + len > n) return false;
        for (size_t k = 1; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return false;
        i += len;
    }
    return true;
}

/* The release point fed - suspect must start a character (or be the end of the text). */
static void check_suspect(const guard *g, const uint8_t *text, size_t len, size_t cap, bool utf8)
{
    size_t s = guard_suspect(g), fed = (size_t)guard_bytes(g);
    if (s > fed || s > cap) abort();
    if (utf8 && fed - s < len && (text[fed - s] & 0xC0) == 0x80) abort();
}

/* guard_suspect after each byte of the byte-at-a-time run: held[k] once k bytes were fed. */
#define HELD_MAX 4096
static size_t held[HELD_MAX + 1];
typedef enum { HELD_IGNORE, HELD_RECORD, HELD_CHECK } held_use;

/* Feeds the text in pieces (cuts NULL: whole; step 1: byte by byte), recording
 * guard_suspect after each call into held[] or checking it against held[]. */
static outcome run(const guard_params *p, lg_channel ch, const uint8_t *text, size_t len,
                   fuzz_cuts *cuts, size_t one, bool finish, size_t cap, bool utf8, held_use hu)
{
    outcome o;
    memset(&o, 0, sizeof(o));
    guard *g = guard_new(p, ch);
    size_t at = 0;
    while (at < len) {
        size_t step = one ? one : fuzz_cuts_next(cuts, len - at);
        if (step > len - at) step = len - at;
        bool t = guard_feed(g, (const char *)text + at, step);
        at += step;
        if (t) {
            const guard_verdict *v = guard_get_verdict(g);
            if (!v || v->at_byte > at || v->at_byte + step <= at) abort();
            break;
        }
        check_suspect(g, text, len, cap, utf8);
        if (hu == HELD_RECORD) held[at] = guard_suspect(g);
        if (hu == HELD_CHECK && guard_suspect(g) != held[at]) {
            fprintf(stderr, "suspect after %zu bytes: %zu, byte by byte %zu\n", at,
                    guard_suspect(g), held[at]);
            abort();
        }
    }
    if (finish) guard_finish(g);
    const guard_verdict *v = guard_get_verdict(g);
    o.tripped = guard_tripped(g);
    if (o.tripped != (v != NULL)) abort();
    if (v) {
        o.detector = v->detector;
        o.loop_start = v->loop_start;
        o.at_byte = v->at_byte;
        o.unit_len = v->unit_len;
        if (v->unit_len > 256 || v->loop_start > v->at_byte || v->at_byte > guard_bytes(g)) abort();
        memcpy(o.unit, v->unit, v->unit_len);
        o.repeats = v->repeats;
    }
    guard_free(g); /* detector names are static or owned by the params: still valid */
    return o;
}

static void same(const outcome *a, const outcome *b)
{
    if (a->tripped != b->tripped) abort();
    if (!a->tripped) return;
    if (strcmp(a->detector, b->detector) || a->loop_start != b->loop_start ||
        a->at_byte != b->at_byte || a->unit_len != b->unit_len ||
        memcmp(a->unit, b->unit, a->unit_len) || a->repeats != b->repeats) {
        fprintf(stderr, "verdicts differ: %s@%llu vs %s@%llu\n", a->detector,
                (unsigned long long)a->at_byte, b->detector, (unsigned long long)b->at_byte);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint8_t opt = data[0];
    data++;
    size--;
    fuzz_cuts cuts;
    if (!fuzz_cuts_take(&data, &size, &cuts, 64)) return 0;
    lg_channel ch = (lg_channel)((opt & 3) % LG_CH_COUNT);
    bool finish = opt & 4, rules = opt & 8, small = opt & 16;
    const guard_params *p = get_params(ch, rules, small);
    size_t cap = small ? 16 : 4096;
    bool utf8 = valid_utf8(data, size);

    bool short_text = size <= HELD_MAX;
    held_use hu = short_text ? HELD_CHECK : HELD_IGNORE;
    outcome bytes = {0};
    if (short_text) bytes = run(p, ch, data, size, NULL, 1, finish, cap, utf8, HELD_RECORD);
    outcome whole = run(p, ch, data, size, NULL, 0, finish, cap, utf8, hu);
    outcome split = run(p, ch, data, size, &cuts, 0, finish, cap, utf8, hu);
    same(&whole, &split);
    if (short_text) same(&whole, &bytes);
    return 0;
}
