/*
 * The mirror module's preparations: one StartMirrorTopics' (the destination topics created, the
 * checks of those that are there), a topic's growth, and the proxy's searches of a destination
 * partition by timestamp. Each is a small state machine (phase) over kmirrord's own clients of the
 * destination and the mirror's source; topics.c runs them (answer, advance, the requests' way
 * back), start_checks.c and lookup.c hold the phases of their own.
 */
#ifndef KMIRROR_MIRROR_PREP_H
#define KMIRROR_MIRROR_PREP_H

#include <event2/event.h>
#include <openssl/ssl.h>
#include <stdbool.h>
#include <stdint.h>

#include "kmirror/cluster.h"
#include "kmirror/mirror.h"
#include "kmirror/msg/metadata_response.h"
#include "kmirror/rpc.h"
#include "mirror_int.h"

#define COMP KM_MIRROR_COMP

/* Kafka's codes the preparations answer or read (errors.tsv). */
enum {
	K_LEADER_NOT_AVAILABLE = 5,
	K_REQUEST_TIMED_OUT = 7,
	K_TOPIC_ALREADY_EXISTS = 36,
	K_INVALID_PARTITIONS = 37,
	K_INVALID_CONFIG = 40,
	K_CONCURRENT_TRANSACTIONS = 51,
};

/* DescribeConfigs' ConfigSource for a value set on the topic itself. */
#define K_DYNAMIC_TOPIC_CONFIG 1
/* DescribeConfigs resource type TOPIC. */
#define K_RESOURCE_TOPIC 2

/* A start waits this long at most (the CLI waits 30 s by default, the tests 20 s: they hear our answer first). */
#define PREP_TIMEOUT_MS 15000
/* Connection retries and the leaders' poll. */
#define RETRY_MS 200
/* Configs taken from one source topic, and retries that drop a config the destination refuses. */
#define MAX_CONFIGS 512
#define MAX_CREATE_TRIES 8
/*
 * Metadata records one CreateTopics may cost the destination's controller: a KRaft controller
 * refuses a request over its limit of 10,000 records per operation as a whole (POLICY_VIOLATION
 * "Unable to perform excessively large batch operation"). A topic costs a TopicRecord, a
 * PartitionRecord per partition and a ConfigRecord per config; the topics go in requests of at
 * most this many, one after the other (a topic over it alone goes alone, for the broker to judge).
 */
#define CREATE_RECORDS_MAX 5000
#define MAX_TOPICS 10000

/* Versions: Metadata v1+ (topic errors per name), DescribeConfigs v1+ (config_source), CreateTopics v4+ (-1 replication factor), Fetch v4-12 (topics by name). */
enum { META_LO = 1, META_HI = 12, DC_LO = 1, DC_HI = 4, CT_LO = 4, CT_HI = 7, CP_LO = 0, CP_HI = 3, FETCH_LO = 4, FETCH_HI = 12,
       LT_LO = 0, LT_HI = 2, DT_LO = 0, DT_HI = 0, LO_LO = 1, LO_HI = 10 };
/* A question of a batch lookup not answered yet (no wire code or km_err is this). */
#define LQ_PENDING INT32_MIN
/* A batch lookup answers within this (the proxy holds a client's ListOffsets meanwhile). */
#define LOOKUP_TIMEOUT_MS 5000
/* A search by timestamp reads this much per Fetch, this many Fetches at most; a compressed batch decompresses into at most this. */
#define SEARCH_FETCH_BYTES (1 << 20)
#define SEARCH_READS_MAX 16
#define SEARCH_BATCH_MAX (64 << 20)
/* A search's source that cannot be reached this long is not asked (the destination's answer stands). */
#define SEARCH_SOURCE_PATIENCE_MS 1500
/* A destination broker that cannot be reached this long is left out of the open-transactions check (logged). */
#define TXN_PATIENCE_MS 5000
/* Brokers asked for their open transactions; transactional ids described in one request. */
#define TXN_NODES_MAX 256
#define TXN_DESCRIBE_MAX 1000

typedef enum {
	P_DST_META, P_SRC_META, P_SRC_CFG, P_CREATE, P_LEADERS, P_GROW_PARTS, P_GROW_STATE,
	P_LOOKUP_META, P_LOOKUP_FETCH, /* km_mirror_batches_at */
	P_LOOKUP_SRC_META, P_LOOKUP_SRC_LO, /* and the source's answer where a marker was passed over */
	P_TXN_LIST, P_TXN_DESC,        /* open transactions on the topics a start makes read-only */
	P_DATA_META, P_DATA_ENDS,      /* records on a destination topic in no mirror here */
	P_SRC_PEER,                    /* and whether the start is a failback (the source's kmirrord) */
	P_DONE
} phase;

typedef struct pcfg {
	char *name, *value;
} pcfg;

typedef struct ptopic {
	char *name;
	km_err code;
	char *msg;
	bool missing;      /* not on the destination: ours to create */
	bool settled;      /* its answer is known */
	bool asked;        /* in the CreateTopics in flight */
	bool txn_check;    /* on the destination and writable: no client transaction may hold it open */
	bool data_check;   /* on the destination and in no mirror here: the records it holds are counted */
	bool peer_check;   /* it holds records: a start is a failback, or refused unless adopted */
	int32_t nparts;    /* data_check: its partitions' leaders, log starts and ends (-1: not known yet) */
	int32_t *leader;
	int64_t *lo, *hi;
	int32_t partitions;
	pcfg *cfg;
	size_t ncfg;
} ptopic;

struct km_mprep {
	struct km_mprep *next;
	km_mirror *mi;
	char *mirror;
	bool grow;         /* km_mirror_grow: t[0] with the source's count, no answer to give */
	int32_t dst_partitions;
	ptopic *t;
	size_t n;
	km_mirror_prepare_cb cb;
	void *arg;
	bool adopt;        /* StartMirrorTopics' AdoptExisting: a topic that holds records is started all the same */
	bool ends_latest;  /* the ListOffsets in flight asks the ends (else the log starts) */
	/* km_mirror_batches_at: the questions (their topics are t[]), the next one to fetch */
	km_mirror_batch_q *lq;
	size_t nlq, lq_next;
	km_mirror_batches_cb lcb;
	size_t lq_src;     /* the question the source is asked next */
	int32_t src_leader;  /* its partition's leader on the source (-1: Metadata first) */
	int64_t src_since;   /* when the source was first needed */
	char *src_mirror;    /* the mirror src is the source of */
	/* the open-transactions check: the destination's brokers, the one asked, the ids it listed */
	int32_t nodes[TXN_NODES_MAX];
	size_t nnodes, node_next;
	char **tids;
	size_t ntids;
	int64_t node_since;
	km_cluster *src, *dst;
	SSL_CTX *src_tls;
	char src_boot[256];
	phase ph;
	bool inflight;
	bool finished;
	int create_tries;
	int64_t deadline;
	struct event *ev; /* retry, poll, and the deferred answer */
	char why[400];    /* the last connection failure, for a timeout's message */
};

/* A request's way back: the phase it was sent in says what its answer is (r->api_key's response). */
typedef struct rctx {
	struct km_mprep *p;
	km_cluster *cl;
	phase ph;
} rctx;

/* ---- topics.c: the machinery every preparation runs on ---- */

/* The topic's answer (the first one set stays), with a message when code is not OK. */
void km_prep_set_code(ptopic *t, km_err code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void km_prep_free_tids(struct km_mprep *p);
void km_prep_free(struct km_mprep *p);
/* advance(p) in ms (never from inside the caller: the event loop calls it). */
void km_prep_later(struct km_mprep *p, int ms);
void km_prep_on_ev(evutil_socket_t fd, short what, void *arg);
/* A cluster's on_change: advance unless a request is out. */
void km_prep_on_cluster(void *arg);
/* A ready client of cl, or NULL (why noted; advance is called again). */
km_net_client *km_prep_ready_client(struct km_mprep *p, km_cluster *cl);
/* req (the km_<name>_request of key) to c; its answer goes to the phase p is in now. */
void km_prep_send_req(struct km_mprep *p, km_cluster *cl, km_net_client *c, int16_t key, int16_t ver, const void *req);
/* Metadata of the topics (only the missing ones: only_missing) from cl. */
void km_prep_send_metadata(struct km_mprep *p, km_cluster *cl, bool only_missing);
ptopic *km_prep_topic_of(struct km_mprep *p, km_str name);
/* Topics still to create: missing on the destination and not answered yet. */
size_t km_prep_to_create(const struct km_mprep *p);
/* The mirror's source (made once); false when it is unusable (the topics which() names answered). */
bool km_prep_src_cluster(struct km_mprep *p, bool (*which)(const ptopic *));

/* ---- start_checks.c: the checks of a topic there before a start makes it read-only ---- */

/*
 * t is on the destination (mt its Metadata): whether a start of it needs the checks (it is
 * writable through kmirrord now): a client's open transaction on it, and (in no mirror here) the
 * records it holds. The first check phase is P_TXN_LIST.
 */
bool km_prep_check_existing(struct km_mprep *p, ptopic *t, const km_metadata_response_topic *mt);
/* The request of the check phase p is in (P_TXN_LIST to P_SRC_PEER). */
void km_prep_checks_send(struct km_mprep *p);
/* Its answer (r->msg) taken: the delay before advance (RETRY_MS after a broker's error). */
int km_prep_checks_took(struct km_mprep *p, phase ph, const km_rpc_response *r);

/* ---- lookup.c: a destination partition searched by timestamp (km_mirror_batches_at) ---- */

void km_prep_lookup_send(struct km_mprep *p);
void km_prep_lookup_took(struct km_mprep *p, phase ph, const km_rpc_response *r);

#endif
