/* route.h — the route table: which handler a client request goes to.
 *
 * The worker hands every request that is not loopguard's own (/loopguard/...) to
 * route_request; the table maps `method path` to a guarded API (an exchange with that API's
 * module, api.h) and everything else to the transparent relay. Handlers register with the
 * worker through worker.h's request API; the worker knows no handler but this table. */
#ifndef LG_ROUTE_H
#define LG_ROUTE_H

#include "proxy/api.h"
#include "proxy/worker.h"

/* The guarded API for `method path`, or NULL when the request is relayed untouched. */
const lg_api *route_api(const char *method, const char *path);

/* Creates the request for `method url` on conn: an exchange for a guarded route, else the
 * relay. Never NULL (aborts on OOM). */
lg_req *route_request(lg_worker *w, struct MHD_Connection *conn, const char *method,
                      const char *url);

#endif
