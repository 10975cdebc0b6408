/* sse.h — a server-sent-events parser (WHATWG HTML "event stream" interpretation).
 *
 * The proxy reads its upstream's token stream through this parser. It accepts bytes as
 * they arrive, in any split (an event, a line, a CR LF pair or the leading BOM may be cut
 * anywhere), and calls back once per dispatched event with the parsed fields AND the exact
 * upstream bytes that made up the event, so a clean stream can be forwarded byte-for-byte.
 *
 * Parsing follows the spec: lines end in CR LF, LF or CR; a line starting with ':' is a
 * comment; "name:value" (one leading space of the value dropped) or a bare "name" (empty
 * value); fields data (appended, joined with LF), event, id (ignored when it contains NUL;
 * persists across events like the spec's last-event-ID buffer), retry (ASCII digits only);
 * other field names are ignored, so garbage lines are survived. A blank line dispatches the
 * event; with an empty data buffer nothing is dispatched (its bytes go into the next
 * event's raw). A leading UTF-8 BOM is skipped for parsing and kept in raw. An incomplete
 * event at end of stream is never dispatched (see sse_parser_pending).
 *
 * Raw boundaries: an event's raw runs from the end of the previous dispatched event (or
 * the stream start) through the line ending of the blank line that dispatched it, so
 * forwarding each raw reproduces the stream. When that line ending is a CR that is the
 * last byte read so far, the parser looks at the stream's previous CR: if it began a
 * CR LF pair (or there was none), the event waits for the next byte so its raw ends in the
 * whole CR LF; if the stream ends lines in bare CRs, the event is dispatched at once and
 * an LF arriving next (a mixed stream) becomes the first byte of the next event's raw.
 * Either way the concatenation of all raws followed by the pending bytes equals the
 * input exactly. At end of stream call sse_parser_finish to dispatch an event whose CR
 * was the very last byte. */
#ifndef LG_SSE_H
#define LG_SSE_H

#include <stdbool.h>
#include <stddef.h>

#include "proxy/buf.h"

/* Returned by sse_parser_feed when the pending event exceeds max_event_bytes. The parser
 * is then dead: every later feed returns it again. Callbacks that want to stop feeding
 * should return a positive value so the two cannot be confused. */
#define SSE_ERR_TOO_BIG (-7001)

/* Default max_event_bytes: 1 MiB. */
#define SSE_DEFAULT_MAX_EVENT (1u << 20)

/* One dispatched event. Every pointer is valid only during the callback. */
typedef struct sse_event {
    const char *data; /* joined data lines (may contain NULs); not NUL-terminated */
    size_t data_len;
    const char *event; /* "" when absent */
    size_t event_len;
    const char *id; /* the last event ID (persists across events), "" when none yet */
    size_t id_len;
    bool has_id;     /* an id field appeared in this event's lines */
    long retry;      /* the retry field of this event's lines, -1 when absent */
    const char *raw; /* the exact upstream bytes of this event (see above) */
    size_t raw_len;
    bool vouched; /* the parser's vouch (sse_parser_vouch) accepted data, just before */
} sse_event;

/* Called once per dispatched event. Nonzero stops feeding: sse_parser_feed returns it. */
typedef int (*sse_event_fn)(void *ud, const sse_event *ev);

/* An owner's proof that data[0..len) holds neither CR nor LF (sse_parser_vouch). */
typedef bool (*sse_vouch_fn)(void *ud, const char *data, size_t len);

/* The parser's state: its fields are sse.c's alone. It is declared here so that an owner
 * can hold a parser inside its own state (sse_parser_init / sse_parser_clear), placed on
 * whole cache lines: at a decode pace every line a token touches is a cache miss, and a
 * read of one whole event (the usual read) touches only the first line (`idle`'s path),
 * when the parser starts a 64-byte line. 184 bytes, one byte of padding (after has_id). */
typedef struct sse_parser {
    /* What an idle parser's one-event read touches. */
    sse_event_fn fn;
    void *ud;
    size_t max;
    lg_buf id;          /* the last event ID (persists across events) */
    sse_vouch_fn vouch; /* NULL: none (sse_parser_vouch) */
    bool idle;          /* between events with nothing pending: all below is settled (sse.c) */
    bool bom_checked;   /* the leading BOM question is settled */
    bool skip_lf;       /* the last line ended in a CR at the end of input: an LF next pairs */
    bool dead;          /* SSE_ERR_TOO_BIG was returned */
    bool crlf;          /* the last CR seen ended a CR LF pair (assumed before any CR) */
    bool deferred;      /* a blank line's CR ends the input; waiting for a possible LF */
    bool has_id;
    /* The pending event and the bytes being parsed (sse.c's header note). */
    lg_buf in;
    size_t start, pos, scan;
    lg_buf data, event;
    const char *one; /* the pending event's only data line so far, borrowed (or NULL) */
    size_t one_len;
    long retry;
} sse_parser;

/* A new parser; max_event_bytes 0 means SSE_DEFAULT_MAX_EVENT. The limit counts the raw
 * bytes of one event (comments and empty blocks since the previous event included).
 * Never NULL (aborts on OOM). */
sse_parser *sse_parser_new(size_t max_event_bytes, sse_event_fn fn, void *ud);
/* The same in place, in memory the caller owns (sse_parser_clear releases what it holds).
 * A zeroed parser that was never initialised may be given to sse_parser_finish (nothing
 * is dispatched) and to sse_parser_clear. */
void sse_parser_init(sse_parser *p, size_t max_event_bytes, sse_event_fn fn, void *ud);
/* Sets (or with NULL clears) the parser's vouch: an idle parser reading one whole event of
 * one data line calls it (with its ud) on that line's value before searching the read for
 * CR and LF; true must mean the value holds neither (it is then not searched, and the
 * event is dispatched with `vouched` set, next, so its callback may use what the vouch
 * learned). The value may be no event's data (the read may hold more lines): a vouch that
 * says false must have had no effect the callbacks could see. */
void sse_parser_vouch(sse_parser *p, sse_vouch_fn vouch);

/* Frees what an initialised parser holds and zeroes it. */
void sse_parser_clear(sse_parser *p);

/* Parses len more bytes, calling fn for each complete event. Returns 0 when all input was
 * consumed, the callback's nonzero value when it stopped (the bytes after that event stay
 * buffered and are parsed by the next call; call with len 0 to resume without new input),
 * or SSE_ERR_TOO_BIG. The callback must not call feed or free on the same parser.
 * Cost: O(len) amortised; the pending event is copied at most once per call. */
int sse_parser_feed(sse_parser *p, const char *buf, size_t len);

/* End of stream: dispatches an event still waiting for the LF of its final CR (see
 * above); an incomplete event is not dispatched (per spec). Returns 0 or the callback's
 * value. */
int sse_parser_finish(sse_parser *p);

/* Bytes buffered that belong to no dispatched event yet (an incomplete event, or input
 * left unparsed after a callback stopped the feed). */
size_t sse_parser_pending(const sse_parser *p);

/* The pending bytes themselves (valid until the next feed/free); *len set to their count.
 * Lets a passthrough relay forward a trailing incomplete event at end of stream. */
const char *sse_parser_pending_raw(const sse_parser *p, size_t *len);

/* No-op on NULL. */
void sse_parser_free(sse_parser *p);

#endif
