/* admin.h — loopguard's own endpoints under /loopguard/: health, metrics (Prometheus
 * text), incidents (recent incident records as JSON) and upstreams (replica state). */
#ifndef LG_ADMIN_H
#define LG_ADMIN_H

#include "proxy/worker.h"

/* Answers an admin request at once (bearer token checked when configured). */
enum MHD_Result admin_handle(lg_worker *w, struct MHD_Connection *conn, const char *url,
                             const char *method);

#endif
