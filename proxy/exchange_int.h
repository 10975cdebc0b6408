/* exchange_int.h — the guarded exchange's state, shared by its halves and the API modules
 * (api.h) and private to them:
 *
 *   exchange.c         a request's life: the body, the attempts (exchange_plan.c decides
 *                      each one), the incident record, the client side (streamed or whole),
 *                      timeouts;
 *   exchange_events.c  libcurl's callbacks, the guard per channel, the token-run check,
 *                      holdback and release;
 *   api_*.c            one API each: its request, its events to the channels and back.
 *
 * The state is split by lifetime: ex_attempt (one upstream attempt, reset in one place),
 * ex_client (the client side), ex_record (the incident). Memory: everything an exchange
 * owns is freed in one place, exchange.c's ex_destroy (the module's state by api->destroy). */
#ifndef LG_EXCHANGE_INT_H
#define LG_EXCHANGE_INT_H

#include <cJSON.h>

#include "guard/guard.h"
#include "proxy/api.h"
#include "proxy/assemble.h"
#include "proxy/buf.h"
#include "proxy/chunkscan.h"
#include "proxy/dialect.h"
#include "proxy/http.h"
#include "proxy/rewrite.h"
#include "proxy/sse.h"
#include "proxy/think.h"
#include "proxy/upstream.h"
#include "proxy/worker.h"

/* A slow client: the upstream transfer is paused while this much output waits for it. */
#define EX_OUT_HIGH (256 * 1024)
/* Memory `out` keeps once drained: a paced event's worth (its capacity is a power of two,
 * and a chunk of one token is 200-400 bytes). A direct write drains it at every flush and
 * a content reader at its own pace (looked at every tick). A burst (a slow client, a busy
 * host, a saturated upstream) grows it to many KiB, and a stream that kept that capacity
 * between its events held the memory idle: with thousands of streams it is a large part of
 * what a stream costs, while freeing it costs a malloc and a free per burst. */
#define EX_OUT_KEEP 512

/* The same delta text again and again: a model whose logits went bad emits one token
 * (often id 0, "!") forever. The byte-level guard needs many copies of a one-character unit
 * before it may call it a loop (real text has rules of "!" and "=" dozens long), but 32
 * identical consecutive tokens do not occur in real generations. Token boundaries are the
 * exchange's knowledge, not the guard's, so this signal lives here. */
#define RUN_MAX_TOKEN 64
#define RUN_TRIP      32

typedef struct token_run {
    uint32_t len;     /* of the last delta; 0: no run */
    uint32_t count;   /* consecutive deltas equal to it, the channel's last len * count bytes
                       (a run's deltas are contiguous in the channel: ex_think_settle, which
                       moves text between channels, ends the runs) */
    uint64_t head[2]; /* the last delta as token_head packs it: whole when up to 16 bytes */
    char last[RUN_MAX_TOKEN]; /* the whole last delta when it is longer than 16 bytes */
} token_run;

/* One channel of the current attempt: its guard (made when first needed) and the text fed
 * to it but not yet released. Everything but run.last fits the first 64 bytes, and a
 * delta of up to 16 bytes reads and writes only those. */
typedef struct chan {
    guard *g;
    lg_buf held; /* fed to the guard, not yet released */
    uint64_t attempt_bytes;
    token_run run;
} chan;

typedef enum { PHASE_BODY, PHASE_RUNNING, PHASE_DONE } ex_phase;

/* One upstream attempt: everything here lives from start_attempt to the attempt's end and
 * is freed and zeroed in one place, exchange.c's attempt_reset. */
typedef struct ex_attempt {
    /* What each event reads (exchange's layout): the first 64 bytes, head.status included,
     * the parser's first line, then the first line of each channel the event feeds (and
     * of those fed before: `fed`), each channel on lines of its own. */
    think_split *think;
    uint64_t tokens;
    uint64_t last_event_ns;
    /* The channels fed text this attempt, a bit each (1 << lg_channel): a channel whose bit
     * is clear holds nothing and has no attempt_bytes (ex_chan_fed), so a token of one
     * channel reads no other channel's lines. Set wherever held or attempt_bytes may grow
     * (ex_guard_text_run, ex_sample_swap, ex_think_settle), cleared with the attempt. */
    uint8_t fed;
    bool first_byte;
    bool connected;    /* libcurl is sending the request: timeouts.connect_ms is over */
    bool finished_gen; /* the generation's end arrived (finish_reason, message_stop, ...) */
    bool saw_done;
    bool trip_pending;
    bool up_paused; /* the transfer is paused until the client drains `out` */
    bool not_sse;   /* 200 without text/event-stream: a broken upstream */
    bool timed_out;
    bool guarded;
    bool think_hindsight; /* whole response: reasoning until proven otherwise */
    bool think_explicit;  /* the content opened with <think> itself */
    bool in_burst;        /* a burst is open (`burst` below) */
    bool read_on;         /* in a body callback: another one follows in the worker's read */
    http_head head;
    /* The upstream's event stream: its first line is all a one-event read touches. */
    _Alignas(64) sse_parser sse;
    _Alignas(64) chan ch[LG_CH_COUNT];
    /* What a tick reads of a running attempt past its first line (ex_tick), on one line. */
    CURL *easy;
    /* rids of a batch's cut samples, each NUL-terminated, to abort at the next tick:
     * libcurl takes no new transfer inside the callback that found the loop */
    lg_buf aborts;
    size_t rbuf; /* the transfer's read buffer (upread_take), handed back when it stops */
    struct curl_slist *headers;
    char *up_body;
    char rid[80]; /* SGLang's rid for this attempt ("" when the route takes none) */
    lg_buf errbody;
    uint64_t tokens_after_trip;
    uint64_t start_ns;
    guard_verdict verdict;
    /* The verdict's strings (copies: a guard's die with it), made at the trip: most
     * attempts never trip, and a stream keeps its exchange. */
    struct ex_trip_text {
        char unit[260];
        char detector[64];
    } * trip;
    /* The sampling the attempt runs with, for its record: the options api->sampling reads
     * (step, seed, upstream kind; the rest zero), turned into JSON only when a record is
     * written (ex_record_attempt), which most attempts never are. `sampling`: the attempt
     * has them and no record took them yet. */
    rw_opts sampling_opts;
    bool sampling;
    /* The open burst (exchange_events.c): usual tokens of one channel from one worker read,
     * their deltas appended here while their events went on as usual, the channel's guard
     * not yet fed them. Its buffers live as long as the attempt. */
    struct ex_burst {
        lg_channel ch;
        uint64_t first_out_ns; /* ex_client's before the burst's first token */
        token_run run0;        /* the channel's before the burst's first token */
        lg_buf text;           /* the tokens' deltas, in order */
        lg_buf toks;           /* an ex_burst_tok for each token, in order */
    } burst;
} ex_attempt;

/* A token of a burst: where its delta ends in the burst's text, and the client output queued
 * before its event (ex_out_mark). */
typedef struct ex_burst_tok {
    size_t end;
    size_t mark;
} ex_burst_tok;

/* The client side: lives from the request to its destroy. */
typedef struct ex_client {
    /* What each event reads first (exchange's layout): to sent[LG_CH_CONTENT]. */
    bool stream_ready; /* streaming response may be queued */
    bool queued;
    bool ended;    /* everything is in `out` (the stream's last event included) */
    bool may_lend; /* inside a body callback whose data ends the worker's read */
    bool counted_stream;
    lg_fifo out;
    /* A raw event queued by reference while `out` is empty (ex_out_raw): bytes of the
     * worker's read, written or copied into `out` before the body callback returns. */
    const char *lent;
    size_t lent_len;
    uint64_t out_since_ns, last_out_ns;
    uint64_t first_out_ns;    /* the stream's first bytes queued (the access log's TTFT) */
    lg_buf sent[LG_CH_COUNT]; /* released to the client, all attempts */
    int final_status;
    char *final_body;
    char *final_ctype;
    /* One event's text per channel (as split, then as released), kept between events so
     * that a token costs no malloc: EX_TEXT_R, EX_TEXT_C. */
    lg_buf text[2];
} ex_client;

/* The incident record: lives from the request until the incident is written. */
typedef struct ex_record {
    unsigned trips;
    bool samples_cut; /* the trips were a batch's samples (recorded each), not retried */
    cJSON *attempts;  /* NULL once the incident is written (record_open says which) */
    bool written;
    char *excerpt;
    const char *outcome;
    uint64_t trip_ns;    /* the last trip (retry latency) */
    uint64_t cut_tokens; /* generated by the attempts that were cut (tokens saved) */
} ex_record;

/* The layout: at a decode pace a stream's next token comes after a thousand other streams'
 * tokens, and finds its stream's state out of cache; every cache line it touches is then a
 * miss, a few hundred nanoseconds on a busy host (more than the token's instructions). So
 * the fields an event reads and writes are packed on few lines of a 64-byte aligned
 * exchange (ex_new allocates it so): the request's first line (lg_req), then from the
 * third line the transfer (lg_xfer), the scalars below, the request's flags (req), the
 * client side's first 152 bytes (ex_client), and the attempt's first line, its SSE
 * parser's first line and its channels' first lines (ex_attempt); everything else is after
 * them or on the second line. A token of one channel of up to 8 bytes touches 9 of its 26
 * lines (it was 18 of 23, and 3-4 more of a parser apart; exchange.c checks the layout). */
typedef struct exchange {
    lg_req base;
    const lg_model_rule *rule;
    lg_xfer xfer;
    ex_phase phase;
    lg_reasoning_output mode;
    const lg_api *api;
    void *api_state;  /* the API module's own state (api->destroy frees it) */
    unsigned attempt; /* attempts started */
    bool guard_on;
    bool think_opened;
    bool think_inline; /* this exchange's upstream sends <think> inside content */
    rw_request req;
    ex_client cl;
    lg_buf body;
    bool body_too_big;

    ex_attempt at;

    char id[40];
    size_t replica;           /* the current (or last) attempt's replica */
    bool have_replica;        /* ... and it is acquired */
    bool avoid_replica;       /* the next attempt must prefer another replica */
    unsigned connect_retries; /* attempts re-sent because a replica never answered */
    ex_record rec;
    void *block; /* the allocation the exchange was placed in (exchange.c's exchange_new) */
} exchange;

/* The per-event text buffers (exchange.text). */
enum { EX_TEXT_R, EX_TEXT_C };

static inline const lg_config *cfg_of(const exchange *ex)
{
    return req_config(&ex->base);
}

static inline double seconds_since(uint64_t then, uint64_t now)
{
    return now > then ? (double)(now - then) / 1e9 : 0.0;
}

/* The lent event (ex_out_raw) is copied into `out`: more output follows it, or it cannot be
 * written at once. */
void ex_out_keep(exchange *ex);

/* Queues bytes for a streaming client (nothing once the stream ended), after a lent event. */
static inline void out_append(exchange *ex, const char *s, size_t n)
{
    if (!ex->req.client_stream || ex->cl.ended) return;
    if (ex->cl.lent_len) ex_out_keep(ex);
    if (lg_fifo_len(&ex->cl.out) == 0) ex->cl.out_since_ns = req_now(&ex->base);
    if (!ex->cl.first_out_ns) ex->cl.first_out_ns = req_now(&ex->base);
    lg_fifo_append(&ex->cl.out, s, n);
    worker_output(&ex->base);
}

/* ---- exchange_events.c: the channels, for the API modules ----------------------------- */

/* libcurl's header and body callbacks of an attempt's transfer, and the SSE parser's event
 * callback that the body goes to (ud: the exchange; it calls api->on_event). */
size_t ex_on_header(char *line, size_t size, size_t n, void *ud);
size_t ex_on_write(char *data, size_t size, size_t n, void *ud);
int ex_on_event(void *ud, const sse_event *ev);
/* Queues an upstream event's own bytes s[0..n) (from an sse_event's raw, in the call of the
 * parser's callback) for a streaming client, as out_append does. Inside a body callback of
 * the worker's read that ends the read (exchange.c's ex_on_write), the first such event
 * with nothing queued before it is not copied: ex_on_write writes it from the read's bytes
 * when the callback ends (ex_out_keep copies it into `out` when more output follows). */
void ex_out_raw(exchange *ex, const char *s, size_t n);
/* The end of such a body callback: the lent event, if any, is written now (worker_write_now)
 * or else copied into `out` for the flush. */
void ex_out_settle(exchange *ex);
/* The client output queued and not yet written (the lent event included): a mark for
 * ex_out_retract. */
static inline size_t ex_out_mark(const exchange *ex)
{
    return lg_fifo_len(&ex->cl.out) + ex->cl.lent_len;
}
/* Takes back the client output queued after `mark` (ex_out_mark in the same worker read:
 * nothing of it is written before its last body callback ends). */
void ex_out_retract(exchange *ex, size_t mark);
/* Queues one `data: json` event for a streaming client. */
void ex_out_event(exchange *ex, const char *json);
/* Feeds one delta of channel ch to its guard (made when first needed) and to the
 * token-run check, and holds it. Returns true when either tripped (the verdict is taken);
 * the caller returns 1 from on_event. */
bool ex_guard_text_run(exchange *ex, lg_channel ch, const char *s, size_t n);
static inline bool ex_guard_text(exchange *ex, lg_channel ch, const char *s, size_t n)
{
    return n && ex_guard_text_run(ex, ch, s, n); /* a channel the event does not use: no call */
}
/* ex_guard_text for a delta that is released as soon as the guard clears it: channel ch
 * holds nothing, the event has no other text and is not its generation's last, and its
 * release needs no copy of the released text (the caller's checks); the caller then queues
 * the event's own bytes for the client unless this returns true.
 *
 * The event of a worker's read's last chunk (a paced stream's one event a read) that no
 * burst is open for, or one libcurl reads, is fed as ex_guard_text feeds it; then a delta
 * that neither the guard nor the token run holds a byte of goes straight to the client's
 * sent text, as its release would move it, without passing through `held` (a cache line a
 * token); else, or when it tripped, it is held.
 *
 * One that more chunks of the read follow (a saturated stream's read brings dozens, a
 * chunk an event), or that a burst is open for, joins the burst of channel ch (a guarded
 * one): the token-run check sees it now, the guard sees the burst's text at once when the
 * burst ends (ex_burst_end), where what is held is decided for the whole burst. A burst
 * lives within one worker read: ex_on_write ends it with the read's last chunk, and while
 * it is open every event that does not join it ends it first (the API module's duty). */
bool ex_guard_text_release(exchange *ex, lg_channel ch, const char *s, size_t n);
/* Ends the open burst: its channel's guard is fed the burst's text in one call and judges
 * it as the tokens one by one would have been judged (guard.h: the verdict does not depend
 * on the chunking). The client output of the burst's tokens is already queued (nothing of
 * the worker's read is written before its last body callback ends: ex_out_settle), and is
 * taken back from the first token whose delta holds a byte that is not released:
 * - no trip: the tokens whose deltas end before the bytes the guard or the token run holds
 *   after the burst's last token (hold_back) are released (their text to `sent`); the
 *   others' events are taken back and their text held, to be released as the following
 *   events release held text. So a burst holds whole tokens, and never less than feeding
 *   them one by one would hold at the burst's end (bytes held meanwhile and released
 *   within the read reach the client with the read either way).
 * - a trip (the guard's, or the token run's at the burst's last token): the tokens before
 *   the tripping one that feeding them one by one would have released whole stay (a replay
 *   finds them: burst_cleared); the events of the others are taken back. The text from
 *   the first of those through the tripping token is held (the incident's excerpt ends
 *   with it); the tokens after it count as tokens_after_trip, not as tokens; the verdict is
 *   the one feeding the tokens one by one gives.
 * Returns true on a trip (the verdict is taken and trip_pending set). */
bool ex_burst_end(exchange *ex);
/* Ends the open burst, if any, before an event that does not join it. True when it tripped:
 * the event is then one after the trip (counted so), and on_event returns 1. */
static inline bool ex_burst_stop(exchange *ex)
{
    if (!ex->at.in_burst || !ex_burst_end(ex)) return false;
    ex->at.tokens_after_trip++;
    return true;
}
/* True when channel ch may hold text or have attempt_bytes (ex_attempt.fed). */
static inline bool ex_chan_fed(const exchange *ex, lg_channel ch)
{
    return ex->at.fed >> ch & 1;
}
/* The bytes channel ch holds back, without reading an unfed channel's line. */
static inline size_t ex_held_len(const exchange *ex, lg_channel ch)
{
    return ex_chan_fed(ex, ch) ? ex->at.ch[ch].held.len : 0;
}
/* True when any channel holds text back. */
static inline bool ex_held_any(const exchange *ex)
{
    for (unsigned f = ex->at.fed; f; f &= f - 1)
        if (ex->at.ch[__builtin_ctz(f)].held.len) return true;
    return false;
}
/* Held bytes of channel ch that the guard has cleared. */
size_t ex_releasable_run(const exchange *ex, lg_channel ch);
static inline size_t ex_releasable(const exchange *ex, lg_channel ch)
{
    return ex_held_len(ex, ch) ? ex_releasable_run(ex, ch) : 0;
}
/* Moves n held bytes of channel ch to the client's sent text (and to *into when given). */
void ex_release_run(exchange *ex, lg_channel ch, size_t n, lg_buf *into);
static inline void ex_release(exchange *ex, lg_channel ch, size_t n, lg_buf *into)
{
    if (n) ex_release_run(ex, ch, n, into);
}
/* The generation of this attempt ended: the guards' last checks (and the empty-answer
 * check when answer_expected and the API is templated). True when one tripped. */
bool ex_end_checks(exchange *ex, bool answer_expected);
/* OpenAI's error body {"error":{"message","type","param","code"}}: api.h's error_body for
 * the routes that answer errors in OpenAI's shape. */
char *ex_openai_error_body(int status, const char *message, const char *type, const char *code);
/* A batch (one upstream request, many samples: api_generate.c) guards each sample on a
 * channel of its own, which the module keeps with the sample's released text. The swap
 * exchanges them with the attempt's channel ch and its sent text; swapped in, the sample is
 * what ex_guard_text, ex_releasable, ex_release and ex_end_checks work on. Swap again to
 * take it back out. */
void ex_sample_swap(exchange *ex, lg_channel ch, chan *c, lg_buf *sent);
/* The per-event text buffers (EX_TEXT_R, EX_TEXT_C), lent empty and taken back. */
lg_buf ex_text_borrow(exchange *ex, int i);
void ex_text_return(exchange *ex, int i, lg_buf *b);

/* ---- exchange_think.c: reasoning left inline as <think> in the answer text ------------ */

/* One event's answer text (and any reasoning the upstream sent beside it): splits
 * <think>…</think> out of it when this attempt's text opens with one, the model's template
 * opened it, or a whole response is read in hindsight. Returns true when the splitter took
 * the event: *r and *c are then the borrowed EX_TEXT_R / EX_TEXT_C buffers holding its
 * reasoning and answer parts (hand them back with ex_text_return); false: the text is as
 * sent. final: the generation's last event (held tag bytes are flushed). */
bool ex_think_split_run(exchange *ex, const char *reasoning, size_t rn, const char *text, size_t n,
                        bool final, lg_buf *r, lg_buf *c);
/* True when answer text of n bytes (rn of reasoning beside it) is the attempt's first text
 * of either channel: where whether to split is decided. */
static inline bool ex_think_first_text(const exchange *ex, size_t rn, size_t n)
{
    return n && !rn &&
           !(ex_chan_fed(ex, LG_CH_REASONING) && ex->at.ch[LG_CH_REASONING].attempt_bytes) &&
           !(ex_chan_fed(ex, LG_CH_CONTENT) && ex->at.ch[LG_CH_CONTENT].attempt_bytes);
}
/* The usual answer's token (no splitter, and not the attempt's first text) is decided here,
 * without the call. */
static inline bool ex_think_split(exchange *ex, const char *reasoning, size_t rn, const char *text,
                                  size_t n, bool final, lg_buf *r, lg_buf *c)
{
    if (!ex->at.think && !ex_think_first_text(ex, rn, n)) return false;
    return ex_think_split_run(ex, reasoning, rn, text, n, final, r, c);
}
/* The generation of a whole response read in hindsight ended: with no </think> (and no
 * explicit <think>), what looked like reasoning was the answer, and moves back to it.
 * Returns true when it moved. */
bool ex_think_settle(exchange *ex);
/* Writes released text of channel ch (reasoning or answer) in the module's API shape. It
 * must not borrow EX_TEXT_C (the text is lent from it). */
typedef void ex_put_fn(exchange *ex, int ch, const char *s, size_t n);
/* The answer text of an API whose answer is one text field (an Anthropic text block, a
 * Responses message item): split (ex_think_split), each part guarded on its channel, and
 * what the guards cleared handed to put, reasoning first (all of it once the answer began),
 * everything at the end of the text (final). Returns -1 when the text is not split (the
 * caller guards it as plain answer text), 1 when a guard tripped, else 0. */
int ex_think_text(exchange *ex, const char *s, size_t n, bool final, ex_put_fn *put);

/* ---- exchange.c: the exchange's life, for the API modules ------------------------------ */

/* The exchange's fate is decided: no more attempts. The incident is written now, before
 * the client has its answer, so whoever reads /loopguard/incidents after the response
 * finds it. */
void ex_conclude(exchange *ex);
/* Sets the exchange's outcome unless one is set already (the first cause wins); counted in
 * the metrics when the exchange tripped. */
void ex_set_outcome(exchange *ex, const char *outcome);
/* Appends the current attempt's record (v: its verdict, or NULL) to the incident record. */
void ex_record_attempt(exchange *ex, const guard_verdict *v);
/* True once the client's streaming response exists or is about to be queued: from then on,
 * every end is written into the stream. */
bool ex_streaming_started(const exchange *ex);
/* Ends the exchange with an error: an error response in the API's shape when nothing was
 * sent yet, else the API's error event and the stream's end. */
void ex_fail(exchange *ex, int status, const char *message, const char *type, const char *code);
/* An upstream error event before the client's stream started: the exchange ends with
 * `status` and `body` (malloc'd, taken). */
void ex_fail_whole(exchange *ex, int status, char *body);
/* The last bytes of a client stream: loopguard's X-Loopguard-* comments when it tripped,
 * then last[0..n); the stream is then complete. */
void ex_end_stream(exchange *ex, const char *last, size_t n);
/* The swapped-in sample tripped (ex_guard_text or ex_end_checks said so): the trip is
 * counted and recorded like an attempt's (rid: the sample's, `tokens` its own), the
 * exchange's outcome is "failed" (that sample's answer is withheld), SGLang is told to
 * abort that rid only, and the attempt goes on for the other samples. */
void ex_sample_tripped(exchange *ex, const char *rid, uint64_t tokens);
/* Fresh hex digits (2 * nbytes + NUL into out): ids and rids. */
void ex_random_hex(char *out, size_t nbytes);

#endif
