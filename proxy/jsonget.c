/* jsonget.c — cJSON's member lookup by name, defined by loopguard.
 *
 * A request's setup looks members of the client's body up by name about 30 times (the
 * rewrite's checks and sampling copy, the guard's prompt, the access log), most of them
 * members the body does not have, and cJSON 1.7 compares the name with every member's
 * through strcmp: 87 calls per 2-token request, 1.6 % of loopguard's CPU on the bench's
 * request shape. This definition, to which every reference in the program and its tests
 * binds before the shared library's (as the executable's recv and clock_gettime do, and
 * libcjson's own exported-name call in cJSON_DetachItemFromObjectCaseSensitive), compares
 * the first byte before calling strcmp. Its result is cJSON 1.7's in every case (cJSON.c,
 * get_object_item with case_sensitive): NULL for a NULL object or name, the first child
 * whose name equals `string`, and NULL at the first child without a name (an array's
 * element) as at the end. */
#include <cjson/cJSON.h>
#include <string.h>

cJSON *cJSON_GetObjectItemCaseSensitive(const cJSON *const object, const char *const string)
{
    if (!object || !string) return NULL;
    for (cJSON *c = object->child; c && c->string; c = c->next)
        if (c->string[0] == string[0] && strcmp(c->string, string) == 0) return c;
    return NULL;
}
