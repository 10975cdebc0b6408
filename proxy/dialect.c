/* dialect.c — upstream chunk dialects in, normalised view out; output chunks built
 * (see dialect.h for the dialects and the contract).
 *
 * Parsing costs one cJSON parse of the chunk plus a few key lookups in choices[0]; the
 * view borrows its strings from the parsed tree, so nothing is copied except when a delta
 * carries two different reasoning texts. Building duplicates the template tree (O(chunk))
 * and prints it once. Allocation failure inside cJSON aborts, like everywhere else. */
#include "proxy/dialect.h"

#include <stdlib.h>
#include <string.h>

#include "proxy/xalloc.h"

cJSON *dl_json_must(cJSON *x)
{
    if (!x) lg_oom(0);
    return x;
}

/* The string at obj[key] with its length, or NULL when missing, null, "" or not a string:
 * the one place where "missing, null and empty mean the same" is decided. */
static const char *str_of(const cJSON *obj, const char *key, size_t *len)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsString(v) || !v->valuestring || !v->valuestring[0]) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = strlen(v->valuestring);
    return v->valuestring;
}

static int int_of(const cJSON *obj, const char *key, int dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (cJSON_IsNumber(v)) return v->valueint;
    if (cJSON_IsString(v) && v->valuestring) {
        char *end;
        long n = strtol(v->valuestring, &end, 10);
        if (end != v->valuestring && !*end && n >= -2147483647L && n <= 2147483647L) return (int)n;
    }
    return dflt;
}

/* Reasoning from reasoning_content and/or reasoning: one text when they agree (vLLM in
 * between 0.x versions sends both), both joined when they differ. */
static void parse_reasoning(const cJSON *delta, dl_delta *out)
{
    size_t l1, l2;
    const char *r1 = str_of(delta, "reasoning_content", &l1);
    const char *r2 = str_of(delta, "reasoning", &l2);
    out->reasoning_keys = (r1 ? DL_KEY_REASONING_CONTENT : 0) | (r2 ? DL_KEY_REASONING : 0);
    if (r1 && r2 && (l1 != l2 || memcmp(r1, r2, l1))) {
        out->own_text = lg_xmalloc(l1 + l2 + 1);
        memcpy(out->own_text, r1, l1);
        memcpy(out->own_text + l1, r2, l2 + 1);
        out->reasoning = out->own_text;
        out->reasoning_len = l1 + l2;
    } else {
        out->reasoning = r1 ? r1 : r2;
        out->reasoning_len = r1 ? l1 : l2;
    }
}

static void parse_tools(const cJSON *arr, dl_delta *out)
{
    int n = cJSON_GetArraySize(arr);
    if (n <= 0) return;
    out->tools = lg_xcalloc((size_t)n, sizeof(*out->tools));
    int pos = 0;
    const cJSON *tc;
    cJSON_ArrayForEach(tc, arr)
    {
        if (!cJSON_IsObject(tc)) continue;
        dl_tool *t = &out->tools[out->n_tools++];
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
        t->index = int_of(tc, "index", pos++);
        t->id = str_of(tc, "id", NULL);
        t->name = str_of(fn, "name", NULL);
        t->args = str_of(fn, "arguments", &t->args_len);
    }
}

static void parse_error(const cJSON *e, dl_delta *out)
{
    out->kind = DL_ERROR;
    if (cJSON_IsString(e)) { /* {"error": "message"} */
        out->error_message = e->valuestring;
        return;
    }
    const char *m = str_of(e, "message", NULL);
    out->error_message = m ? m : "";
    out->error_type = str_of(e, "type", NULL);
    out->error_code = int_of(e, "code", 0);
}

static void parse_choice(const cJSON *ch, dl_delta *out)
{
    out->choice = (cJSON *)ch;
    out->choice_index = int_of(ch, "index", 0);
    out->finish_reason = str_of(ch, "finish_reason", NULL);
    const cJSON *delta = cJSON_GetObjectItemCaseSensitive(ch, "delta");
    if (cJSON_IsObject(delta)) {
        out->role = str_of(delta, "role", NULL);
        parse_reasoning(delta, out);
        out->content = str_of(delta, "content", &out->content_len);
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(delta, "tool_calls");
        if (cJSON_IsArray(tools)) parse_tools(tools, out);
    } else if (cJSON_GetObjectItemCaseSensitive(ch, "text")) {
        out->chat = false;
        out->content = str_of(ch, "text", &out->content_len);
    }
}

int dl_parse(const char *data, size_t len, dl_delta *out)
{
    memset(out, 0, sizeof(*out));
    out->kind = DL_OTHER;
    while (len && (*data == ' ' || *data == '\t' || *data == '\r' || *data == '\n')) {
        data++;
        len--;
    }
    while (len && (data[len - 1] == ' ' || data[len - 1] == '\t' || data[len - 1] == '\r' ||
                   data[len - 1] == '\n'))
        len--;
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        out->kind = DL_DONE;
        return 0;
    }
    cJSON *root = cJSON_ParseWithLength(data, len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return 0;
    }
    out->root = root;
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(root, "error");
    const char *object = str_of(root, "object", NULL);
    if (cJSON_IsObject(err) || (cJSON_IsString(err) && err->valuestring)) {
        parse_error(err, out);
        return 0;
    }
    if (object && !strcmp(object, "error")) {
        parse_error(root, out);
        return 0;
    }
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(root, "choices");
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(root, "usage");
    if (!cJSON_IsArray(choices) && !cJSON_IsObject(usage)) {
        cJSON_Delete(root);
        out->root = NULL;
        return 0;
    }
    out->kind = DL_CHUNK;
    out->id = str_of(root, "id", NULL);
    out->model = str_of(root, "model", NULL);
    const cJSON *created = cJSON_GetObjectItemCaseSensitive(root, "created");
    if (cJSON_IsNumber(created) && created->valuedouble > -9e18 && created->valuedouble < 9e18) {
        out->created = (long long)created->valuedouble;
        out->has_created = true;
    }
    out->chat = !object || strcmp(object, "text_completion") != 0;
    out->usage = cJSON_IsObject(usage) ? (cJSON *)usage : NULL;
    out->n_choices = (size_t)cJSON_GetArraySize(choices);
    const cJSON *ch = cJSON_GetArrayItem(choices, 0);
    if (cJSON_IsObject(ch)) parse_choice(ch, out);
    return 0;
}

void dl_delta_clear(dl_delta *d)
{
    cJSON_Delete(d->root);
    free(d->tools);
    free(d->own_text);
    memset(d, 0, sizeof(*d));
    d->kind = DL_OTHER;
}

void dl_json_del(cJSON *obj, const char *key)
{
    while (cJSON_GetObjectItemCaseSensitive(obj, key))
        cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
}

void dl_json_set(cJSON *obj, const char *key, cJSON *item)
{
    dl_json_del(obj, key);
    if (!cJSON_AddItemToObject(obj, key, dl_json_must(item))) lg_oom(0);
}

/* A member that refers to its contents (see dl_json_overlay). */
static cJSON *refer_to(const cJSON *it)
{
    if (cJSON_IsObject(it)) return cJSON_CreateObjectReference(it->child);
    if (cJSON_IsArray(it)) return cJSON_CreateArrayReference(it->child);
    if (cJSON_IsString(it)) return cJSON_CreateStringReference(it->valuestring);
    return cJSON_Duplicate(it, 0);
}

cJSON *dl_json_overlay(const cJSON *src)
{
    cJSON *ov = dl_json_must(cJSON_CreateObject());
    for (const cJSON *it = src ? src->child : NULL; it; it = it->next)
        if (!cJSON_AddItemToObject(ov, it->string, dl_json_must(refer_to(it)))) lg_oom(0);
    return ov;
}

cJSON *dl_json_overlay_member(cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    cJSON *ov = dl_json_overlay(cJSON_IsObject(v) ? v : NULL);
    dl_json_set(obj, key, ov);
    return ov;
}

/* obj[key] = the n bytes at s as a JSON string, replacing any earlier value. */
static void set_strn(cJSON *obj, const char *key, const char *s, size_t n)
{
    char *tmp = lg_xmalloc(n + 1);
    if (n) memcpy(tmp, s, n);
    tmp[n] = '\0';
    dl_json_set(obj, key, cJSON_CreateString(tmp));
    free(tmp);
}

/* Puts the texts into a choice: chat into delta (reasoning per mode), completions into
 * "text". The text keys are removed first so no stale text survives from a template. */
static void put_texts(cJSON *choice, bool chat, const char *reasoning, size_t rlen,
                      const char *content, size_t clen, int mode, bool keep_tools)
{
    if (!chat) {
        set_strn(choice, "text", content ? content : "", content ? clen : 0);
        return;
    }
    cJSON *delta = cJSON_GetObjectItemCaseSensitive(choice, "delta");
    if (!cJSON_IsObject(delta)) {
        delta = dl_json_must(cJSON_CreateObject());
        dl_json_set(choice, "delta", delta);
    }
    dl_json_del(delta, "reasoning_content");
    dl_json_del(delta, "reasoning");
    dl_json_del(delta, "content");
    if (!keep_tools) {
        dl_json_del(delta, "tool_calls");
        dl_json_del(delta, "function_call");
    }
    if (reasoning && (mode == 0 || mode == 1))
        set_strn(delta, mode == 0 ? "reasoning_content" : "reasoning", reasoning, rlen);
    if (content) set_strn(delta, "content", content, clen);
}

/* Prints and frees a tree; the caller owns the string. */
char *dl_json_print_free(cJSON *root)
{
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!s) lg_oom(0);
    return s;
}

/* A fresh choices[0] for a chat or text completion chunk. */
static cJSON *new_choice(bool chat)
{
    cJSON *ch = dl_json_must(cJSON_CreateObject());
    dl_json_set(ch, "index", cJSON_CreateNumber(0));
    dl_json_set(ch, chat ? "delta" : "text", chat ? cJSON_CreateObject() : cJSON_CreateString(""));
    dl_json_set(ch, "logprobs", cJSON_CreateNull());
    dl_json_set(ch, "finish_reason", cJSON_CreateNull());
    return ch;
}

char *dl_build_chunk(const dl_delta *tmpl, const char *reasoning, size_t rlen, const char *content,
                     size_t clen, int mode, bool keep_tools, const char *finish_reason)
{
    if (!tmpl->root) return NULL;
    cJSON *root = dl_json_must(cJSON_Duplicate(tmpl->root, 1));
    cJSON *choices = cJSON_GetObjectItemCaseSensitive(root, "choices");
    if (!cJSON_IsArray(choices)) {
        choices = dl_json_must(cJSON_CreateArray());
        dl_json_set(root, "choices", choices);
    }
    cJSON *choice = cJSON_GetArrayItem(choices, 0);
    if (!cJSON_IsObject(choice)) {
        choice = new_choice(tmpl->chat);
        if (cJSON_GetArraySize(choices) > 0)
            cJSON_ReplaceItemInArray(choices, 0, choice);
        else
            cJSON_AddItemToArray(choices, choice);
    }
    put_texts(choice, tmpl->chat, reasoning, rlen, content, clen, mode, keep_tools);
    if (finish_reason) {
        dl_json_set(choice, "finish_reason", cJSON_CreateString(finish_reason));
    } else if (cJSON_GetObjectItemCaseSensitive(choice, "finish_reason")) {
        /* Not a final chunk: the template's finish and what came with it do not apply. */
        static const char *const tied[] = {"finish_reason", "matched_stop", "stop_reason"};
        for (size_t i = 0; i < sizeof(tied) / sizeof(tied[0]); i++)
            if (cJSON_GetObjectItemCaseSensitive(choice, tied[i]))
                dl_json_set(choice, tied[i], cJSON_CreateNull());
    }
    return dl_json_print_free(root);
}

char *dl_build_synthetic(bool chat, const char *id, const char *model, long long created,
                         const char *reasoning, size_t rlen, const char *content, size_t clen,
                         int mode, const char *finish_reason)
{
    cJSON *root = dl_json_must(cJSON_CreateObject());
    if (id) dl_json_set(root, "id", cJSON_CreateString(id));
    dl_json_set(root, "object",
                cJSON_CreateString(chat ? "chat.completion.chunk" : "text_completion"));
    dl_json_set(root, "created", cJSON_CreateNumber((double)created));
    if (model) dl_json_set(root, "model", cJSON_CreateString(model));
    cJSON *choices = dl_json_must(cJSON_CreateArray());
    dl_json_set(root, "choices", choices);
    cJSON *choice = new_choice(chat);
    cJSON_AddItemToArray(choices, choice);
    put_texts(choice, chat, reasoning, rlen, content, clen, mode, false);
    if (finish_reason) dl_json_set(choice, "finish_reason", cJSON_CreateString(finish_reason));
    return dl_json_print_free(root);
}

char *dl_error_json(const char *message, const char *type, const char *code_or_null,
                    int http_status_for_code)
{
    cJSON *root = dl_json_must(cJSON_CreateObject());
    cJSON *e = dl_json_must(cJSON_CreateObject());
    dl_json_set(root, "error", e);
    dl_json_set(e, "message", cJSON_CreateString(message ? message : ""));
    dl_json_set(e, "type", cJSON_CreateString(type ? type : "server_error"));
    dl_json_set(e, "param", cJSON_CreateNull());
    if (code_or_null)
        dl_json_set(e, "code", cJSON_CreateString(code_or_null));
    else if (http_status_for_code > 0)
        dl_json_set(e, "code", cJSON_CreateNumber(http_status_for_code));
    else
        dl_json_set(e, "code", cJSON_CreateNull());
    return dl_json_print_free(root);
}
