/* fuzz_rewrite.c — libFuzzer target for request validation and upstream bodies.
 *
 * Input: one flag byte (bit 0: chat endpoint; bits 1-2: upstream kind; bits 3-4: history
 * mode; bit 5: apply a sampling step), then a NUL-free continuation text up to the first
 * NUL, then the request body. Properties (abort on violation): a rejected request is a 400
 * with a message; for an accepted one every built body is a JSON object with stream true
 * and stream_options.include_usage true, a continuation (when built) ends the last
 * assistant message or the prompt with the continuation text, and building never changes
 * the parsed request. For a body that passes jsonguard (as every body the exchange builds
 * from does), the body spliced from the client's (rw_opts.raw) is the same JSON value as the
 * tree's print, with its members in the same order. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/jsonguard.h"
#include "proxy/rewrite.h"

static const cJSON *at(const cJSON *j, const char *k)
{
    return cJSON_GetObjectItemCaseSensitive(j, k);
}

static bool ends_with(const char *s, const char *suffix, size_t n)
{
    size_t l = strlen(s);
    return l >= n && !memcmp(s + l - n, suffix, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint8_t flags = data[0];
    const char *cont = (const char *)data + 1;
    const char *nul = memchr(cont, '\0', size - 1);
    if (!nul) return 0;
    size_t clen = (size_t)(nul - cont);
    const char *body = nul + 1;
    size_t blen = size - 1 - clen - 1;

    rw_request req;
    rw_error err = {0};
    if (rw_parse(body, blen, flags & 1, &req, &err) != 0) {
        if (err.status != 400 || !err.message || req.root) abort();
        return 0;
    }
    char *before = cJSON_PrintUnformatted(req.root);
    lg_sampling_step step = {.temperature_add = 0.2,
                             .has_presence_penalty = true,
                             .presence_penalty = 1.0,
                             .has_repetition_penalty = true,
                             .repetition_penalty = 1.05,
                             .new_seed = true};
    rw_opts o = {.upstream_kind = 1 + (flags >> 1) % 3,
                 .rid = "0123456789abcdef0123456789abcdef",
                 .step = (flags & 32) ? &step : NULL,
                 .seed = 42,
                 .history = (flags >> 3) % 3};
    for (int withcont = 0; withcont < 2; withcont++) {
        o.continue_text = withcont ? cont : NULL;
        o.continue_len = withcont ? clen : 0;
        char *s = rw_build_upstream(&req, &o, &err);
        if (!s) {
            if (!withcont || !err.message) abort();
            continue;
        }
        cJSON *j = cJSON_Parse(s);
        if (!cJSON_IsObject(j) || !cJSON_IsTrue(at(j, "stream")) ||
            !cJSON_IsTrue(at(at(j, "stream_options"), "include_usage")))
            abort();
        if (withcont) {
            const cJSON *target;
            if (req.chat) {
                const cJSON *msgs = at(j, "messages");
                target = at(cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1), "content");
            } else {
                target = at(j, "prompt");
            }
            if (!cJSON_IsString(target) || !ends_with(target->valuestring, cont, clen)) abort();
        }
        char why[128];
        const jg_limits lim = {100000, 64};
        if (jsonguard_check(body, blen, &lim, why, sizeof why) == 0) {
            rw_opts spliced = o;
            spliced.raw = body;
            spliced.raw_len = blen;
            char *t = rw_build_upstream(&req, &spliced, &err);
            cJSON *k = t ? cJSON_Parse(t) : NULL;
            if (!k || !cJSON_Compare(j, k, true)) abort();
            for (const cJSON *x = j->child, *y = k->child; x || y; x = x->next, y = y->next)
                if (!x || !y || strcmp(x->string, y->string)) abort();
            cJSON_Delete(k);
            free(t);
        }
        cJSON_Delete(j);
        free(s);
    }
    cJSON_Delete(rw_sampling_json(&req, &o));
    char *after = cJSON_PrintUnformatted(req.root);
    if (!before || !after || strcmp(before, after)) abort();
    free(before);
    free(after);
    rw_request_clear(&req);
    return 0;
}
