/* dialect.h — upstream chunk dialects in, one normalised view out; output chunks built.
 *
 * OpenAI-compatible servers disagree on the shape of a streamed chunk: SGLang leaves out
 * keys that are None (recent) or sends every key with most of them null (pydantic era);
 * SGLang <= 0.4 puts finish_reason on the last content chunk, sometimes "" instead of null;
 * vLLM names reasoning `reasoning` (>= 0.17), `reasoning_content` (older) or both; one delta
 * may carry reasoning and content; errors arrive mid-stream as {"error":{...}} or as a
 * top-level {"object":"error",...}; usage comes in a chunk with "choices":[]; text
 * completions carry choices[].text. dl_parse reads any of them into a dl_delta in which
 * missing, null and "" mean the same thing (a NULL pointer). The builders go the other
 * way, for the events loopguard writes itself.
 *
 * Only choices[0] is read into the view: loopguard guards choice 0 (n > 1 requests are
 * relayed with the other choices untouched by the template-based builder). */
#ifndef LG_DIALECT_H
#define LG_DIALECT_H

#include <stdbool.h>
#include <stddef.h>

#include <cJSON.h>

typedef enum {
    DL_CHUNK, /* a JSON object with choices and/or usage */
    DL_DONE,  /* the "[DONE]" sentinel */
    DL_ERROR, /* an error object, either shape */
    DL_OTHER, /* unparseable or unknown JSON */
} dl_kind;

/* Which keys carried the reasoning text of a delta. */
#define DL_KEY_REASONING_CONTENT 1u
#define DL_KEY_REASONING         2u

/* One tool-call fragment of a delta. Strings borrowed from the delta's root; NULL when
 * missing/null/"". `index` is the fragment's index field, or its array position. */
typedef struct dl_tool {
    int index;
    const char *id;
    const char *name;
    const char *args;
    size_t args_len;
} dl_tool;

typedef struct dl_delta {
    dl_kind kind;
    cJSON *root;      /* owned; the parsed chunk (NULL for DONE/OTHER; the object for ERROR) */
    int choice_index; /* choices[0].index, 0 when absent */
    size_t n_choices;
    const char *role; /* NULL when absent */
    /* Reasoning from reasoning_content and/or reasoning; when both carry the same text it
     * is counted once, when they differ both are kept, reasoning_content first. */
    const char *reasoning;
    size_t reasoning_len;
    unsigned reasoning_keys; /* DL_KEY_* that were present with text */
    const char *content;     /* chat delta.content or completions text; NULL when none */
    size_t content_len;
    dl_tool *tools; /* owned array */
    size_t n_tools;
    const char *finish_reason; /* NULL when missing/null/"" */
    cJSON *usage;              /* borrowed from root; NULL when missing/null */
    const char *error_message; /* DL_ERROR: message ("" when none) */
    const char *error_type;    /* DL_ERROR: type, NULL when absent */
    int error_code;            /* DL_ERROR: numeric code (a numeric string counts), else 0 */

    /* Added fields (borrowed from root, NULL/0 when absent): */
    const char *id;
    const char *model;
    long long created;
    bool has_created;
    bool chat;     /* a chat chunk (object chat.completion.chunk or a delta), not text_completion */
    cJSON *choice; /* choices[0] */
    char *own_text; /* owned storage for a joined reasoning; internal */
} dl_delta;

/* Parses one SSE data payload (need not be NUL-terminated). Always fills *out completely
 * (kind says what it is) and returns 0; the caller owns *out and must dl_delta_clear it. */
int dl_parse(const char *data, size_t len, dl_delta *out);

/* Frees the owned parts and zeroes *d; safe to call twice and on a zeroed struct. */
void dl_delta_clear(dl_delta *d);

/* Builds a chunk event payload (JSON, no "data: " prefix) from `tmpl` (a DL_CHUNK): every
 * top-level and choice-level field is kept (id, object, created, model, system_fingerprint,
 * usage, logprobs, ...), the text keys of choices[0] (delta reasoning_content, reasoning,
 * content; or text) are removed and the given texts placed per `mode` (lg_reasoning_output:
 * 0 reasoning_content, 1 reasoning, 2 inline — the caller passes the inline text already
 * inside content, reasoning is ignored —, 3 hide). A NULL text adds no key; content "" with
 * clen 0 adds "content":"". Text completions always get "text" ("" when NULL) and ignore
 * reasoning. finish_reason NULL: null when the template's choice had the key (and its
 * matched_stop/stop_reason nulled too), absent otherwise. keep_tools false drops
 * delta.tool_calls. A template without choices gets a fresh choices[0].
 * Returns a malloc'd string the caller frees, or NULL when tmpl has no root. */
char *dl_build_chunk(const dl_delta *tmpl, const char *reasoning, size_t rlen, const char *content,
                     size_t clen, int mode, bool keep_tools, const char *finish_reason);

/* A minimal chunk from scratch for synthetic events (released holdback, terminal chunks):
 * {"id","object":"chat.completion.chunk"|"text_completion","created","model","choices":[{
 * "index":0,"delta":{...}|"text","logprobs":null,"finish_reason"}]}. id/model NULL are
 * omitted. Texts placed as in dl_build_chunk. Returns a malloc'd string. */
char *dl_build_synthetic(bool chat, const char *id, const char *model, long long created,
                         const char *reasoning, size_t rlen, const char *content, size_t clen,
                         int mode, const char *finish_reason);

/* OpenAI-style error JSON {"error":{"message","type","param":null,"code"}}: code is the
 * string code_or_null when given, else http_status_for_code when > 0, else null. type NULL
 * means "server_error". Returns a malloc'd string. */
char *dl_error_json(const char *message, const char *type, const char *code_or_null,
                    int http_status_for_code);

/* Small cJSON helpers shared by the proxy modules; each aborts on allocation failure.
 * dl_json_must returns x (never NULL); dl_json_del removes every member named key (JSON
 * text may repeat a key; cJSON keeps all copies and lookups see the first);
 * dl_json_set replaces all of obj[key] with item (taking ownership); dl_json_print_free
 * prints root compactly, frees it and returns the malloc'd string. */
cJSON *dl_json_must(cJSON *x);
void dl_json_del(cJSON *obj, const char *key);
void dl_json_set(cJSON *obj, const char *key, cJSON *item);
char *dl_json_print_free(cJSON *root);

/* A shallow overlay of the object src: a new object whose members refer to the contents of
 * src's members instead of copying them (numbers, booleans and null, which hold nothing,
 * are copied). O(members of src), not O(src): an attempt's upstream body is built on one
 * without a deep copy of the client's request. Replace or delete the overlay's members
 * (dl_json_set, dl_json_del); never edit a referred member in place — overlay it first
 * (dl_json_overlay_member). src must outlive the overlay; deleting the overlay leaves src
 * untouched. Caller owns the result. */
cJSON *dl_json_overlay(const cJSON *src);

/* In the overlay obj, obj[key] replaced by an overlay of itself (an empty object when
 * absent or not an object), returned ready to edit; owned by obj. obj must be an overlay
 * (or own nothing under key that anything else refers to). */
cJSON *dl_json_overlay_member(cJSON *obj, const char *key);

#endif
