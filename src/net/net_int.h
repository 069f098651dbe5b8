/* What the net module's files share and no other module sees. */
#ifndef KM_NET_INT_H
#define KM_NET_INT_H

#include <stdbool.h>
#include <stddef.h>

#include <event2/bufferevent.h>

/* A plain socket bufferevent whose reads and writes src/net/bev.c does (see there); opts as bufferevent_socket_new. */
struct bufferevent *km_net_bev_plain_new(struct event_base *base, int fd, int opts);
/* For km_net_bev_fill on such a bufferevent: upto becomes its read size (per readiness event); others are left alone. */
void km_net_bev_plain_fill(struct bufferevent *bev, size_t upto);

#endif
