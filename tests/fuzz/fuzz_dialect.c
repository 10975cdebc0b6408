/* fuzz_dialect.c — libFuzzer target for the chunk dialect parser and builders.
 *
 * Properties (abort on violation): dl_parse never fails and its view is consistent
 * (lengths match the strings, a chunk has a root, DONE/OTHER have none); a chunk rebuilt
 * with its own texts in modes 0 and 1 parses back to the same content, reasoning and
 * finish_reason; an error rebuilt with dl_error_json parses back as an error with the
 * same message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/dialect.h"

static bool eq(const char *a, size_t al, const char *b, size_t bl)
{
    if (!a || !b) return !a && !b;
    return al == bl && !memcmp(a, b, al);
}

static void check_view(const dl_delta *d)
{
    if ((d->kind == DL_DONE || d->kind == DL_OTHER) && d->root) abort();
    if ((d->kind == DL_CHUNK || d->kind == DL_ERROR) && !d->root) abort();
    if (d->content && strlen(d->content) != d->content_len) abort();
    if (d->reasoning && strlen(d->reasoning) != d->reasoning_len) abort();
    if (!d->reasoning && d->reasoning_len) abort();
    for (size_t i = 0; i < d->n_tools; i++)
        if (d->tools[i].args && strlen(d->tools[i].args) != d->tools[i].args_len) abort();
    if (d->kind == DL_ERROR && !d->error_message) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dl_delta d;
    if (dl_parse((const char *)data, size, &d) != 0) abort();
    check_view(&d);
    if (d.kind == DL_CHUNK) {
        for (int mode = 0; mode < 4; mode++) {
            char *s = dl_build_chunk(&d, d.reasoning, d.reasoning_len, d.content, d.content_len,
                                     mode, mode & 1, d.finish_reason);
            if (!s) abort();
            dl_delta b;
            dl_parse(s, strlen(s), &b);
            check_view(&b);
            if (b.kind != DL_CHUNK) abort();
            if (!eq(b.content, b.content_len, d.content, d.content_len)) abort();
            if (mode < 2 && d.chat &&
                !eq(b.reasoning, b.reasoning_len, d.reasoning, d.reasoning_len))
                abort();
            if (!eq(b.finish_reason, b.finish_reason ? strlen(b.finish_reason) : 0, d.finish_reason,
                    d.finish_reason ? strlen(d.finish_reason) : 0))
                abort();
            dl_delta_clear(&b);
            free(s);
        }
        char *s = dl_build_synthetic(d.chat, d.id, d.model, d.created, d.reasoning, d.reasoning_len,
                                     d.content, d.content_len, 0, d.finish_reason);
        dl_delta b;
        dl_parse(s, strlen(s), &b);
        if (b.kind != DL_CHUNK || !eq(b.content, b.content_len, d.content, d.content_len)) abort();
        dl_delta_clear(&b);
        free(s);
    } else if (d.kind == DL_ERROR) {
        char *s = dl_error_json(d.error_message, d.error_type, NULL, d.error_code);
        dl_delta b;
        dl_parse(s, strlen(s), &b);
        if (b.kind != DL_ERROR || strcmp(b.error_message, d.error_message)) abort();
        dl_delta_clear(&b);
        free(s);
    }
    dl_delta_clear(&d);
    dl_delta_clear(&d);
    return 0;
}
