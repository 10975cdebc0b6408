/* relay.c — transparent pass-through of every request loopguard does not guard.
 *
 * Bodies stream in both directions with bounded memory: the client's upload is handed to
 * libcurl as it arrives (the client connection is suspended while more than RELAY_HIGH
 * bytes wait for the upstream), and the upstream's response is handed to libmicrohttpd's
 * content reader (the libcurl transfer is paused while more than RELAY_HIGH bytes wait for
 * the client). Status and end-to-end headers pass unchanged; hop-by-hop headers are
 * dropped per RFC 9110. The relay never looks inside the bytes. */
#include "proxy/relay.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "proxy/buf.h"
#include "proxy/http.h"
#include "proxy/num.h"
#include "proxy/accesslog.h"
#include "proxy/upfail.h"
#include "proxy/upstream.h"
#include "proxy/xalloc.h"

#define RELAY_HIGH  (256 * 1024)
#define RELAY_BLOCK (32 * 1024)

typedef struct relay {
    lg_req base;
    lg_xfer xfer;
    CURL *easy;
    struct curl_slist *headers;
    size_t replica;
    bool has_body;
    lg_fifo up;     /* client bytes not yet read by libcurl */
    bool up_done;   /* the client finished its body */
    bool up_paused; /* libcurl's read callback returned PAUSE */
    lg_fifo down;   /* upstream bytes not yet sent to the client */
    bool down_paused;
    http_head head;
    char *method, *target;    /* the request line's method and path?query, kept for a re-send */
    long long content_length; /* -1: chunked */
    uint64_t up_read;         /* request body bytes libcurl has taken (0: safe to re-send) */
    unsigned connect_retries;
    uint64_t up_total;     /* request body bytes received */
    uint64_t last_data_ns; /* last upstream header or body bytes */
    bool too_big;
    bool queued;   /* response queued on the client connection */
    bool finished; /* upstream transfer over */
    CURLcode result;
    char why[400]; /* the failure's cause for the client (upfail.h), when result != OK */
    int status_for_metrics;
} relay;

static void relay_stop_transfer(relay *r)
{
    if (!r->easy) return;
    worker_remove_xfer(r->base.w, r->easy);
    curl_easy_cleanup(r->easy);
    r->easy = NULL;
    pool_release(req_pool(&r->base), r->replica);
}

static size_t on_read(char *buf, size_t size, size_t n, void *ud)
{
    relay *r = ud;
    size_t want = size * n;
    if (lg_fifo_len(&r->up) == 0) {
        if (r->up_done) return 0;
        r->up_paused = true;
        return CURL_READFUNC_PAUSE;
    }
    size_t k = lg_fifo_take(&r->up, buf, want);
    r->up_read += k;
    if (lg_fifo_len(&r->up) < RELAY_HIGH / 2) worker_resume(&r->base);
    return k;
}

static size_t on_header(char *line, size_t size, size_t n, void *ud)
{
    relay *r = ud;
    r->last_data_ns = req_now(&r->base);
    http_head_line(&r->head, line, size * n);
    if (r->head.too_big) { /* answered 502 with this cause (the head is not complete) */
        snprintf(r->why, sizeof r->why, "upstream response head too large");
        return 0;
    }
    if (r->head.complete) worker_resume(&r->base); /* the access handler queues the response */
    return size * n;
}

static size_t on_write(char *data, size_t size, size_t n, void *ud)
{
    relay *r = ud;
    if (r->base.client_gone) return 0; /* aborts the transfer */
    if (lg_fifo_len(&r->down) >= RELAY_HIGH) {
        r->down_paused = true;
        return CURL_WRITEFUNC_PAUSE;
    }
    lg_fifo_append(&r->down, data, size * n);
    r->last_data_ns = req_now(&r->base);
    worker_resume(&r->base);
    return size * n;
}

static int relay_start(relay *r, size_t avoid);

/* True for transfer results the replica caused (it refused, reset, timed out or sent
 * something that is not HTTP). A request libcurl would not send, a client that left or
 * a body the client stopped sending are never held against the replica. */
static bool replica_fault(CURLcode rc)
{
    switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_GOT_NOTHING:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
        return true;
    default:
        return false;
    }
}

static void on_done(lg_xfer *x, CURLcode rc)
{
    relay *r = x->owner;
    lg_pool *pool = req_pool(&r->base);
    long status = 0;
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
    if (rc == CURLE_OK || replica_fault(rc))
        pool_report_health(pool, r->replica, rc == CURLE_OK && status < 500);
    if (replica_fault(rc))
        upf_report(r->why, sizeof r->why, pool_base(pool, r->replica),
                   &(upf_state){rc, x->os_errno, false, false, r->head.complete, false});
    if (rc == CURLE_COULDNT_CONNECT && !r->head.complete && r->up_read == 0 &&
        r->connect_retries + 1 < pool_size(pool) && !r->base.client_gone) {
        /* Nothing reached that replica: the same request goes to another one. */
        size_t dead = r->replica;
        r->connect_retries++;
        metrics_upstream_error(req_metrics(&r->base), dead, "connect");
        relay_stop_transfer(r);
        if (relay_start(r, dead) == 0) return;
        worker_resume(&r->base);
        return;
    }
    r->finished = true;
    r->result = rc;
    if (replica_fault(rc))
        metrics_upstream_error(req_metrics(&r->base), r->replica,
                               rc == CURLE_OPERATION_TIMEDOUT ? "timeout" : "connect");
    relay_stop_transfer(r);
    worker_resume(&r->base);
}

static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    relay *r = cls;
    (void)pos;
    if (r->base.client_gone) return MHD_CONTENT_READER_END_WITH_ERROR;
    if (lg_fifo_len(&r->down)) {
        size_t k = lg_fifo_take(&r->down, buf, max);
        if (r->down_paused && lg_fifo_len(&r->down) < RELAY_HIGH / 2 && r->easy) {
            r->down_paused = false;
            curl_easy_pause(r->easy, CURLPAUSE_CONT);
        }
        return (ssize_t)k;
    }
    if (r->finished)
        return r->result == CURLE_OK ? MHD_CONTENT_READER_END_OF_STREAM
                                     : MHD_CONTENT_READER_END_WITH_ERROR;
    worker_suspend(&r->base);
    return 0;
}

static enum MHD_Result queue_response(relay *r)
{
    struct MHD_Connection *c = r->base.conn;
    r->queued = true;
    if (!r->head.complete && r->result == CURLE_URL_MALFORMAT) {
        /* The edge admits only targets libcurl takes; should one slip through, it is the
         * client's error and never the replica's. */
        metrics_request(req_metrics(&r->base), LG_EP_PASSTHROUGH, 400);
        return http_respond_error(c, 400, "request target the upstream cannot be sent",
                                  "invalid_request_error", "bad_target");
    }
    if (!r->head.complete) {
        /* The upstream never answered: map the transport error. */
        bool timeout = r->result == CURLE_OPERATION_TIMEDOUT;
        r->status_for_metrics = timeout ? 504 : 502;
        metrics_request(req_metrics(&r->base), LG_EP_PASSTHROUGH, r->status_for_metrics);
        return http_respond_error(c, r->status_for_metrics, r->why, "upstream_error",
                                  timeout ? "upstream_timeout" : "upstream_unreachable");
    }
    uint64_t size = r->head.content_length >= 0 && !r->head.chunked
                        ? (uint64_t)r->head.content_length
                        : MHD_SIZE_UNKNOWN;
    struct MHD_Response *resp =
        MHD_create_response_from_callback(size, RELAY_BLOCK, reader, r, NULL);
    if (!resp) return MHD_NO;
    http_head_apply(&r->head, resp, false);
    r->status_for_metrics = r->head.status;
    metrics_request(req_metrics(&r->base), LG_EP_PASSTHROUGH, r->head.status);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)r->head.status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result relay_access(lg_req *base, const char *upload, size_t *upload_size)
{
    relay *r = (relay *)base;
    if (*upload_size) {
        r->up_total += *upload_size;
        if (r->up_total > req_config(&r->base)->max_body_bytes) {
            /* Part may be upstream already: stop it, read the rest into nothing, and
             * answer 413 when the body is complete (libmicrohttpd queues no response
             * in the middle of an upload). */
            *upload_size = 0;
            if (!r->too_big) relay_stop_transfer(r);
            r->too_big = true;
            lg_fifo_free(&r->up);
            return MHD_YES;
        }
        lg_fifo_append(&r->up, upload, *upload_size);
        *upload_size = 0;
        if (r->up_paused && r->easy) {
            r->up_paused = false;
            curl_easy_pause(r->easy, CURLPAUSE_CONT);
        }
        if (lg_fifo_len(&r->up) >= RELAY_HIGH) worker_suspend(base);
        return MHD_YES;
    }
    if (!r->up_done) {
        r->up_done = true;
        if (r->up_paused && r->easy) {
            r->up_paused = false;
            curl_easy_pause(r->easy, CURLPAUSE_CONT);
        }
    }
    if (r->queued) return MHD_YES;
    if (r->too_big) {
        r->queued = true;
        metrics_request(req_metrics(&r->base), LG_EP_PASSTHROUGH, 413);
        return http_respond_error(r->base.conn, 413, "request body too large",
                                  "invalid_request_error", "body_too_large");
    }
    if (r->head.complete || r->finished) return queue_response(r);
    worker_suspend(base);
    return MHD_YES;
}

/* Upstream timeouts: first byte (connect + headers) and idle between body bytes; time the
 * transfer spends paused for a slow client does not count. */
static void relay_tick(lg_req *base, uint64_t now)
{
    relay *r = (relay *)base;
    const lg_config *cfg = req_config(base);
    if (!r->easy) return;
    uint64_t fb = (uint64_t)cfg->timeouts.first_byte_ms * 1000000ull;
    uint64_t idle = (uint64_t)cfg->timeouts.idle_ms * 1000000ull;
    uint64_t since = r->head.complete ? r->last_data_ns : base->start_ns;
    uint64_t limit = r->head.complete ? idle : fb;
    if (r->down_paused || !limit || now <= since || now - since <= limit) return;
    upf_report(r->why, sizeof r->why, pool_base(req_pool(base), r->replica),
               &(upf_state){CURLE_OPERATION_TIMEDOUT, 0, true, true, r->head.complete, false});
    relay_stop_transfer(r);
    metrics_upstream_error(req_metrics(base), r->replica, "timeout");
    r->finished = true;
    r->result = CURLE_OPERATION_TIMEDOUT;
    worker_resume(base);
}

static void relay_client_gone(lg_req *base)
{
    relay_stop_transfer((relay *)base);
}

static void relay_destroy(lg_req *base)
{
    relay *r = (relay *)base;
    uint64_t now = lg_now_ns();
    accesslog_write(req_access(base),
                    &(access_entry){
                        .route = r->target,
                        .status = r->queued ? r->status_for_metrics : 0,
                        .upstream = pool_base(req_pool(base), r->replica),
                        .attempts = 1 + r->connect_retries,
                        .tokens = -1,
                        .ttft_us = -1,
                        .duration_us = now > base->start_ns ? (now - base->start_ns) / 1000 : 0,
                    });
    relay_stop_transfer(r);
    http_upstream_headers_free(r->headers);
    free(r->method);
    free(r->target);
    lg_fifo_free(&r->up);
    lg_fifo_free(&r->down);
    http_head_clear(&r->head);
    free(r);
}

static void relay_shutdown(lg_req *base)
{
    relay *r = (relay *)base;
    relay_stop_transfer(r);
    r->finished = true;
    r->result = CURLE_ABORTED_BY_CALLBACK;
    snprintf(r->why, sizeof r->why, "loopguard is shutting down");
    worker_resume(base);
}

static const lg_req_ops relay_ops = {
    .name = "relay",
    .access = relay_access,
    .client_gone = relay_client_gone,
    .tick = relay_tick,
    .shutdown = relay_shutdown,
    .destroy = relay_destroy,
};

/* Starts the upstream transfer on a replica (avoiding `avoid` when another is eligible).
 * Returns 0, or -1 when libcurl refused the handle (the relay is then finished). */
static int relay_start(relay *r, size_t avoid)
{
    const lg_config *cfg = req_config(&r->base);
    lg_pool *pool = req_pool(&r->base);
    r->replica = pool_acquire(pool, avoid);
    metrics_upstream_request(req_metrics(&r->base), r->replica);

    lg_buf url = LG_BUF_INIT;
    lg_buf_append_str(&url, pool_base(pool, r->replica));
    lg_buf_append_str(&url, r->target);
    CURL *e = r->easy = curl_easy_init();
    if (!e) lg_oom(0);
    curl_easy_setopt(e, CURLOPT_URL, url.p);
    lg_buf_free(&url);
    /* The path was normalised and routed by the edge: libcurl must send it as it is. */
    curl_easy_setopt(e, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(e, CURLOPT_PRIVATE, &r->xfer);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, r->headers);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)cfg->timeouts.connect_ms);
    curl_easy_setopt(e, CURLOPT_HTTP_TRANSFER_DECODING, 1L);
    curl_easy_setopt(e, CURLOPT_HTTP_CONTENT_DECODING, 0L); /* bytes pass as they came */
    if (strcmp(r->method, "HEAD") == 0) {
        curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    } else if (r->has_body) {
        curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(e, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(e, CURLOPT_READDATA, r);
        curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->content_length);
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, r->method);
    } else if (strcmp(r->method, "GET") != 0) {
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, r->method);
    }
    if (worker_add_xfer(r->base.w, e) == 0) return 0;
    relay_stop_transfer(r);
    r->finished = true;
    r->result = CURLE_FAILED_INIT;
    snprintf(r->why, sizeof r->why, "cannot start the upstream transfer");
    return -1;
}

lg_req *relay_new(lg_worker *w, struct MHD_Connection *conn, const char *method, const char *url)
{
    relay *r = lg_xcalloc(1, sizeof *r);
    http_head_clear(&r->head);
    worker_req_init(w, &r->base, &relay_ops, conn);
    r->xfer = (lg_xfer){.done = on_done, .owner = r};

    /* The edge admitted either one valid Content-Length or Transfer-Encoding: chunked,
     * never both. libcurl frames the upload itself: with the length when the client gave
     * one (libmicrohttpd enforces it), chunked otherwise; the client's framing headers are
     * never forwarded (http_forward_header). */
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
    const char *te = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Transfer-Encoding");
    r->content_length = -1;
    bool bad_length = cl && !te && !lg_parse_ll(cl, 0, LLONG_MAX, &r->content_length);
    r->has_body = r->content_length > 0 || te;
    if (!r->has_body) r->up_done = true;

    lg_buf target = LG_BUF_INIT;
    lg_buf_append_str(&target, url);
    http_append_query(&target, conn);
    r->target = lg_buf_steal(&target);
    r->method = lg_xstrdup(method);
    r->headers = http_upstream_headers(conn, false);
    if (bad_length) {
        /* hh_check already rejects this at the edge; should it get here, the relay ends
         * without an upstream transfer and the client gets the 502 with this cause. */
        r->finished = true;
        r->result = CURLE_FAILED_INIT;
        snprintf(r->why, sizeof r->why, "malformed Content-Length");
        return &r->base;
    }
    relay_start(r, SIZE_MAX);
    return &r->base;
}
