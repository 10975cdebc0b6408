/* config.c — loopguard's configuration: built-in defaults, the JSON file, LOOPGUARD_*
 * environment variables, command-line setters and validation.
 *
 * Every key is described once, in a schema table (key_spec) that says where the value
 * lives, what type and range it must have and, for the few keys that need more than a
 * type check (listen, upstream, models, the retry ladder, guard channel settings), which
 * function applies it. The same table drives the file loader and the environment, so a key
 * cannot be accepted by one and rejected by the other, and every error names the full key
 * path ("retry.ladder[1].presence_penalty: must be between -2 and 2 (got 3)").
 *
 * Loading applies over what is already there: scalars and objects merge key by key,
 * arrays (upstream, models, retry.ladder, api_keys) replace the previous array whole. On an
 * error the config is left valid (it can be freed) but partly applied; callers exit.
 * Loading is not thread-safe and happens once, in main(), before the workers start; the
 * loaded config is then read-only, and config_model_rule() may be called from any thread. */
#include "config/config.h"
#include "proxy/xalloc.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#define MAX_PATH_LEN   512         /* longest key path in an error message */
#define MAX_FILE_BYTES (16u << 20) /* a config file larger than this is surely a mistake */
#define MAX_UPSTREAMS  256
#define MAX_MODELS     1024
#define MAX_LADDER     16
#define MAX_API_KEYS   4096

_Static_assert(sizeof(lg_upstream_kind) == sizeof(int), "enums are stored through int");

/* ------------------------------------------------------------------------------------- */
/* Errors                                                                                */

/* Writes "path: message" into err. Always returns -1 so callers can `return fail(...)`. */
static int fail(char *err, size_t errlen, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, const char *path, const char *fmt, ...)
{
    if (!err || errlen == 0) return -1;
    int n = snprintf(err, errlen, "%s: ", path);
    if (n < 0 || (size_t)n >= errlen) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

/* Every failure of one loading step, in the order found: one "path: problem" line each,
 * joined by '\n', so that a user fixes them all in one go instead of one per start. */
typedef struct errlist {
    char *text; /* malloc'd, NUL-terminated; NULL while empty */
    size_t len;
    unsigned n;
} errlist;

/* Appends each line of msg, prefixed with "prefix: " when prefix is not NULL. */
static void errs_add(errlist *e, const char *prefix, const char *msg)
{
    for (const char *line = msg;;) {
        size_t n = strcspn(line, "\n");
        size_t need = e->len + (prefix ? strlen(prefix) + 2 : 0) + n + 2;
        char *t = lg_xrealloc(e->text, need);
        e->text = t;
        e->len += (size_t)snprintf(t + e->len, need - e->len, "%s%s%s%.*s", e->n ? "\n" : "",
                                   prefix ? prefix : "", prefix ? ": " : "", (int)n, line);
        e->n++;
        if (!line[n]) break;
        line += n + 1;
    }
}

/* Writes the collected lines into err (truncated to errlen) and frees them. Returns 0 when
 * there were none, else -1. */
static int errs_finish(errlist *e, char *err, size_t errlen)
{
    int rc = e->n ? -1 : 0;
    if (e->n && err && errlen) snprintf(err, errlen, "%s", e->text);
    free(e->text);
    *e = (errlist){0};
    return rc;
}

/* Levenshtein distance between a and b, or SIZE_MAX when either is too long to matter. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), row[65];
    if (la > 64 || lb > 64) return SIZE_MAX;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best =
                diag + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* True when `typed` is close enough to `known` to suggest it: one edit for short names,
 * two from six characters on (max_atempts -> max_attempts, upstrem -> upstream). */
static bool near_miss(const char *typed, const char *known)
{
    size_t d = edit_distance(typed, known);
    return d > 0 && d <= (strlen(known) >= 6 ? 2u : 1u);
}

/* ------------------------------------------------------------------------------------- */
/* Enumerations: names are the JSON spellings, the index is the enum value.              */

static const char *const upstream_kind_names[] = {"auto", "sglang", "vllm", "openai", NULL};
static const char *const reasoning_output_names[] = {"reasoning_content", "reasoning", "inline",
                                                     "hide", NULL};
static const char *const history_names[] = {"rewrite", "keep", "drop", NULL};
static const char *const retry_mode_names[] = {"auto", "restart", "continue", NULL};
static const char *const exhausted_names[] = {"content_filter", "pass_through", "error", NULL};
static const char *const elsewhere_names[] = {"auto", "never", NULL};
static const char *const capture_names[] = {"excerpt", "full", "none", NULL};
static const char *const scheduling_names[] = {"batch", "normal", NULL};
/* JSON keys of the guard channels, indexed by lg_channel. */
static const char *const channel_keys[] = {"reasoning", "content", "tool_args", NULL};
_Static_assert(sizeof channel_keys / sizeof *channel_keys == LG_CH_COUNT + 1, "one per channel");

/* Returns the index of s in the NULL-terminated names, or -1. */
static int enum_lookup(const char *const *names, const char *s)
{
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], s) == 0) return i;
    return -1;
}

/* "a, b, c" for error messages. */
static void enum_list(const char *const *names, char *out, size_t outlen)
{
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; names[i] && n < outlen; i++) {
        int w = snprintf(out + n, outlen - n, "%s%s", i ? ", " : "", names[i]);
        if (w < 0) break;
        n += (size_t)w;
    }
}

const char *config_reasoning_output_name(lg_reasoning_output o)
{
    return (unsigned)o < LG_REASONING_HIDE + 1u ? reasoning_output_names[o] : "?";
}

int config_reasoning_output_parse(const char *s, lg_reasoning_output *out)
{
    int i = s ? enum_lookup(reasoning_output_names, s) : -1;
    if (i < 0) return -1;
    *out = (lg_reasoning_output)i;
    return 0;
}

const char *config_upstream_kind_name(lg_upstream_kind k)
{
    return (unsigned)k < LG_UPSTREAM_OPENAI + 1u ? upstream_kind_names[k] : "?";
}

/* ------------------------------------------------------------------------------------- */
/* Value parsers shared by the schema, the custom keys and the flag setters.             */

/* Parses "HOST:PORT" ("[v6]:PORT" for IPv6). On success *host is malloc'd (brackets
 * stripped) and *port is 0..65535. */
static int parse_hostport(const char *s, char **host, int *port, const char *path, char *err,
                          size_t errlen)
{
    const char *colon, *h = s;
    size_t hlen;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':')
            return fail(err, errlen, path, "expected \"HOST:PORT\" (got \"%s\")", s);
        h = s + 1;
        hlen = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon) return fail(err, errlen, path, "expected \"HOST:PORT\" (got \"%s\")", s);
        hlen = (size_t)(colon - s);
        if (memchr(s, ':', hlen))
            return fail(err, errlen, path, "IPv6 addresses need brackets: \"[::1]:8000\"");
    }
    if (hlen == 0) return fail(err, errlen, path, "missing host in \"%s\"", s);
    for (size_t i = 0; i < hlen; i++)
        if (isspace((unsigned char)h[i]) || h[i] == '/')
            return fail(err, errlen, path, "invalid host in \"%s\"", s);
    const char *p = colon + 1;
    if (*p == '\0') return fail(err, errlen, path, "missing port in \"%s\"", s);
    long v = 0;
    for (; *p; p++) {
        if (!isdigit((unsigned char)*p) || (v = v * 10 + (*p - '0')) > 65535)
            return fail(err, errlen, path, "port must be 0..65535 in \"%s\"", s);
    }
    *host = lg_xcheck(strndup(h, hlen));
    *port = (int)v;
    return 0;
}

int config_split_hostport(const char *hostport, char **host, int *port, char *err, size_t errlen)
{
    return parse_hostport(hostport, host, port, "address", err, errlen);
}

/* Checks an upstream base URL and returns a malloc'd copy without trailing slashes. Only
 * http and https; no query, fragment, user-info or whitespace (the URL is a prefix that
 * request paths are appended to). */
static char *parse_upstream_url(const char *s, const char *path, char *err, size_t errlen)
{
    size_t skip;
    if (strncmp(s, "http://", 7) == 0)
        skip = 7;
    else if (strncmp(s, "https://", 8) == 0)
        skip = 8;
    else {
        fail(err, errlen, path, "expected an http:// or https:// URL (got \"%s\")", s);
        return NULL;
    }
    const char *host = s + skip;
    size_t hostlen = strcspn(host, "/");
    if (hostlen == 0 || host[0] == ':') {
        fail(err, errlen, path, "missing host in \"%s\"", s);
        return NULL;
    }
    if (memchr(host, '@', hostlen)) {
        fail(err, errlen, path, "credentials in the URL are not supported (\"%s\")", s);
        return NULL;
    }
    for (const char *p = s; *p; p++) {
        if ((unsigned char)*p <= ' ' || *p == '?' || *p == '#' || *p == 0x7f) {
            fail(err, errlen, path, "URL must not contain spaces, '?' or '#' (\"%s\")", s);
            return NULL;
        }
    }
    size_t len = strlen(s);
    while (len > skip + hostlen && s[len - 1] == '/')
        len--;
    return lg_xcheck(strndup(s, len));
}

static void free_strv(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* ------------------------------------------------------------------------------------- */
/* The schema                                                                            */

typedef enum {
    K_OBJECT, /* a nested object whose members are further specs */
    K_BOOL,   /* bool */
    K_TRI,    /* int: -1 unset, 0 false, 1 true (per-model overrides) */
    K_UINT,   /* an integral number stored in an int/unsigned (size 4) or size_t (size 8) */
    K_DOUBLE, /* double */
    K_OPTNUM, /* double plus a has_* flag at `aux` */
    K_STRING, /* char *, malloc'd; `nullable` allows JSON null (-> NULL) */
    K_ENUM,   /* an int-sized enum spelled by `names` */
    K_CUSTOM, /* `apply` does everything */
} key_kind;

typedef struct key_spec key_spec;

/* How an environment variable's text becomes a JSON value for a key. */
typedef enum {
    ENV_JSON = 0, /* parsed as JSON when it parses, else taken as a string */
    ENV_STRING,   /* a string unless it is JSON null or a JSON string */
    ENV_LIST,     /* JSON array/string, else comma-separated strings */
} env_form;

/* Loading context: the config being built (custom keys may need the whole of it), the
 * message of the failure at hand (err) and, while loading an object, every failure so far
 * (errs; NULL for the flag setters, which apply one value). */
typedef struct load_ctx {
    lg_config *cfg;
    char *err;
    size_t errlen;
    errlist *errs;
} load_ctx;

/* Moves the failure at hand into c->errs. */
static void collect(load_ctx *c)
{
    if (c->errs) errs_add(c->errs, NULL, c->err);
}

typedef int (*apply_fn)(load_ctx *c, void *base, const key_spec *k, const cJSON *v,
                        const char *path);

struct key_spec {
    const char *path; /* dotted, relative to the table's root */
    key_kind kind;
    size_t off;  /* offset of the field from the base */
    size_t size; /* sizeof the field (K_UINT) */
    double min, max;
    const char *const *names; /* K_ENUM */
    apply_fn apply;           /* K_CUSTOM; K_STRING: optional extra check */
    size_t aux;               /* K_OPTNUM: offset of the has_* flag; custom: an argument */
    bool nullable;            /* K_STRING */
    env_form env;             /* how a LOOPGUARD_* value is read */
};

#define C_OBJ(p)                                                                                   \
    {                                                                                              \
        .path = p, .kind = K_OBJECT                                                                \
    }
#define C_BOOL(p, f)                                                                               \
    {                                                                                              \
        .path = p, .kind = K_BOOL, .off = offsetof(lg_config, f)                                   \
    }
#define C_UINT(p, f, lo, hi)                                                                       \
    {                                                                                              \
        .path = p, .kind = K_UINT, .off = offsetof(lg_config, f),                                  \
        .size = sizeof(((lg_config *)0)->f), .min = lo, .max = hi                                  \
    }
#define C_DBL(p, f, lo, hi)                                                                        \
    {                                                                                              \
        .path = p, .kind = K_DOUBLE, .off = offsetof(lg_config, f), .min = lo, .max = hi           \
    }
#define C_ENUM(p, f, n)                                                                            \
    {                                                                                              \
        .path = p, .kind = K_ENUM, .off = offsetof(lg_config, f), .names = n                       \
    }
#define C_STR(p, f, null, chk)                                                                     \
    {                                                                                              \
        .path = p, .kind = K_STRING, .off = offsetof(lg_config, f), .nullable = null,              \
        .apply = chk, .env = ENV_STRING                                                            \
    }
#define C_CUSTOM(p, fn, arg)                                                                       \
    {                                                                                              \
        .path = p, .kind = K_CUSTOM, .apply = fn, .aux = arg                                       \
    }
#define C_LIST(p, fn)                                                                              \
    {                                                                                              \
        .path = p, .kind = K_CUSTOM, .apply = fn, .env = ENV_LIST                                  \
    }

/* The spec whose path is exactly `path` in `table`, or NULL. */
static const key_spec *spec_find(const key_spec *table, const char *path)
{
    for (const key_spec *k = table; k->path; k++)
        if (strcmp(k->path, path) == 0) return k;
    return NULL;
}

/* True when spec path `p` is a direct child of `rel` ("" for the root). */
static bool spec_is_child(const char *p, const char *rel)
{
    size_t n = strlen(rel);
    if (n) {
        if (strncmp(p, rel, n) != 0 || p[n] != '.') return false;
        p += n + 1;
    }
    return strchr(p, '.') == NULL;
}

/* Joins rel + "." + name into out (no dot when rel is empty). A path longer than out (a
 * user's key of hundreds of characters) ends in "..." so that its error message shows the
 * cut; it never names a key of the table, whose paths are short. */
static void path_join(char *out, size_t outlen, const char *rel, const char *name)
{
    int n = snprintf(out, outlen, "%s%s%s", rel, *rel ? "." : "", name);
    if (n >= 0 && (size_t)n >= outlen && outlen >= 4) memcpy(out + outlen - 4, "...", 4);
}

/* ------------------------------------------------------------------------------------- */
/* Applying one value                                                                    */

/* Checks that v is an integral number in [k->min, k->max] and stores it. */
static int apply_uint(load_ctx *c, void *base, const key_spec *k, const cJSON *v, const char *path)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble))
        return fail(c->err, c->errlen, path, "expected a non-negative integer");
    double d = v->valuedouble;
    if (d < k->min || d > k->max)
        return fail(c->err, c->errlen, path, "must be between %.0f and %.0f (got %.0f)", k->min,
                    k->max, d);
    char *p = (char *)base + k->off;
    if (k->size == sizeof(unsigned))
        *(unsigned *)p = (unsigned)d;
    else if (k->size == sizeof(size_t))
        *(size_t *)p = (size_t)d;
    else
        abort(); /* a schema entry with an unsupported field width */
    return 0;
}

static int apply_double(load_ctx *c, const key_spec *k, const cJSON *v, const char *path,
                        double *out)
{
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return fail(c->err, c->errlen, path, "expected a number");
    if (v->valuedouble < k->min || v->valuedouble > k->max)
        return fail(c->err, c->errlen, path, "must be between %g and %g (got %g)", k->min, k->max,
                    v->valuedouble);
    *out = v->valuedouble;
    return 0;
}

static int apply_value(load_ctx *c, void *base, const key_spec *k, const cJSON *v, const char *path)
{
    char *field = (char *)base + k->off;
    switch (k->kind) {
    case K_OBJECT:
        if (!cJSON_IsObject(v)) return fail(c->err, c->errlen, path, "expected an object");
        return 0; /* members are handled by apply_object */
    case K_BOOL:
    case K_TRI:
        if (!cJSON_IsBool(v)) return fail(c->err, c->errlen, path, "expected true or false");
        if (k->kind == K_BOOL)
            *(bool *)field = cJSON_IsTrue(v);
        else
            *(int *)field = cJSON_IsTrue(v) ? 1 : 0;
        return 0;
    case K_UINT:
        return apply_uint(c, base, k, v, path);
    case K_DOUBLE:
        return apply_double(c, k, v, path, (double *)field);
    case K_OPTNUM:
        if (apply_double(c, k, v, path, (double *)field) < 0) return -1;
        *(bool *)((char *)base + k->aux) = true;
        return 0;
    case K_ENUM: {
        int i = cJSON_IsString(v) ? enum_lookup(k->names, v->valuestring) : -1;
        if (i < 0) {
            char list[256];
            enum_list(k->names, list, sizeof list);
            return fail(c->err, c->errlen, path, "expected one of %s", list);
        }
        *(int *)field = i;
        return 0;
    }
    case K_STRING:
        if (cJSON_IsNull(v) && k->nullable) {
            free(*(char **)field);
            *(char **)field = NULL;
            return 0;
        }
        if (!cJSON_IsString(v))
            return fail(c->err, c->errlen, path,
                        k->nullable ? "expected a string or null" : "expected a string");
        if (k->apply && k->apply(c, base, k, v, path) < 0) return -1;
        free(*(char **)field);
        *(char **)field = lg_xstrdup(v->valuestring);
        return 0;
    case K_CUSTOM:
        return k->apply(c, base, k, v, path);
    }
    abort();
}

/* The last component of a spec path. */
static const char *spec_name(const key_spec *k)
{
    const char *name = strrchr(k->path, '.');
    return name ? name + 1 : k->path;
}

/* Reports member `name` of the object at `rel` (reported as `full`) as unknown, naming the
 * key it was probably meant to be. */
static void unknown_key(load_ctx *c, const key_spec *table, const char *rel, const char *name,
                        const char *full)
{
    for (const key_spec *k = table; k->path; k++)
        if (spec_is_child(k->path, rel) && near_miss(name, spec_name(k))) {
            fail(c->err, c->errlen, full, "unknown key (did you mean %.*s%s?)",
                 (int)(strlen(full) - strlen(name)), full, spec_name(k));
            return;
        }
    fail(c->err, c->errlen, full, "unknown key");
}

/* Applies the members of `obj` (the value at table-relative path `rel`, reported as `path`)
 * over `base`. Every member must have a spec and appear once; members are applied in table
 * order. A member that fails is collected and the others are still applied, so that one
 * load reports every bad key. Returns -1 when any member failed. */
static int apply_object(load_ctx *c, void *base, const key_spec *table, const char *rel,
                        const cJSON *obj, const char *path)
{
    char kp[MAX_PATH_LEN], full[MAX_PATH_LEN];
    unsigned before = c->errs ? c->errs->n : 0;
    if (!cJSON_IsObject(obj)) return fail(c->err, c->errlen, path, "expected an object");
    for (const cJSON *m = obj->child; m; m = m->next) {
        path_join(full, sizeof full, path, m->string);
        path_join(kp, sizeof kp, rel, m->string);
        /* A dotted member name ("timeouts.idle_ms" at the top) is not a path shortcut. */
        if (strchr(m->string, '.') || !spec_find(table, kp)) {
            unknown_key(c, table, rel, m->string, full);
            collect(c);
            continue;
        }
        for (const cJSON *d = obj->child; d != m; d = d->next)
            if (strcmp(d->string, m->string) == 0) {
                fail(c->err, c->errlen, full, "duplicate key");
                collect(c);
                break;
            }
    }
    for (const key_spec *k = table; k->path; k++) {
        if (!spec_is_child(k->path, rel)) continue;
        const char *name = spec_name(k);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
        if (!v) continue;
        path_join(full, sizeof full, path, name);
        unsigned n0 = c->errs ? c->errs->n : 0;
        if (apply_value(c, base, k, v, full) < 0 ||
            (k->kind == K_OBJECT && apply_object(c, base, table, k->path, v, full) < 0)) {
            /* A nested object collected its own failures; anything else is at hand. */
            if (!c->errs) return -1;
            if (c->errs->n == n0) collect(c);
        }
    }
    return c->errs && c->errs->n > before ? -1 : 0;
}

/* ------------------------------------------------------------------------------------- */
/* Custom keys                                                                           */

static int apply_listen(load_ctx *c, void *base, const key_spec *k, const cJSON *v,
                        const char *path)
{
    (void)base, (void)k;
    char *host;
    int port;
    if (!cJSON_IsString(v)) return fail(c->err, c->errlen, path, "expected \"HOST:PORT\"");
    if (parse_hostport(v->valuestring, &host, &port, path, c->err, c->errlen) < 0) return -1;
    free(c->cfg->listen_host);
    c->cfg->listen_host = host;
    c->cfg->listen_port = port;
    return 0;
}

/* `upstream`: a URL string or a non-empty array of them; replaces the previous list. */
static int apply_upstream(load_ctx *c, void *base, const key_spec *k, const cJSON *v,
                          const char *path)
{
    (void)base, (void)k;
    char ip[MAX_PATH_LEN];
    bool one = cJSON_IsString(v);
    if (!one && !cJSON_IsArray(v))
        return fail(c->err, c->errlen, path, "expected a URL or an array of URLs");
    size_t n = one ? 1 : (size_t)cJSON_GetArraySize(v);
    if (n == 0) return fail(c->err, c->errlen, path, "needs at least one URL");
    if (n > MAX_UPSTREAMS) return fail(c->err, c->errlen, path, "at most %d URLs", MAX_UPSTREAMS);
    char **urls = lg_xcalloc(n, sizeof *urls);
    size_t i = 0;
    for (const cJSON *e = one ? v : v->child; i < n; e = e->next, i++) {
        if (one)
            snprintf(ip, sizeof ip, "%s", path);
        else
            snprintf(ip, sizeof ip, "%s[%zu]", path, i);
        if (!cJSON_IsString(e)) {
            fail(c->err, c->errlen, ip, "expected a URL string");
            goto error;
        }
        if (!(urls[i] = parse_upstream_url(e->valuestring, ip, c->err, c->errlen))) goto error;
    }
    free_strv(c->cfg->upstreams, c->cfg->n_upstreams);
    c->cfg->upstreams = urls;
    c->cfg->n_upstreams = n;
    return 0;
error:
    free_strv(urls, n);
    return -1;
}

/* `guard.<channel>`: the guard engineer's settings object, applied over the current ones. */
static int apply_guard_channel(load_ctx *c, void *base, const key_spec *k, const cJSON *v,
                               const char *path)
{
    (void)base;
    if (!cJSON_IsObject(v)) return fail(c->err, c->errlen, path, "expected an object");
    return guard_params_apply_json(c->cfg->guard.channel[k->aux], v, path, c->err, c->errlen);
}

static int apply_model_pattern(load_ctx *c, void *base, const key_spec *k, const cJSON *v,
                               const char *path)
{
    (void)k;
    lg_model_rule *r = base;
    int code;
    PCRE2_SIZE off;
    if (!cJSON_IsString(v) || !v->valuestring[0])
        return fail(c->err, c->errlen, path, "expected a non-empty regular expression");
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)v->valuestring, PCRE2_ZERO_TERMINATED, PCRE2_UTF,
                                   &code, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        return fail(c->err, c->errlen, path, "invalid regular expression at offset %zu: %s",
                    (size_t)off, (const char *)msg);
    }
    /* JIT makes a match a few hundred ns; without JIT support it silently stays interpreted. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    pcre2_code_free(r->re);
    free(r->pattern);
    r->re = re;
    r->pattern = lg_xstrdup(v->valuestring);
    return 0;
}

/* `models[i].guard`: {reasoning, content, tool_args}; each object applies over a copy of
 * the global settings for that channel as they stand when `models` is read. */
static int apply_model_guard(load_ctx *c, void *base, const key_spec *k, const cJSON *v,
                             const char *path)
{
    (void)k;
    lg_model_rule *r = base;
    char full[MAX_PATH_LEN];
    if (!cJSON_IsObject(v)) return fail(c->err, c->errlen, path, "expected an object");
    for (const cJSON *m = v->child; m; m = m->next) {
        path_join(full, sizeof full, path, m->string);
        int ch = enum_lookup(channel_keys, m->string);
        if (ch < 0) return fail(c->err, c->errlen, full, "unknown key");
        if (r->guard[ch]) return fail(c->err, c->errlen, full, "duplicate key");
        if (!cJSON_IsObject(m)) return fail(c->err, c->errlen, full, "expected an object");
        r->guard[ch] = guard_params_clone(c->cfg->guard.channel[ch]);
        if (guard_params_apply_json(r->guard[ch], m, full, c->err, c->errlen) < 0) return -1;
    }
    return 0;
}

/* One element of `models`. */
static const key_spec model_keys[] = {
    C_CUSTOM("pattern", apply_model_pattern, 0),
    {.path = "guard_enabled", .kind = K_TRI, .off = offsetof(lg_model_rule, guard_enabled)},
    {.path = "think_opened", .kind = K_TRI, .off = offsetof(lg_model_rule, think_opened)},
    C_CUSTOM("guard", apply_model_guard, 0),
    {0},
};

static void model_rules_free(lg_model_rule *rules, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(rules[i].pattern);
        pcre2_code_free(rules[i].re);
        for (int ch = 0; ch < LG_CH_COUNT; ch++)
            guard_params_free(rules[i].guard[ch]);
    }
    free(rules);
}

/* Applies a JSON array of objects: each element gets `init`, then `table` applied over it;
 * `required` (if any) must be present. On success *out and *n_out are replaced (the old array
 * is freed with `release`). */
typedef struct array_kind {
    size_t elem_size, max;
    const key_spec *table;
    const char *required;
    void (*init)(void *elem); /* NULL: the zeroed element is the starting point */
    void (*release)(void *elems, size_t n);
} array_kind;

static int apply_array_of_objects(load_ctx *c, const array_kind *ak, const cJSON *v,
                                  const char *path, void **out, size_t *n_out)
{
    char ip[MAX_PATH_LEN];
    if (!cJSON_IsArray(v)) return fail(c->err, c->errlen, path, "expected an array");
    size_t n = (size_t)cJSON_GetArraySize(v);
    if (n > ak->max) return fail(c->err, c->errlen, path, "at most %zu entries", ak->max);
    char *elems = lg_xcalloc(n, ak->elem_size);
    size_t i = 0;
    for (const cJSON *e = v->child; e; e = e->next, i++) {
        void *el = elems + i * ak->elem_size;
        snprintf(ip, sizeof ip, "%s[%zu]", path, i);
        if (ak->init) ak->init(el);
        if (apply_object(c, el, ak->table, "", e, ip) < 0) goto error;
        if (ak->required && !cJSON_GetObjectItemCaseSensitive(e, ak->required)) {
            char full[MAX_PATH_LEN];
            path_join(full, sizeof full, ip, ak->required);
            fail(c->err, c->errlen, full, "required");
            goto error;
        }
    }
    ak->release(*out, *n_out);
    *out = elems;
    *n_out = n;
    return 0;
error:
    ak->release(elems, i + 1);
    return -1;
}

static void model_rule_init(void *p)
{
    lg_model_rule *r = p;
    r->guard_enabled = -1;
    r->think_opened = -1;
}

static void model_rules_release(void *p, size_t n)
{
    model_rules_free(p, n);
}

static int apply_models(load_ctx *c, void *base, const key_spec *k, const cJSON *v,
                        const char *path)
{
    (void)base, (void)k;
    static const array_kind ak = {sizeof(lg_model_rule), MAX_MODELS,         model_keys, "pattern",
                                  model_rule_init,       model_rules_release};
    return apply_array_of_objects(c, &ak, v, path, (void **)&c->cfg->models, &c->cfg->n_models);
}

/* One rung of `retry.ladder`. Penalty ranges are the OpenAI API's; repetition_penalty is
 * multiplicative (SGLang/vLLM), 1.0 meaning none. */
#define STEP_OPT(p, f, lo, hi)                                                                     \
    {                                                                                              \
        .path = #p, .kind = K_OPTNUM, .off = offsetof(lg_sampling_step, p), .min = lo, .max = hi,  \
        .aux = offsetof(lg_sampling_step, f)                                                       \
    }
static const key_spec step_keys[] = {
    {.path = "temperature_add",
     .kind = K_DOUBLE,
     .off = offsetof(lg_sampling_step, temperature_add),
     .min = -2.0,
     .max = 2.0},
    STEP_OPT(presence_penalty, has_presence_penalty, -2.0, 2.0),
    STEP_OPT(frequency_penalty, has_frequency_penalty, -2.0, 2.0),
    STEP_OPT(repetition_penalty, has_repetition_penalty, 0.01, 2.0),
    {.path = "new_seed", .kind = K_BOOL, .off = offsetof(lg_sampling_step, new_seed)},
    {0},
};

static void steps_release(void *p, size_t n)
{
    (void)n;
    free(p);
}

static int apply_ladder(load_ctx *c, void *base, const key_spec *k, const cJSON *v,
                        const char *path)
{
    (void)base, (void)k;
    /* A zeroed step changes nothing: no penalties, same seed. */
    static const array_kind ak = {
        sizeof(lg_sampling_step), MAX_LADDER, step_keys, NULL, NULL, steps_release};
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0)
        return fail(c->err, c->errlen, path, "needs at least one step");
    return apply_array_of_objects(c, &ak, v, path, (void **)&c->cfg->retry.ladder,
                                  &c->cfg->retry.n_ladder);
}

/* Replaces *dst (n_dst entries) with the array of non-empty strings `v` (at most `max`).
 * With `paths`, each must start with '/' or be "*". */
static int apply_string_list(load_ctx *c, const cJSON *v, const char *path, size_t max, bool paths,
                             char ***dst, size_t *n_dst)
{
    char ip[MAX_PATH_LEN];
    if (!cJSON_IsArray(v)) return fail(c->err, c->errlen, path, "expected an array of strings");
    size_t n = (size_t)cJSON_GetArraySize(v), i = 0;
    if (n > max) return fail(c->err, c->errlen, path, "at most %zu entries", max);
    char **strs = lg_xcalloc(n, sizeof *strs);
    for (const cJSON *e = v->child; e; e = e->next, i++) {
        snprintf(ip, sizeof ip, "%s[%zu]", path, i);
        if (!cJSON_IsString(e) || !e->valuestring[0]) {
            free_strv(strs, n);
            return fail(c->err, c->errlen, ip, "expected a non-empty string");
        }
        if (paths && e->valuestring[0] != '/' && strcmp(e->valuestring, "*") != 0) {
            free_strv(strs, n);
            return fail(c->err, c->errlen, ip, "expected a path starting with '/' (or \"*\")");
        }
        strs[i] = lg_xstrdup(e->valuestring);
    }
    free_strv(*dst, *n_dst);
    *dst = n ? strs : NULL;
    *n_dst = n;
    if (!n) free(strs);
    return 0;
}

static int apply_api_keys(load_ctx *c, void *base, const key_spec *k, const cJSON *v,
                          const char *path)
{
    (void)base, (void)k;
    return apply_string_list(c, v, path, MAX_API_KEYS, false, &c->cfg->api_keys,
                             &c->cfg->n_api_keys);
}

static int apply_passthrough_allow(load_ctx *c, void *base, const key_spec *k, const cJSON *v,
                                   const char *path)
{
    (void)base, (void)k;
    return apply_string_list(c, v, path, MAX_API_KEYS, true, &c->cfg->passthrough.allow,
                             &c->cfg->passthrough.n_allow);
}

static int check_hostport(load_ctx *c, void *base, const key_spec *k, const cJSON *v,
                          const char *path)
{
    (void)base, (void)k;
    char *host;
    int port;
    if (parse_hostport(v->valuestring, &host, &port, path, c->err, c->errlen) < 0) return -1;
    free(host);
    return 0;
}

static int check_abs_path(load_ctx *c, void *base, const key_spec *k, const cJSON *v,
                          const char *path)
{
    (void)base, (void)k;
    const char *s = v->valuestring;
    if (s[0] != '/' || strpbrk(s, " \t\r\n?#"))
        return fail(c->err, c->errlen, path, "expected a path starting with '/'");
    return 0;
}

static int check_nonempty(load_ctx *c, void *base, const key_spec *k, const cJSON *v,
                          const char *path)
{
    (void)base, (void)k;
    if (!v->valuestring[0]) return fail(c->err, c->errlen, path, "must not be empty");
    return 0;
}

/* ------------------------------------------------------------------------------------- */
/* The schema of the config file                                                        */

#define MS_HOUR 3600000.0
#define MS_DAY  86400000.0

/* Top-level keys. Order matters: members of an object are applied in table order, so the
 * global guard settings are in place before `models` clones them. */
static const key_spec config_keys[] = {
    {.path = "listen", .kind = K_CUSTOM, .apply = apply_listen, .env = ENV_STRING},
    C_LIST("upstream", apply_upstream),
    C_ENUM("upstream_kind", upstream_kind, upstream_kind_names),
    C_UINT("workers", workers, 0, 1024),
    C_ENUM("worker_scheduling", worker_scheduling, scheduling_names),
    C_UINT("max_connections", max_connections, 1, 1000000),
    C_UINT("rlimit_nofile", rlimit_nofile, 0, 1 << 24),
    C_UINT("max_body_bytes", max_body_bytes, 1024, 4294967296.0),
    C_UINT("max_header_bytes", max_header_bytes, 4096, 16 << 20),
    C_UINT("client_timeout_s", client_timeout_s, 1, 86400),
    C_UINT("shutdown_grace_ms", shutdown_grace_ms, 0, MS_HOUR),
    C_OBJ("timeouts"),
    C_UINT("timeouts.connect_ms", timeouts.connect_ms, 1, MS_HOUR),
    C_UINT("timeouts.first_byte_ms", timeouts.first_byte_ms, 1, MS_DAY),
    C_UINT("timeouts.idle_ms", timeouts.idle_ms, 1, MS_DAY),
    C_OBJ("reasoning"),
    C_ENUM("reasoning.output", reasoning.output, reasoning_output_names),
    C_BOOL("reasoning.allow_client_choice", reasoning.allow_client_choice),
    C_ENUM("reasoning.history", reasoning.history, history_names),
    C_OBJ("guard"),
    C_BOOL("guard.enabled", guard.enabled),
    C_BOOL("guard.allow_client_off", guard.allow_client_off),
    C_UINT("guard.holdback_max_bytes", guard.holdback_max_bytes, 0, 64 << 20),
    C_UINT("guard.keepalive_ms", guard.keepalive_ms, 100, MS_HOUR),
    C_CUSTOM("guard.reasoning", apply_guard_channel, LG_CH_REASONING),
    C_CUSTOM("guard.content", apply_guard_channel, LG_CH_CONTENT),
    C_CUSTOM("guard.tool_args", apply_guard_channel, LG_CH_TOOL_ARGS),
    C_CUSTOM("models", apply_models, 0),
    C_OBJ("retry"),
    C_UINT("retry.max_attempts", retry.max_attempts, 1, 10),
    C_ENUM("retry.mode", retry.mode, retry_mode_names),
    C_ENUM("retry.on_exhausted", retry.on_exhausted, exhausted_names),
    C_ENUM("retry.elsewhere", retry.elsewhere, elsewhere_names),
    C_CUSTOM("retry.ladder", apply_ladder, 0),
    C_OBJ("incidents"),
    C_STR("incidents.path", incidents.path, true, check_nonempty),
    C_ENUM("incidents.capture", incidents.capture, capture_names),
    C_UINT("incidents.max_record_bytes", incidents.max_record_bytes, 1024, 64 << 20),
    C_UINT("incidents.recent", incidents.recent, 0, 100000),
    C_OBJ("admin"),
    C_STR("admin.listen", admin.listen, true, check_hostport),
    C_STR("admin.token", admin.token, true, check_nonempty),
    C_LIST("api_keys", apply_api_keys),
    C_OBJ("limits"),
    C_UINT("limits.header_timeout_ms", limits.header_timeout_ms, 0, MS_HOUR),
    C_UINT("limits.body_timeout_ms", limits.body_timeout_ms, 0, MS_HOUR),
    C_UINT("limits.body_min_rate", limits.body_min_rate, 0, 1 << 30),
    C_UINT("limits.max_conns_per_ip", limits.max_conns_per_ip, 0, 1000000),
    C_UINT("limits.max_json_nodes", limits.max_json_nodes, 16, 100000000),
    C_UINT("limits.max_json_depth", limits.max_json_depth, 2, 1000),
    C_OBJ("passthrough"),
    C_LIST("passthrough.allow", apply_passthrough_allow),
    C_OBJ("health"),
    C_STR("health.path", health.path, false, check_abs_path),
    C_UINT("health.interval_ms", health.interval_ms, 100, MS_HOUR),
    C_UINT("health.unhealthy_after", health.unhealthy_after, 1, 100),
    C_UINT("health.healthy_after", health.healthy_after, 1, 100),
    C_OBJ("eject"),
    C_DBL("eject.trip_ratio", eject.trip_ratio, 1.0, 1000.0),
    C_DBL("eject.min_trip_rate", eject.min_trip_rate, 0.0, 1.0),
    C_UINT("eject.min_requests", eject.min_requests, 1, 1000000),
    C_UINT("eject.window_s", eject.window_s, 1, 86400),
    C_UINT("eject.backoff_ms", eject.backoff_ms, 100, MS_DAY),
    C_OBJ("log"),
    C_STR("log.access", log.access, true, check_nonempty),
    {0},
};

/* ------------------------------------------------------------------------------------- */
/* Defaults, loading                                                                     */

lg_config *config_new_defaults(void)
{
    lg_config *cfg = lg_xcalloc(1, sizeof *cfg);
    cfg->listen_host = lg_xstrdup("127.0.0.1");
    cfg->listen_port = 8000;
    cfg->upstreams = lg_xcalloc(1, sizeof *cfg->upstreams);
    cfg->upstreams[0] = lg_xstrdup("http://127.0.0.1:30000");
    cfg->n_upstreams = 1;
    cfg->upstream_kind = LG_UPSTREAM_AUTO;
    cfg->workers = 0;
    cfg->worker_scheduling = LG_SCHED_BATCH;
    cfg->max_connections = 16384;
    cfg->rlimit_nofile = 65536;
    cfg->max_body_bytes = 32u << 20;
    cfg->max_header_bytes = 16u << 10; /* libmicrohttpd keeps (and clears) it per connection */
    cfg->client_timeout_s = 60;
    cfg->limits.header_timeout_ms = 10000;
    cfg->limits.body_timeout_ms = 20000;
    cfg->limits.body_min_rate = 500;
    cfg->limits.max_conns_per_ip = 256;
    cfg->limits.max_json_nodes = 200000;
    cfg->limits.max_json_depth = 64;
    cfg->shutdown_grace_ms = 10000;
    cfg->timeouts.connect_ms = 5000;
    cfg->timeouts.first_byte_ms = 120000;
    cfg->timeouts.idle_ms = 60000;
    cfg->reasoning.output = LG_REASONING_CONTENT;
    cfg->reasoning.allow_client_choice = true;
    cfg->reasoning.history = LG_HISTORY_REWRITE;
    cfg->guard.enabled = true;
    cfg->guard.allow_client_off = false;
    for (int ch = 0; ch < LG_CH_COUNT; ch++)
        cfg->guard.channel[ch] = guard_params_new((lg_channel)ch);
    cfg->guard.holdback_max_bytes = 16384;
    cfg->guard.keepalive_ms = 5000;
    cfg->retry.max_attempts = 3;
    cfg->retry.mode = LG_RETRY_AUTO;
    cfg->retry.on_exhausted = LG_EXHAUSTED_CONTENT_FILTER;
    cfg->retry.elsewhere = LG_ELSEWHERE_AUTO;
    /* Whisper's temperature fallback (+0.2 per step) and Qwen's advice to raise
     * presence_penalty (1.0, then 1.5) against endless repetition, each with a fresh seed. */
    cfg->retry.ladder = lg_xcalloc(2, sizeof *cfg->retry.ladder);
    cfg->retry.n_ladder = 2;
    cfg->retry.ladder[0] = (lg_sampling_step){.temperature_add = 0.2,
                                              .has_presence_penalty = true,
                                              .presence_penalty = 1.0,
                                              .new_seed = true};
    cfg->retry.ladder[1] = (lg_sampling_step){.temperature_add = 0.4,
                                              .has_presence_penalty = true,
                                              .presence_penalty = 1.5,
                                              .has_repetition_penalty = true,
                                              .repetition_penalty = 1.1,
                                              .new_seed = true};
    cfg->incidents.path = NULL;
    cfg->incidents.capture = LG_CAPTURE_EXCERPT;
    cfg->incidents.max_record_bytes = 65536;
    cfg->incidents.recent = 100;
    cfg->health.path = lg_xstrdup("/health");
    cfg->health.interval_ms = 5000;
    cfg->health.unhealthy_after = 2;
    cfg->health.healthy_after = 2;
    cfg->eject.trip_ratio = 3.0;
    cfg->eject.min_trip_rate = 0.5;
    cfg->eject.min_requests = 10;
    cfg->eject.window_s = 60;
    cfg->eject.backoff_ms = 30000;
    return cfg;
}

/* Applies a parsed top-level object; err gets every failure, one per line. */
static int apply_root(lg_config *cfg, const cJSON *root, char *err, size_t errlen)
{
    if (!cJSON_IsObject(root)) {
        snprintf(err, errlen, "expected a JSON object at the top level");
        return -1;
    }
    char one[2 * MAX_PATH_LEN];
    errlist errs = {0};
    load_ctx c = {cfg, one, sizeof one, &errs};
    apply_object(&c, cfg, config_keys, "", root, "");
    return errs_finish(&errs, err, errlen);
}

int config_load_string(lg_config *cfg, const char *json, char *err, size_t errlen)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, true);
    if (!root) {
        unsigned line = 1, col = 1;
        for (const char *p = json; end && p < end; p++, col++)
            if (*p == '\n') line++, col = 0;
        snprintf(err, errlen, "invalid JSON at line %u, column %u", line, col);
        return -1;
    }
    int rc = apply_root(cfg, root, err, errlen);
    cJSON_Delete(root);
    return rc;
}

/* Reads a whole file into a malloc'd NUL-terminated buffer; NULL with err on failure. */
static char *read_file(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (!f) {
        snprintf(err, errlen, "cannot open: %s", strerror(errno));
        return NULL;
    }
    for (;;) {
        if (cap - len < 4096) {
            cap = cap ? cap * 2 : 8192;
            if (cap > MAX_FILE_BYTES + 8192) {
                snprintf(err, errlen, "larger than %u bytes", MAX_FILE_BYTES);
                goto error;
            }
            buf = lg_xrealloc(buf, cap);
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0) break;
    }
    if (ferror(f)) {
        snprintf(err, errlen, "read error: %s", strerror(errno));
        goto error;
    }
    if (memchr(buf, '\0', len)) {
        snprintf(err, errlen, "contains a NUL byte");
        goto error;
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
error:
    fclose(f);
    free(buf);
    return NULL;
}

int config_load_file(lg_config *cfg, const char *path, char *err, size_t errlen)
{
    char *text = read_file(path, err, errlen);
    int rc = text ? config_load_string(cfg, text, err, errlen) : -1;
    if (rc < 0) { /* every line names the file */
        errlist e = {0};
        errs_add(&e, path, err);
        errs_finish(&e, err, errlen);
    }
    free(text);
    return rc;
}

/* ------------------------------------------------------------------------------------- */
/* Environment and flags                                                                 */

/* A JSON value for a list-valued key written as text: "a,b" -> ["a","b"], "a" -> "a". */
static cJSON *split_list(const char *s)
{
    if (!strchr(s, ',')) return cJSON_CreateString(s);
    cJSON *arr = cJSON_CreateArray();
    for (const char *p = s;; p++) {
        size_t n = strcspn(p, ",");
        char *item = strndup(p, n);
        if (!item || !arr) lg_oom(n + 1);
        cJSON_AddItemToArray(arr, cJSON_CreateString(item));
        free(item);
        p += n;
        if (!*p) break;
    }
    return arr;
}

/* The JSON value for the text of a variable whose key has form `form`. Never NULL. */
static cJSON *env_value(env_form form, const char *text)
{
    cJSON *j = cJSON_ParseWithOpts(text, NULL, true);
    bool keep = j != NULL;
    if (j && form == ENV_STRING) keep = cJSON_IsString(j) || cJSON_IsNull(j);
    if (j && form == ENV_LIST) keep = cJSON_IsString(j) || cJSON_IsArray(j);
    if (keep) return j;
    cJSON_Delete(j);
    j = form == ENV_LIST ? split_list(text) : cJSON_CreateString(text);
    if (!j) lg_oom(0);
    return j;
}

#define ENV_PREFIX "LOOPGUARD_"

static int env_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Writes the variable for spec path `path` ("retry.max_attempts" ->
 * "LOOPGUARD_RETRY__MAX_ATTEMPTS") into out. */
static void env_name(char *out, size_t outlen, const char *path)
{
    size_t n = (size_t)snprintf(out, outlen, "%s", ENV_PREFIX);
    for (const char *p = path; *p && n + 2 < outlen; p++) {
        if (*p == '.') out[n++] = '_';
        out[n++] = *p == '.' ? '_' : (char)toupper((unsigned char)*p);
    }
    out[n < outlen ? n : outlen - 1] = '\0';
}

/* Reports a LOOPGUARD_* variable that names no key (its key path `path`), naming the
 * variable it was probably meant to be. */
static int unknown_variable(const char *path, char *err, size_t errlen)
{
    for (const key_spec *k = config_keys; k->path; k++)
        if (near_miss(path, k->path)) {
            char want[MAX_PATH_LEN];
            env_name(want, sizeof want, k->path);
            snprintf(err, errlen, "no such setting (did you mean %s?)", want);
            return -1;
        }
    snprintf(err, errlen, "no such setting (every LOOPGUARD_* variable is read as a key path)");
    return -1;
}

/* True when text, after leading blanks, opens a JSON object, array or string: the operator
 * meant JSON, and a parse failure is worth reporting as such. */
static bool looks_like_json(const char *text)
{
    text += strspn(text, " \t\r\n");
    return *text == '{' || *text == '[' || *text == '"';
}

/* Applies one "LOOPGUARD_A__B=V" variable. Returns 0 or -1 with err (one failure per line).
 * A variable whose key path names no key is an error like an unknown key in a file. */
static int apply_env_var(lg_config *cfg, const char *var, char *err, size_t errlen)
{
    const char *eq = strchr(var, '=');
    const char *name = var + strlen(ENV_PREFIX);
    char path[MAX_PATH_LEN], first[MAX_PATH_LEN];
    size_t n = 0;
    if (!eq) eq = name + strlen(name);
    if ((size_t)(eq - name) >= sizeof path) {
        snprintf(err, errlen, "name too long");
        return -1;
    }
    /* LOOPGUARD_RETRY__MAX_ATTEMPTS -> retry.max_attempts */
    for (const char *p = name; p < eq; p++) {
        if (p[0] == '_' && p + 1 < eq && p[1] == '_') {
            path[n++] = '.';
            p++;
        } else
            path[n++] = (char)tolower((unsigned char)*p);
    }
    path[n] = '\0';
    size_t flen = strcspn(path, ".");
    snprintf(first, sizeof first, "%.*s", (int)flen, path);
    if (!flen || !spec_find(config_keys, first)) return unknown_variable(path, err, errlen);

    /* Build {"a":{"b":value}} and apply it like a file. */
    const key_spec *k = spec_find(config_keys, path);
    env_form form = k ? k->env : ENV_JSON;
    if (form != ENV_STRING && *eq && looks_like_json(eq + 1)) {
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithOpts(eq + 1, &end, true);
        cJSON_Delete(j);
        if (!j) {
            snprintf(err, errlen, "%s: invalid JSON at character %td of the value", path,
                     (end ? end - (eq + 1) : 0) + 1);
            return -1;
        }
    }
    cJSON *root = cJSON_CreateObject(), *obj = root;
    if (!root) lg_oom(0);
    char *comp = path;
    for (char *dot; (dot = strchr(comp, '.')); comp = dot + 1) {
        *dot = '\0';
        cJSON *child = cJSON_AddObjectToObject(obj, comp);
        if (!child) lg_oom(0);
        obj = child;
    }
    cJSON_AddItemToObject(obj, comp, env_value(form, *eq ? eq + 1 : ""));
    int rc = apply_root(cfg, root, err, errlen);
    cJSON_Delete(root);
    return rc;
}

int config_apply_env(lg_config *cfg, char *const *envp, char *err, size_t errlen)
{
    size_t n = 0, m = 0;
    errlist errs = {0};
    for (size_t i = 0; envp && envp[i]; i++)
        n += strncmp(envp[i], ENV_PREFIX, strlen(ENV_PREFIX)) == 0;
    if (!n) return 0;
    /* Sorted, so that LOOPGUARD_GUARD applies before LOOPGUARD_GUARD__ENABLED whatever the
     * order of the environment. */
    char **vars = lg_xcalloc(n, sizeof *vars);
    for (size_t i = 0; envp[i]; i++)
        if (strncmp(envp[i], ENV_PREFIX, strlen(ENV_PREFIX)) == 0) vars[m++] = envp[i];
    qsort(vars, m, sizeof *vars, env_cmp);
    for (size_t i = 0; i < m; i++) {
        char one[4 * MAX_PATH_LEN] = "";
        if (apply_env_var(cfg, vars[i], one, sizeof one) < 0) {
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)strcspn(vars[i], "="), vars[i]);
            errs_add(&errs, name, one);
        }
    }
    free(vars);
    return errs_finish(&errs, err, errlen);
}

int config_set_listen(lg_config *cfg, const char *hostport, char *err, size_t errlen)
{
    char *host;
    int port;
    if (parse_hostport(hostport, &host, &port, "--listen", err, errlen) < 0) return -1;
    free(cfg->listen_host);
    cfg->listen_host = host;
    cfg->listen_port = port;
    return 0;
}

int config_set_upstream(lg_config *cfg, const char *url, char *err, size_t errlen)
{
    load_ctx c = {cfg, err, errlen, NULL};
    cJSON *v = split_list(url);
    int rc = apply_upstream(&c, cfg, NULL, v, "--upstream");
    cJSON_Delete(v);
    return rc;
}

int config_set_upstream_kind(lg_config *cfg, const char *kind, char *err, size_t errlen)
{
    int i = enum_lookup(upstream_kind_names, kind);
    if (i < 0) return fail(err, errlen, "--upstream-kind", "expected auto, sglang, vllm or openai");
    cfg->upstream_kind = (lg_upstream_kind)i;
    return 0;
}

/* ------------------------------------------------------------------------------------- */
/* Validation and queries                                                                */

int config_validate(const lg_config *cfg, char *err, size_t errlen)
{
    if (cfg->n_upstreams == 0) return fail(err, errlen, "upstream", "needs at least one URL");
    for (size_t i = 0; i < cfg->n_upstreams; i++)
        for (size_t j = 0; j < i; j++)
            if (strcmp(cfg->upstreams[i], cfg->upstreams[j]) == 0)
                return fail(err, errlen, "upstream", "\"%s\" is listed twice", cfg->upstreams[i]);
    if (cfg->retry.max_attempts > 1 && cfg->retry.n_ladder == 0)
        return fail(err, errlen, "retry.ladder", "needs at least one step when retrying");
    if (cfg->admin.listen && cfg->listen_port != 0) {
        char *host;
        int port;
        if (parse_hostport(cfg->admin.listen, &host, &port, "admin.listen", err, errlen) < 0)
            return -1;
        bool same = port == cfg->listen_port && strcmp(host, cfg->listen_host) == 0;
        free(host);
        if (same) return fail(err, errlen, "admin.listen", "must differ from listen");
    }
    return 0;
}

const lg_model_rule *config_model_rule(const lg_config *cfg, const char *model)
{
    if (!model || cfg->n_models == 0) return NULL;
    /* One ovector pair is enough to learn whether it matched; a match data per call keeps
     * this thread-safe (cost: one small malloc per lookup). */
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    const lg_model_rule *found = NULL;
    if (!md) lg_oom(0);
    for (size_t i = 0; i < cfg->n_models && !found; i++)
        if (pcre2_match(cfg->models[i].re, (PCRE2_SPTR)model, PCRE2_ZERO_TERMINATED, 0, 0, md,
                        NULL) >= 0)
            found = &cfg->models[i];
    pcre2_match_data_free(md);
    return found;
}

const guard_params *config_guard_params(const lg_config *cfg, const lg_model_rule *rule,
                                        lg_channel ch)
{
    if (rule && rule->guard[ch]) return rule->guard[ch];
    return cfg->guard.channel[ch];
}

void config_free(lg_config *cfg)
{
    if (!cfg) return;
    free(cfg->listen_host);
    free_strv(cfg->upstreams, cfg->n_upstreams);
    for (int ch = 0; ch < LG_CH_COUNT; ch++)
        guard_params_free(cfg->guard.channel[ch]);
    model_rules_free(cfg->models, cfg->n_models);
    free(cfg->retry.ladder);
    free(cfg->incidents.path);
    free(cfg->admin.listen);
    free(cfg->admin.token);
    free(cfg->log.access);
    free_strv(cfg->api_keys, cfg->n_api_keys);
    free_strv(cfg->passthrough.allow, cfg->passthrough.n_allow);
    free(cfg->health.path);
    free(cfg);
}
