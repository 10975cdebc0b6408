/* status_page.h — the page served at /loopguard/ on the admin listener (status_page.c). */
#ifndef LG_STATUS_PAGE_H
#define LG_STATUS_PAGE_H

/* The whole HTML document, NUL-terminated. */
extern const char lg_status_page_html[];

#endif
