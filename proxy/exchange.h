/* exchange.h — the guarded exchange: one client chat or text completion request, carried
 * through one or more upstream attempts with the guard reading every token. */
#ifndef LG_EXCHANGE_H
#define LG_EXCHANGE_H

#include "proxy/worker.h"

/* Creates the exchange for POST `url` (/v1/chat/completions or /v1/completions). The body
 * is collected by later access calls; nothing is sent upstream before it is complete and
 * valid. Never NULL (aborts on OOM). */
lg_req *exchange_new(lg_worker *w, struct MHD_Connection *conn, const char *url);

#endif
