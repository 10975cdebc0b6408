/* relay.h — transparent pass-through of requests loopguard does not guard. */
#ifndef LG_RELAY_H
#define LG_RELAY_H

#include "proxy/worker.h"

/* Starts relaying `method url` from `conn` to an upstream replica right away (the request
 * body streams as it arrives). Returns the request (never NULL; aborts on OOM). */
lg_req *relay_new(lg_worker *w, struct MHD_Connection *conn, const char *method, const char *url);

#endif
