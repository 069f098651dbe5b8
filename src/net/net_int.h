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

typedef struct km_net_client km_net_client;
typedef struct km_net_rpc km_net_rpc;
/* The client's event base (src/net/rpc.c arms its resend timers there). */
struct event_base *km_net_client_base(const km_net_client *c);
/* The head of the client's list of calls waiting to be sent again (src/net/rpc.c). */
km_net_rpc **km_net_client_rpc_waiting(km_net_client *c);
/* km_net_client_free: every call waiting to be sent again gets KM_ERR_CLOSED. */
void km_net_rpc_client_gone(km_net_client *c);

#endif
