/* route.c — the route table (route.h). A route is in the table only when its module
 * guards it end to end (its e2e suite passes); every other path is relayed. */
#include "proxy/route.h"

#include <string.h>

#include "proxy/exchange.h"
#include "proxy/relay.h"

static const lg_api *const routes[] = {
    &api_chat, &api_completions, &api_messages, &api_responses, &api_generate,
};

const lg_api *route_api(const char *method, const char *path)
{
    if (strcmp(method, "POST") != 0) return NULL;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (strcmp(path, routes[i]->route) == 0) return routes[i];
    return NULL;
}

lg_req *route_request(lg_worker *w, struct MHD_Connection *conn, const char *method,
                      const char *url)
{
    const lg_api *api = route_api(method, url);
    return api ? exchange_new(w, conn, api) : relay_new(w, conn, method, url);
}
