/* Proxy-internal: a mirror operation in progress (km_mop), shared by the mirror RPCs (mirror_rpc.c) and mirror.name (mirror_names.c). */
#ifndef KMIRROR_PROXY_MIRROR_RPC_INT_H
#define KMIRROR_PROXY_MIRROR_RPC_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kmirror/arena.h"
#include "kmirror/error.h"
#include "kmirror/mirror.h"
#include "kmirror/msg/alter_mirror_request.h"
#include "kmirror/msg/create_mirror_request.h"
#include "kmirror/msg/delete_mirror_request.h"
#include "kmirror/msg/describe_mirrors_request.h"
#include "kmirror/msg/last_mirrored_offsets_request.h"
#include "kmirror/msg/list_mirrors_request.h"
#include "kmirror/msg/pause_mirror_topics_request.h"
#include "kmirror/msg/resume_mirror_topics_request.h"
#include "kmirror/msg/start_mirror_topics_request.h"
#include "kmirror/msg/stop_mirror_topics_request.h"
#include "kmirror/state.h"
#include "proxy/mirror_rpc.h"

/* How an RPC is authorized (docs/protocol.md, "Authorization"). */
typedef enum { KM_MOP_AUTH_CLUSTER_ALTER, KM_MOP_AUTH_CLUSTER_DESCRIBE, KM_MOP_AUTH_TOPICS } km_mop_auth;

typedef struct km_mop km_mop;

/* One mirror RPC's parts, in the order they run: check, authorize, apply; and its error answer. */
typedef struct km_mop_rpc {
	km_err (*check)(km_mop *op, char *err, size_t errlen); /* names, duplicates: KM_OK, or the code with err */
	km_mop_auth auth;
	void (*apply)(km_mop *op);                              /* authorized and the store ready: carry it out */
	void (*error)(km_mop *op, km_err code, const char *msg); /* answer the request with one error */
	/* Topic operations: the answer with each topic's outcome. */
	void (*topics)(km_mop *op, km_err code, const char *msg, const int16_t *tcodes, const char *const *tmsgs);
} km_mop_rpc;

/* The request of any of the ten RPCs, decoded. */
typedef union km_mop_req {
	km_create_mirror_request create;
	km_delete_mirror_request del;
	km_list_mirrors_request list;
	km_describe_mirrors_request describe;
	km_alter_mirror_request alter;
	km_start_mirror_topics_request start;
	km_stop_mirror_topics_request stop;
	km_pause_mirror_topics_request pause;
	km_resume_mirror_topics_request resume;
	km_last_mirrored_offsets_request lmo;
	km_incremental_alter_configs_request iac;
	km_alter_configs_request ac;
} km_mop_req;

/*
 * One operation in progress: owned by nobody but itself, freed once nothing can call it back
 * (no probe pending, no store call pending). The session may go first: then its probes report
 * KM_ERR_CLOSED, and a store result finds km_session_answer saying KM_ERR_CLOSED.
 */
struct km_mop {
	struct km_mop *prev, *next; /* every live operation (km_mirror_rpc_detach) */
	const km_mop_rpc *rpc;   /* the RPC's parts; NULL for mirror.name through the config APIs */
	km_session_set *set;     /* NULL: the proxy is gone, drop the answer */
	uint64_t sid, seq;
	km_state *st;
	km_mirror *mi;           /* creates missing destination topics for a start; NULL: none */
	km_proxy_counters *metrics; /* the proxy's, while set is not NULL */
	int16_t key, version;
	uint8_t *req;            /* the request body, copied: decoded strings borrow it */
	size_t req_len;
	km_arena a;
	km_mop_req m;
	int probes;              /* probes sent and not answered */
	bool gone;               /* the session closed */
	/* authorization: what the probes found, judged once the last one has answered */
	int16_t auth_code;       /* the first refusal of the whole request; 0: none */
	const char *auth_msg;
	const char *acl_scope;   /* the mirror.acl.include the ACL probe was sent for; NULL: not sent */
	/* topic operations */
	km_topic_op op;
	const char *mirror;      /* NUL-terminated copy of the mirror name */
	const char **topics;     /* NUL-terminated copies, in request order */
	size_t ntopics;
	int16_t *tcode;          /* each topic's outcome so far (authorization) */
	const char **tmsg;
	bool *tmissing;          /* a start's topic the ALTER_CONFIGS probe found missing (NULL: no CREATE probe) */
	int16_t *ccode;          /* the CREATE probe's verdict on each topic, used for the missing ones */
	const char **cmsg;
	/* config requests */
	km_mcfg_split sp;
	int32_t next_res;
	bool validate_only;
	km_req *now;             /* inside the request's hook: an answer goes to now->answer */
	/*
	 * Naming a mirror this kmirrord does not know, it waits for a view that holds every change
	 * acknowledged before the request came, through whichever kmirrord: the store's first follow
	 * round started after (fresh_ticket), until fresh_until at most (ms, monotonic), polled by fresh_ev.
	 */
	uint64_t fresh_ticket;
	int64_t fresh_until;
	struct event_base *base;
	struct event *fresh_ev;
};

/* How long an operation waits at most for the view of the request's moment, and how often it looks. */
#define KM_MOP_FRESH_WAIT_MS 2000
#define KM_MOP_FRESH_POLL_MS 10

/* The versions of the authorizing probes (Kafka 4.x brokers serve IncrementalAlterConfigs 0-1, DescribeConfigs 1-4). */
#define KM_PROBE_IAC_VERSION 1
#define KM_PROBE_DESCRIBE_VERSION 4
/* The CREATE probe (CreateTopics v5: Kafka 2.4, broker defaults for partitions and replicas) and its wait. */
#define KM_PROBE_CREATE_VERSION 5
#define KM_PROBE_CREATE_TIMEOUT_MS 15000
/* The ALTER-on-CLUSTER probe (DeleteAcls v2: Kafka 2.4): one filter that matches no binding but its own. */
#define KM_PROBE_ACL_VERSION 2
#define KM_PROBE_ACL_RESOURCE "kmirror-authorization-probe"
#define KM_PROBE_ACL_PRINCIPAL "User:kmirror-authorization-probe"
/* A config key of the cluster-wide broker defaults, asked for only to be authorized (DESCRIBE_CONFIGS on CLUSTER). */
#define KM_PROBE_DESCRIBE_KEY "compression.type"

extern const char km_mop_no_store_msg[];
extern const char km_mop_loading_msg[];

/* A new operation for the request in rq's hook (body copied); NULL with *rc KM_ERR_DECODE (header) or KM_ERR_NOMEM. */
km_mop *km_mop_new(km_req *rq, km_err *rc);
void km_mop_free(km_mop *op);
/* Where the request's body starts: the session reads only the fixed part of the header. */
bool km_mop_body_offset(const km_req *rq, size_t *off);
/* Decode the copied request with the codec of its key. */
km_err km_mop_decode(km_mop *op);
/* Send the answer (unless the session or the proxy is gone) and free the operation. */
void km_mop_answer(km_mop *op, const void *resp);
/* A NUL-terminated copy of s in op's arena ("" when out of memory). */
const char *km_mop_strdup(km_mop *op, km_str s);
/* Ask the broker m (key, version) as the client, from the request's hook; cb gets op. */
km_err km_mop_probe(km_req *rq, km_mop *op, int16_t key, int16_t version, const void *m, km_session_probe_cb cb)
	__attribute__((warn_unused_result));

#endif
