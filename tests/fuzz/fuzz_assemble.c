/* fuzz_assemble.c — libFuzzer target for the response assembler.
 *
 * Input: newline-separated SSE data payloads. Each is parsed and given to the assembler
 * as the exchange does (metadata, then released reasoning and content). Properties (abort
 * on violation): every mode renders a JSON object; in mode 0 the message content (or the
 * completion text) equals the concatenated released content and reasoning_content equals
 * the concatenated reasoning; in mode 3 no reasoning key appears. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/assemble.h"
#include "proxy/buf.h"

static bool str_is(const cJSON *v, const lg_buf *b)
{
    if (b->len == 0) return !v || cJSON_IsNull(v) || (cJSON_IsString(v) && !v->valuestring[0]);
    return cJSON_IsString(v) && strlen(v->valuestring) == b->len &&
           !memcmp(v->valuestring, b->p, b->len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bool chat = size && (data[0] & 1);
    lg_assembler *a = asm_new(chat);
    lg_buf r = LG_BUF_INIT, c = LG_BUF_INIT;
    const char *p = (const char *)data, *end = p + size;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        dl_delta d;
        dl_parse(p, n, &d);
        asm_meta(a, &d);
        if (d.reasoning) {
            asm_text(a, LG_CH_REASONING, d.reasoning, d.reasoning_len);
            lg_buf_append(&r, d.reasoning, d.reasoning_len);
        }
        if (d.content) {
            asm_text(a, LG_CH_CONTENT, d.content, d.content_len);
            lg_buf_append(&c, d.content, d.content_len);
        }
        dl_delta_clear(&d);
        p += n + 1;
    }
    for (int mode = 0; mode < 4; mode++) {
        char *s = asm_render(a, mode);
        cJSON *j = cJSON_Parse(s);
        if (!cJSON_IsObject(j)) abort();
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
        const cJSON *holder = chat ? cJSON_GetObjectItemCaseSensitive(ch, "message") : ch;
        if (!cJSON_IsObject(holder)) abort();
        if (mode == 0) {
            if (!str_is(cJSON_GetObjectItemCaseSensitive(holder, chat ? "content" : "text"), &c))
                abort();
            if (!str_is(cJSON_GetObjectItemCaseSensitive(holder, "reasoning_content"), &r)) abort();
        }
        if (mode == 3 && (cJSON_GetObjectItemCaseSensitive(holder, "reasoning_content") ||
                          cJSON_GetObjectItemCaseSensitive(holder, "reasoning")))
            abort();
        cJSON_Delete(j);
        free(s);
    }
    asm_free(a);
    lg_buf_free(&r);
    lg_buf_free(&c);
    return 0;
}
