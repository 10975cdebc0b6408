/* guard_trace.c — what the guard decides on a set of texts, one line per text and way of
 * feeding, so that two builds of the guard can be compared byte for byte
 * (tests/bench/guard_same.sh builds this file against another revision's guard/).
 *
 *   guard_trace NAME < records.json   every `output` of a JSON array of records (AlpacaEval's
 *                                     format), NAME in each line
 *   guard_trace -f LIST               every file named in LIST, one path a line (first 64 KiB)
 *
 * Each text is fed four ways: on the content channel with the record's prompt (none for a
 * file), in chunks of 1-8 bytes from a seeded generator with guard_suspect after each, and
 * whole; on the reasoning channel without a prompt, the same two ways. A line holds the bytes
 * fed, a hash of every guard_suspect value in order, and the verdict (detector, trip byte,
 * loop start, repeats, and a hash of the unit). Speed work on the guard must leave this
 * output unchanged. GUARD_TRACE_PARAMS (see apply_env_params) traces with other settings. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guard/guard.h"

#define FILE_CAP (64 << 10)

static guard_params *params[2]; /* content, reasoning */

static uint64_t fnv(uint64_t h, uint64_t v)
{
    return (h ^ v) * 0x100000001B3ull;
}

/* Feeds text[0..len) one way (mode: bit 0 whole, bit 1 reasoning) and prints its line. */
static void trace(const char *name, size_t idx, const char *text, size_t len, const cJSON *rec,
                  int mode, unsigned seed)
{
    lg_channel ch = mode & 2 ? LG_CH_REASONING : LG_CH_CONTENT;
    guard *g = guard_new(params[mode >> 1], ch);
    if (rec && ch == LG_CH_CONTENT) guard_set_prompt_json(g, rec);
    uint64_t held = 0xCBF29CE484222325ull;
    if (mode & 1) {
        guard_feed(g, text, len);
        held = fnv(held, guard_suspect(g));
    } else {
        for (size_t off = 0; off < len;) {
            seed = seed * 1103515245u + 12345u;
            size_t k = 1 + (seed >> 16) % 8;
            if (k > len - off) k = len - off;
            bool tripped = guard_feed(g, text + off, k);
            off += k;
            held = fnv(held, guard_suspect(g));
            if (tripped) break;
        }
    }
    guard_finish(g);
    held = fnv(held, guard_suspect(g));
    printf("%s %zu m%d fed=%llu held=%016llx", name, idx, mode, (unsigned long long)guard_bytes(g),
           (unsigned long long)held);
    const guard_verdict *v = guard_get_verdict(g);
    if (v) {
        uint64_t u = 0xCBF29CE484222325ull;
        for (size_t i = 0; i < v->unit_len; i++)
            u = fnv(u, (unsigned char)v->unit[i]);
        printf(" %s at=%llu from=%llu repeats=%u unit=%zu/%016llx", v->detector,
               (unsigned long long)v->at_byte, (unsigned long long)v->loop_start, v->repeats,
               v->unit_len, (unsigned long long)u);
    }
    putchar('\n');
    guard_free(g);
}

static void trace_all(const char *name, size_t idx, const char *text, size_t len, const cJSON *rec)
{
    for (int mode = 0; mode < 4; mode++)
        trace(name, idx, text, len, rec, mode, 12345u + (unsigned)idx);
}

/* Reads all of f (at most cap bytes); NULL on a read error. */
static char *slurp(FILE *f, size_t cap, size_t *n)
{
    size_t size = 1 << 16;
    char *d = malloc(size + 1);
    *n = 0;
    while (d && *n < cap) {
        if (*n == size) {
            size *= 2;
            char *grown = realloc(d, size + 1);
            if (!grown) break;
            d = grown;
        }
        size_t want = size - *n < cap - *n ? size - *n : cap - *n;
        size_t got = fread(d + *n, 1, want, f);
        *n += got;
        if (got < want) break;
    }
    if (d && ferror(f)) {
        free(d);
        return NULL;
    }
    if (d) d[*n] = 0;
    return d;
}

static int trace_files(const char *list)
{
    FILE *l = fopen(list, "r");
    if (!l) {
        perror(list);
        return 1;
    }
    char path[4096];
    size_t idx = 0;
    while (fgets(path, sizeof path, l)) {
        path[strcspn(path, "\n")] = 0;
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        size_t n;
        char *d = slurp(f, FILE_CAP, &n);
        fclose(f);
        if (d) trace_all("file", idx++, d, n, NULL);
        free(d);
    }
    fclose(l);
    return 0;
}

static int trace_records(const char *name)
{
    size_t n;
    char *d = slurp(stdin, SIZE_MAX - 1, &n);
    cJSON *arr = d ? cJSON_Parse(d) : NULL;
    free(d);
    if (!cJSON_IsArray(arr)) {
        fprintf(stderr, "guard_trace: %s: not a JSON array of records\n", name);
        cJSON_Delete(arr);
        return 1;
    }
    size_t idx = 0;
    const cJSON *rec;
    cJSON_ArrayForEach(rec, arr)
    {
        const cJSON *o = cJSON_GetObjectItem(rec, "output");
        if (cJSON_IsString(o)) trace_all(name, idx, o->valuestring, strlen(o->valuestring), rec);
        idx++;
    }
    cJSON_Delete(arr);
    return 0;
}

/* GUARD_TRACE_PARAMS, a JSON object of guard settings (the config's guard section), over
 * both channels' defaults: a detector's thresholds lowered so that it trips often puts
 * its counting to the test. False (and a message) when it is not valid. */
static bool apply_env_params(void)
{
    const char *json = getenv("GUARD_TRACE_PARAMS");
    if (!json || !*json) return true;
    cJSON *o = cJSON_Parse(json);
    char err[256] = "GUARD_TRACE_PARAMS: not a JSON object";
    bool ok = cJSON_IsObject(o);
    for (int k = 0; ok && k < 2; k++)
        ok = guard_params_apply_json(params[k], o, "GUARD_TRACE_PARAMS", err, sizeof err) == 0;
    cJSON_Delete(o);
    if (!ok) fprintf(stderr, "guard_trace: %s\n", err);
    return ok;
}

int main(int argc, char **argv)
{
    if (argc != 2 && !(argc == 3 && !strcmp(argv[1], "-f"))) {
        fprintf(stderr, "usage: guard_trace NAME < records.json | guard_trace -f LIST\n");
        return 2;
    }
    params[0] = guard_params_new(LG_CH_CONTENT);
    params[1] = guard_params_new(LG_CH_REASONING);
    if (!apply_env_params()) return 2;
    int rc = argc == 3 ? trace_files(argv[2]) : trace_records(argv[1]);
    guard_params_free(params[0]);
    guard_params_free(params[1]);
    return rc;
}
