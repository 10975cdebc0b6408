/* exchange.h — the guarded exchange: one client generation request (in any API that has a
 * module, api.h), carried through one or more upstream attempts with the guard reading every
 * token. */
#ifndef LG_EXCHANGE_H
#define LG_EXCHANGE_H

#include "proxy/api.h"
#include "proxy/worker.h"

/* Creates the exchange for a POST to `api`'s route. The body is collected by later access
 * calls; nothing is sent upstream before it is complete and valid. Never NULL (aborts on
 * OOM). */
lg_req *exchange_new(lg_worker *w, struct MHD_Connection *conn, const lg_api *api);

#endif
