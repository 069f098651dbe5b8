/* Destination topics that follow the source: created at StartMirrorTopics with the source's partitions and configs, grown when the source grows (docs/mirror.md, "Destination topics"). */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "kmirror/api.h"
#include "kmirror/batch.h"
#include "kmirror/log.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/create_partitions_request.h"
#include "kmirror/msg/create_partitions_response.h"
#include "kmirror/msg/create_topics_request.h"
#include "kmirror/msg/create_topics_response.h"
#include "kmirror/msg/describe_configs_request.h"
#include "kmirror/msg/describe_configs_response.h"
#include "kmirror/msg/describe_transactions_request.h"
#include "kmirror/msg/describe_transactions_response.h"
#include "kmirror/msg/fetch_request.h"
#include "kmirror/msg/fetch_response.h"
#include "kmirror/msg/last_mirrored_offsets_request.h"
#include "kmirror/msg/last_mirrored_offsets_response.h"
#include "kmirror/msg/list_transactions_request.h"
#include "kmirror/msg/list_offsets_request.h"
#include "kmirror/msg/list_offsets_response.h"
#include "kmirror/msg/list_transactions_response.h"
#include "kmirror/msg/metadata_request.h"
#include "kmirror/msg/metadata_response.h"
#include "kmirror/rpc.h"
#include "mirror_int.h"

#define COMP KM_MIRROR_COMP

/* Kafka's codes this file answers or reads (errors.tsv). */
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

/* ---- which source configs a created destination topic gets ---- */

/*
 * Never copied (docs/mirror.md, "Destination topics"): replication throttles name the source's
 * brokers; confluent.* and message.format.version / message.downconversion.enable are a vendor's
 * or an old broker's and a 4.x destination refuses them; the timestamp bounds would make the
 * destination refuse the source's old (or future) records; min.insync.replicas and the tiered
 * storage keys are the destination's own durability and storage policy; compression.type is always
 * "producer" (set below); mirror.name is kmirror's own.
 */
static const char *const never_copied[] = {
	"leader.replication.throttled.replicas",
	"follower.replication.throttled.replicas",
	"message.format.version",
	"message.downconversion.enable",
	"message.timestamp.difference.max.ms",
	"message.timestamp.before.max.ms",
	"message.timestamp.after.max.ms",
	"min.insync.replicas",
	"remote.storage.enable",
	"local.retention.ms",
	"local.retention.bytes",
	"remote.log.copy.disable",
	"remote.log.delete.on.disable",
	"compression.type",
	"mirror.name",
};

bool km_mirror_config_copied(const char *name, int8_t source, const char **value)
{
	if (!name || !*name || !value || !*value || source != K_DYNAMIC_TOPIC_CONFIG)
		return false;
	if (!strncmp(name, "confluent.", 10))
		return false;
	for (size_t i = 0; i < sizeof(never_copied) / sizeof(*never_copied); i++)
		if (!strcmp(name, never_copied[i]))
			return false;
	/*
	 * A LogAppendTime destination refuses the batches the source stamped (INVALID_TIMESTAMP) and
	 * re-stamps the rest: CreateTime keeps the source's timestamps, which is what the mirror shows.
	 */
	if (!strcmp(name, "message.timestamp.type") && !strcmp(*value, "LogAppendTime"))
		*value = "CreateTime";
	return true;
}

/* ---- one StartMirrorTopics' preparation ---- */

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

static int64_t now_ms(void)
{
	struct timeval tv;
	gettimeofday(&tv, NULL);
	return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

static void set_code(ptopic *t, km_err code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_code(ptopic *t, km_err code, const char *fmt, ...)
{
	char buf[600];
	va_list ap;

	if (t->settled)
		return;
	t->settled = true;
	t->code = code;
	if (code && fmt) {
		va_start(ap, fmt);
		vsnprintf(buf, sizeof(buf), fmt, ap);
		va_end(ap);
		t->msg = strdup(buf);
	}
}

/* The transactional ids the broker being asked listed (the open-transactions check). */
static void free_tids(struct km_mprep *p)
{
	for (size_t i = 0; i < p->ntids; i++)
		free(p->tids[i]);
	free(p->tids);
	p->tids = NULL;
	p->ntids = 0;
}

static void prep_free(struct km_mprep *p)
{
	/* The clusters first: their pending requests fail now, while p is still there to see it finished. */
	km_cluster_free(p->src);
	km_cluster_free(p->dst);
	p->src = p->dst = NULL;
	if (p->src_tls)
		SSL_CTX_free(p->src_tls);
	for (size_t i = 0; i < p->n; i++) {
		for (size_t j = 0; j < p->t[i].ncfg; j++) {
			free(p->t[i].cfg[j].name);
			free(p->t[i].cfg[j].value);
		}
		free(p->t[i].cfg);
		free(p->t[i].leader);
		free(p->t[i].lo);
		free(p->t[i].hi);
		free(p->t[i].name);
		free(p->t[i].msg);
	}
	free(p->t);
	free(p->src_mirror);
	free_tids(p);
	if (p->ev)
		event_free(p->ev);
	free(p->mirror);
	free(p);
}

static void unlink_prep(struct km_mprep *p)
{
	struct km_mprep **pp = km_mirror_prep_list(p->mi);
	for (; *pp; pp = &(*pp)->next)
		if (*pp == p) {
			*pp = p->next;
			return;
		}
}

/* Answer (every topic not settled is OK: it exists on the destination, the store takes it from there). */
static void answer(struct km_mprep *p)
{
	km_state_topic_result *res = calloc(p->n ? p->n : 1, sizeof(*res));

	unlink_prep(p);
	p->finished = true;
	for (size_t i = 0; res && i < p->n; i++) {
		res[i].topic = p->t[i].name;
		res[i].code = p->t[i].settled ? p->t[i].code : KM_OK;
		res[i].message = res[i].code ? (p->t[i].msg ? p->t[i].msg : km_err_message(res[i].code)) : NULL;
	}
	if (p->lq) {
		for (size_t i = 0; i < p->nlq; i++)
			if (p->lq[i].code == LQ_PENDING)
				p->lq[i].code = p->n && p->t[0].settled && p->t[0].code ? p->t[0].code : K_REQUEST_TIMED_OUT;
		p->lcb(p->arg, p->lq, p->nlq);
	} else if (p->grow) {
		if (p->n && p->t[0].settled && p->t[0].code)
			KM_WARN(COMP, 0, "%s: growing topic %s to %d partitions: %s", p->mirror, p->t[0].name,
				(int)p->t[0].partitions, p->t[0].msg ? p->t[0].msg : km_err_name(p->t[0].code));
	} else if (res) {
		p->cb(p->arg, KM_OK, NULL, res, p->n);
	} else {
		p->cb(p->arg, KM_MIRROR_STATE_UNAVAILABLE, "out of memory", NULL, 0);
	}
	free(res);
	prep_free(p);
}

static void advance(struct km_mprep *p);

static void on_ev(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	advance(arg);
}

static void later(struct km_mprep *p, int ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	if (!p->finished)
		event_add(p->ev, &tv);
}

static void on_cluster(void *arg)
{
	struct km_mprep *p = arg;
	if (!p->finished && !p->inflight)
		later(p, 0);
}

/* A ready client of cl, or NULL (why noted; the cluster's on_change or the retry timer calls again). */
static km_net_client *ready_client(struct km_mprep *p, km_cluster *cl)
{
	km_net_client *c = km_cluster_any(cl);
	const char *r = km_cluster_last_error(cl);
	if (km_cluster_usable(cl, c))
		return c;
	/* The cluster replaces a failed client itself: its last failure says why we still wait. */
	if (*r && cl == p->src)
		snprintf(p->why, sizeof(p->why), "the source cluster (%s) cannot be reached: %s", p->src_boot, r);
	else if (*r)
		snprintf(p->why, sizeof(p->why), "the destination cannot be reached: %s", r);
	else if (!c)
		snprintf(p->why, sizeof(p->why), "cannot connect to the %s cluster", km_cluster_side(cl));
	later(p, RETRY_MS);
	return NULL;
}

/* A request's way back: the phase it was sent in says what its answer is (r->api_key's response). */
typedef struct rctx {
	struct km_mprep *p;
	km_cluster *cl;
	phase ph;
} rctx;

static void took_grow(struct km_mprep *p, const km_create_partitions_response *r)
{
	const km_create_partitions_response_create_partitions_topic_result *res =
		r->results.count > 0 ? &r->results.items[0] : NULL;
	/* INVALID_PARTITIONS: it has that many already (a racing call, or an operator did it). */
	if (res && (res->error_code == 0 || res->error_code == K_INVALID_PARTITIONS)) {
		if (!res->error_code)
			KM_INFO(COMP, 0, "%s: destination topic %s grown from %d to %d partitions", p->mirror, p->t[0].name,
				(int)p->dst_partitions, (int)p->t[0].partitions);
		p->ph = P_GROW_STATE;
		return;
	}
	set_code(&p->t[0], res ? res->error_code : KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION,
		 "CreatePartitions on the destination failed: %s%s%.*s", km_err_name(res ? res->error_code : 3),
		 res && res->error_message.len > 0 ? ": " : "",
		 res && res->error_message.len > 0 ? (int)res->error_message.len : 0, res ? res->error_message.p : "");
	p->ph = P_DONE;
}

static void on_response(km_net_client *c, const km_rpc_response *r, void *arg);

/* req: the km_<name>_request of key, encoded by the API table. */
static void send_req(struct km_mprep *p, km_cluster *cl, km_net_client *c, int16_t key, int16_t ver, const void *req)
{
	rctx *x = calloc(1, sizeof(*x));
	km_err rc;

	if (!x) {
		rc = KM_ERR_NOMEM;
	} else {
		*x = (rctx){p, cl, p->ph};
		rc = km_rpc_call(c, key, ver, req, NULL, on_response, x);
	}
	if (rc == KM_OK) {
		p->inflight = true;
		return;
	}
	free(x);
	snprintf(p->why, sizeof(p->why), "sending to the %s failed: %s", km_cluster_side(cl), km_err_name(rc));
	km_cluster_drop(cl, c);
	later(p, RETRY_MS);
}

/* Metadata of the topics that match want (missing ones for the source; the created ones for the leaders). */
static void send_metadata(struct km_mprep *p, km_cluster *cl, bool only_missing)
{
	km_net_client *c = ready_client(p, cl);
	km_metadata_request m;
	km_metadata_request_topic *ts;
	int16_t ver;
	int32_t k = 0;

	if (!c)
		return;
	if ((ver = km_net_version_pick(c, KM_API_METADATA, META_LO, META_HI)) < 0) {
		for (size_t i = 0; i < p->n; i++)
			if (!only_missing || p->t[i].missing)
				set_code(&p->t[i], KM_KAFKA_UNSUPPORTED_VERSION, "the %s cluster does not support Metadata v%d+",
					 km_cluster_side(cl), META_LO);
		p->ph = P_DONE;
		later(p, 0);
		return;
	}
	if (!(ts = calloc(p->n, sizeof(*ts))))
		return later(p, RETRY_MS);
	km_metadata_request_init(&m);
	for (size_t i = 0; i < p->n; i++) {
		if ((only_missing && !p->t[i].missing) || (only_missing && p->t[i].settled))
			continue;
		km_metadata_request_topic_init(&ts[k]);
		ts[k++].name = km_str_c(p->t[i].name);
	}
	m.topics.items = ts;
	m.topics.count = k;
	m.allow_auto_topic_creation = false;
	send_req(p, cl, c, KM_API_METADATA, ver, &m);
	free(ts); /* encoded in the call */
}

static ptopic *topic_of(struct km_mprep *p, km_str name)
{
	for (size_t i = 0; i < p->n; i++)
		if (name.len >= 0 && strlen(p->t[i].name) == (size_t)name.len && !memcmp(p->t[i].name, name.p, (size_t)name.len))
			return &p->t[i];
	return NULL;
}

/* Topics still to create: missing on the destination and not answered yet. */
static size_t to_create(const struct km_mprep *p)
{
	size_t n = 0;
	for (size_t i = 0; i < p->n; i++)
		if (p->t[i].missing && !p->t[i].settled)
			n++;
	return n;
}

static bool writable_here(const struct km_mprep *p, const char *topic);
static bool take_leaders(ptopic *t, const km_metadata_response_topic *mt);

static void took_dst_meta(struct km_mprep *p, const km_metadata_response *r)
{
	if (p->grow) {
		const km_metadata_response_topic *mt = r->topics.count > 0 ? &r->topics.items[0] : NULL;
		if (!mt || mt->error_code) {
			set_code(&p->t[0], mt ? mt->error_code : KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION,
				 "Metadata of topic %s on the destination failed: %s", p->t[0].name,
				 km_err_name(mt ? mt->error_code : KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION));
			p->ph = P_DONE;
			return;
		}
		p->dst_partitions = mt->partitions.count;
		p->ph = p->dst_partitions < p->t[0].partitions ? P_GROW_PARTS : P_GROW_STATE;
		return;
	}
	bool any = false;
	for (int32_t i = 0; i < r->topics.count; i++) {
		ptopic *t = topic_of(p, r->topics.items[i].name);
		const km_state *st = km_mirror_store(p->mi);
		if (t && r->topics.items[i].error_code == KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION) {
			t->missing = true;
		} else if (t && !r->topics.items[i].error_code && !t->settled && writable_here(p, t->name)) {
			t->txn_check = any = true;
			/* In no mirror here: whatever it holds, no mirror of this kmirrord wrote it. */
			if (st && !km_state_topic_find(st, t->name, strlen(t->name)) && take_leaders(t, &r->topics.items[i]))
				t->data_check = true;
		}
		/* Any other outcome (an error of its own): the store's own check answers it. */
	}
	if (any) {
		if (km_cluster_brokers(p->dst, r) == KM_OK)
			p->nnodes = km_cluster_node_ids(p->dst, p->nodes, TXN_NODES_MAX);
		p->node_next = 0;
		p->node_since = now_ms();
		p->ph = P_TXN_LIST;
		return;
	}
	p->ph = to_create(p) ? P_SRC_META : P_DONE;
}

/* ---- open transactions on a topic the start makes read-only (docs/mirror.md, "A transaction that is not the mirror's") ---- */

/* Whether topic is writable through kmirrord now (in no mirror, or this mirror's and STOPPED): a client may hold it in a transaction. */
static bool writable_here(const struct km_mprep *p, const char *topic)
{
	const km_state_topic *t = km_mirror_store(p->mi) ? km_state_topic_find(km_mirror_store(p->mi), topic, strlen(topic)) : NULL;
	if (!t)
		return true;
	if (strcmp(km_state_mirror_name(km_state_topic_mirror(t)), p->mirror))
		return false; /* another mirror's: the store refuses it */
	for (size_t i = 0; i < km_state_topic_partition_count(t); i++)
		if (!km_state_topic_read_only(t, (int32_t)i))
			return true;
	return false;
}

static void txn_next_node(struct km_mprep *p)
{
	free_tids(p);
	p->node_next++;
	p->node_since = now_ms();
	p->ph = P_TXN_LIST;
}

/* The checked topics' transactions are known: on to the records they hold. */
static void txn_checked(struct km_mprep *p)
{
	p->ph = P_DATA_ENDS;
}

/*
 * ListTransactions on each destination broker in turn: the transactions its coordinator holds that
 * are not ended. A broker that stays unreachable for TXN_PATIENCE_MS is left out (logged): the
 * pipeline's own check of the partition's last stable offset still holds a start whose
 * transaction has written records there.
 */
static void send_txn_list(struct km_mprep *p)
{
	static const char *const open_states[] = {"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"};
	km_str states[sizeof(open_states) / sizeof(*open_states)];
	km_list_transactions_request m;
	km_net_client *c;
	int16_t ver;

	if (p->node_next >= p->nnodes) {
		txn_checked(p);
		return later(p, 0);
	}
	c = km_cluster_node(p->dst, p->nodes[p->node_next]);
	if (!km_cluster_usable(p->dst, c)) {
		if (now_ms() - p->node_since < TXN_PATIENCE_MS)
			return later(p, RETRY_MS);
		KM_WARN(COMP, 0, "%s: destination broker %d cannot be reached (%s): its open transactions are not checked "
			"before the start", p->mirror, (int)p->nodes[p->node_next], km_cluster_last_error(p->dst));
		txn_next_node(p);
		return later(p, 0);
	}
	if ((ver = km_net_version_pick(c, KM_API_LIST_TRANSACTIONS, LT_LO, LT_HI)) < 0) {
		KM_INFO(COMP, 0, "%s: the destination cannot list transactions (before Kafka 3.0): open transactions are "
			"not checked before the start", p->mirror);
		txn_checked(p);
		return later(p, 0);
	}
	km_list_transactions_request_init(&m);
	for (size_t i = 0; i < sizeof(open_states) / sizeof(*open_states); i++)
		states[i] = km_str_c(open_states[i]);
	m.state_filters.items = states;
	m.state_filters.count = (int32_t)(sizeof(open_states) / sizeof(*open_states));
	send_req(p, p->dst, c, KM_API_LIST_TRANSACTIONS, ver, &m);
}

/*
 * The ids the broker listed that are not kmirrord's own (kmirror/...): described next, on the same
 * broker (their coordinator). False on the broker's error.
 */
static bool took_txn_list(struct km_mprep *p, const km_list_transactions_response *r)
{
	if (r->error_code) {
		snprintf(p->why, sizeof(p->why), "ListTransactions on destination broker %d failed: %s",
			 (int)p->nodes[p->node_next], km_err_name(r->error_code));
		return false;
	}
	for (int32_t i = 0; i < r->transaction_states.count && p->ntids < TXN_DESCRIBE_MAX; i++) {
		km_str id = r->transaction_states.items[i].transactional_id;
		char **nt;
		if (id.len <= 0 || (id.len >= 8 && !memcmp(id.p, "kmirror/", 8)))
			continue;
		if (!(nt = realloc(p->tids, (p->ntids + 1) * sizeof(*nt))))
			break;
		p->tids = nt;
		if ((nt[p->ntids] = strndup(id.p, (size_t)id.len)))
			p->ntids++;
	}
	if (p->ntids)
		p->ph = P_TXN_DESC;
	else
		txn_next_node(p);
	return true;
}

static void send_txn_describe(struct km_mprep *p)
{
	km_net_client *c = km_cluster_node(p->dst, p->nodes[p->node_next]);
	km_describe_transactions_request m;
	km_str *ids;
	int16_t ver;

	if (!km_cluster_usable(p->dst, c))
		return later(p, RETRY_MS);
	if ((ver = km_net_version_pick(c, KM_API_DESCRIBE_TRANSACTIONS, DT_LO, DT_HI)) < 0 ||
	    !(ids = calloc(p->ntids, sizeof(*ids)))) {
		txn_next_node(p);
		return later(p, 0);
	}
	for (size_t i = 0; i < p->ntids; i++)
		ids[i] = km_str_c(p->tids[i]);
	km_describe_transactions_request_init(&m);
	m.transactional_ids.items = ids;
	m.transactional_ids.count = (int32_t)p->ntids;
	send_req(p, p->dst, c, KM_API_DESCRIBE_TRANSACTIONS, ver, &m);
	free(ids); /* encoded in the call */
}

/* A transaction that holds a partition of a checked topic refuses that topic's start (its marker would land in the mirror topic). */
static void took_txn_describe(struct km_mprep *p, const km_describe_transactions_response *r)
{
	int64_t now = now_ms();
	for (int32_t i = 0; i < r->transaction_states.count; i++) {
		const km_describe_transactions_response_transaction_state *ts = &r->transaction_states.items[i];
		if (ts->error_code || km_str_eq_c(ts->transaction_state, "Empty") ||
		    km_str_eq_c(ts->transaction_state, "CompleteCommit") || km_str_eq_c(ts->transaction_state, "CompleteAbort"))
			continue; /* ended since the listing, or its coordinator moved (NOT_COORDINATOR) */
		for (int32_t k = 0; k < ts->topics.count; k++) {
			const km_describe_transactions_response_topic_data *td = &ts->topics.items[k];
			ptopic *t = topic_of(p, td->topic);
			int64_t age = ts->transaction_start_time_ms > 0 ? (now - ts->transaction_start_time_ms) / 1000 : -1;
			int64_t left = ts->transaction_timeout_ms > 0 && age >= 0 ? ts->transaction_timeout_ms / 1000 - age : -1;
			if (!t || !t->txn_check || t->settled || td->partitions.count <= 0)
				continue;
			set_code(t, K_CONCURRENT_TRANSACTIONS,
				 "Topic %s is not started: transactional id '%.*s' (producer id %lld, %.*s for %lld s) holds "
				 "partition %s-%d in a transaction on the destination; whenever it ends, its marker is "
				 "written into the partition, which would then be a read-only mirror topic. Let its "
				 "producer commit or abort it (or wait for its timeout, %lld s from now at most), then "
				 "start the topic again",
				 t->name, (int)ts->transactional_id.len, ts->transactional_id.p, (long long)ts->producer_id,
				 (int)ts->transaction_state.len, ts->transaction_state.p, (long long)(age > 0 ? age : 0),
				 t->name, (int)td->partitions.items[0], (long long)(left > 0 ? left : 0));
		}
	}
	txn_next_node(p);
}

/* ---- a destination topic that already holds records (docs/mirror.md, "A destination topic that holds records") ---- */

/* t's partitions and their leaders from the destination's Metadata; false when out of memory (the check is left out). */
static bool take_leaders(ptopic *t, const km_metadata_response_topic *mt)
{
	int32_t n = mt->partitions.count > 0 ? mt->partitions.count : 0;

	free(t->leader);
	free(t->lo);
	free(t->hi);
	t->leader = calloc((size_t)n + 1, sizeof(*t->leader));
	t->lo = malloc(((size_t)n + 1) * sizeof(*t->lo));
	t->hi = malloc(((size_t)n + 1) * sizeof(*t->hi));
	t->nparts = 0;
	if (!t->leader || !t->lo || !t->hi)
		return false;
	for (int32_t i = 0; i < n; i++) {
		int32_t k = mt->partitions.items[i].partition_index;
		if (k < 0 || k >= n)
			continue;
		t->leader[k] = mt->partitions.items[i].error_code ? -1 : mt->partitions.items[i].leader_id;
		t->lo[k] = t->hi[k] = -1;
	}
	t->nparts = n;
	return true;
}

/* Leaders moved (or were not elected): Metadata again, then the offsets not known yet. */
static void took_data_meta(struct km_mprep *p, const km_metadata_response *r)
{
	if (km_cluster_brokers(p->dst, r) != KM_OK)
		snprintf(p->why, sizeof(p->why), "the destination's brokers could not be taken from its Metadata");
	for (int32_t i = 0; i < r->topics.count; i++) {
		const km_metadata_response_topic *mt = &r->topics.items[i];
		ptopic *t = topic_of(p, mt->name);
		if (!t || !t->data_check || t->settled || mt->error_code)
			continue;
		for (int32_t k = 0; k < mt->partitions.count; k++) {
			int32_t id = mt->partitions.items[k].partition_index;
			if (id >= 0 && id < t->nparts)
				t->leader[id] = mt->partitions.items[k].error_code ? -1 : mt->partitions.items[k].leader_id;
		}
	}
	p->ph = P_DATA_ENDS;
}

/* Whether a topic counted holds records, and what the refusal says of them. */
static int64_t held_records(const ptopic *t, char *where, size_t len)
{
	int64_t held = 0;
	int32_t first = -1, more = 0;

	for (int32_t k = 0; k < t->nparts; k++) {
		if (t->hi[k] <= t->lo[k])
			continue;
		held += t->hi[k] - t->lo[k];
		if (first < 0)
			first = k;
		else
			more++;
	}
	if (first >= 0 && more)
		snprintf(where, len, "partition %d: offsets %lld to %lld, and %d partition(s) more", (int)first,
			 (long long)t->lo[first], (long long)t->hi[first] - 1, (int)more);
	else if (first >= 0)
		snprintf(where, len, "partition %d: offsets %lld to %lld", (int)first, (long long)t->lo[first],
			 (long long)t->hi[first] - 1);
	return held;
}

/* Every checked topic's records are counted: those that hold some are a failback, or refused unless adopted. */
static void data_counted(struct km_mprep *p)
{
	bool ask = false;
	for (size_t i = 0; i < p->n; i++) {
		ptopic *t = &p->t[i];
		char where[160] = "";
		int64_t held;
		if (!t->data_check || t->settled || !(held = held_records(t, where, sizeof(where))))
			continue;
		if (p->adopt)
			KM_INFO(COMP, 0, "%s: topic %s holds records on the destination at %lld offset(s) (%s) that no "
				"mirror here wrote: adopted (AdoptExisting), the start hides them", p->mirror, t->name, (long long)held,
				where);
		else
			t->peer_check = ask = true;
	}
	p->ph = ask ? P_SRC_PEER : to_create(p) ? P_SRC_META : P_DONE;
}

/*
 * ListOffsets of the log starts, then of the ends, one leader at a time: every partition of the
 * checked topics that the leader of the first one not known yet leads.
 */
static void send_data_ends(struct km_mprep *p)
{
	km_list_offsets_request m;
	km_list_offsets_request_list_offsets_topic *lt;
	km_list_offsets_request_list_offsets_partition *lp;
	int32_t node = -2, nt = 0, np = 0, total = 0;
	km_net_client *c;
	int16_t ver;
	bool latest = false;

	for (size_t i = 0; i < p->n && node == -2; i++)
		for (int32_t k = 0; p->t[i].data_check && !p->t[i].settled && k < p->t[i].nparts && node == -2; k++)
			if (p->t[i].lo[k] < 0 || p->t[i].hi[k] < 0) {
				node = p->t[i].leader[k];
				latest = p->t[i].lo[k] >= 0;
				if (node < 0)
					snprintf(p->why, sizeof(p->why), "partition %s-%d has no leader on the destination",
						 p->t[i].name, (int)k);
			}
	if (node == -2) {
		data_counted(p);
		return later(p, 0);
	}
	c = node >= 0 ? km_cluster_node(p->dst, node) : NULL;
	if (!c) {
		p->ph = P_DATA_META;
		return later(p, RETRY_MS);
	}
	if (!km_cluster_usable(p->dst, c)) {
		snprintf(p->why, sizeof(p->why), "destination broker %d cannot be reached: %s", (int)node,
			 km_cluster_last_error(p->dst));
		return later(p, RETRY_MS);
	}
	if ((ver = km_net_version_pick(c, KM_API_LIST_OFFSETS, LO_LO, LO_HI)) < 0) {
		for (size_t i = 0; i < p->n; i++)
			if (p->t[i].data_check)
				set_code(&p->t[i], KM_KAFKA_UNSUPPORTED_VERSION,
					 "the destination does not support ListOffsets v%d+", LO_LO);
		p->ph = P_DONE;
		return later(p, 0);
	}
	for (size_t i = 0; i < p->n; i++)
		total += p->t[i].data_check ? p->t[i].nparts : 0;
	lt = calloc(p->n, sizeof(*lt));
	lp = calloc((size_t)total + 1, sizeof(*lp));
	if (!lt || !lp) {
		free(lt);
		free(lp);
		return later(p, RETRY_MS);
	}
	km_list_offsets_request_init(&m);
	m.replica_id = -1;
	m.isolation_level = 0;
	for (size_t i = 0; i < p->n; i++) {
		ptopic *t = &p->t[i];
		int32_t first = np;
		for (int32_t k = 0; t->data_check && !t->settled && k < t->nparts; k++) {
			if (t->leader[k] != node || (latest ? t->hi[k] : t->lo[k]) >= 0)
				continue;
			km_list_offsets_request_list_offsets_partition_init(&lp[np]);
			lp[np].partition_index = k;
			lp[np].current_leader_epoch = -1;
			lp[np++].timestamp = latest ? -1 : -2;
		}
		if (np == first)
			continue;
		km_list_offsets_request_list_offsets_topic_init(&lt[nt]);
		lt[nt].name = km_str_c(t->name);
		lt[nt].partitions.items = &lp[first];
		lt[nt++].partitions.count = np - first;
	}
	m.topics.items = lt;
	m.topics.count = nt;
	p->ends_latest = latest;
	send_req(p, p->dst, c, KM_API_LIST_OFFSETS, ver, &m);
	free(lt); /* encoded in the call */
	free(lp);
}

static void took_data_ends(struct km_mprep *p, const km_list_offsets_response *r)
{
	for (int32_t i = 0; i < r->topics.count; i++) {
		ptopic *t = topic_of(p, r->topics.items[i].name);
		for (int32_t k = 0; t && t->data_check && k < r->topics.items[i].partitions.count; k++) {
			const km_list_offsets_response_list_offsets_partition_response *pr = &r->topics.items[i].partitions.items[k];
			int32_t id = pr->partition_index;
			if (id < 0 || id >= t->nparts)
				continue;
			if (pr->error_code || pr->offset < 0) {
				/* A leader that moved (NOT_LEADER_OR_FOLLOWER and the like): Metadata again. */
				snprintf(p->why, sizeof(p->why), "ListOffsets of %s-%d on the destination: %s", t->name, (int)id,
					 km_err_name(pr->error_code));
				p->ph = P_DATA_META;
				continue;
			}
			if (p->ends_latest)
				t->hi[id] = pr->offset;
			else
				t->lo[id] = pr->offset;
		}
	}
}

/* The topics that hold records and are no failback: refused (the message says what to do). */
static void refuse_held(struct km_mprep *p)
{
	for (size_t i = 0; i < p->n; i++) {
		ptopic *t = &p->t[i];
		char where[160] = "";
		int64_t held;
		if (!t->peer_check || t->settled)
			continue;
		held = held_records(t, where, sizeof(where));
		set_code(t, K_TOPIC_ALREADY_EXISTS,
			 "Topic %s already holds records (or transaction markers) on the destination at %lld offset(s) "
			 "(%s) that no mirror here wrote, and "
			 "the source does not know it as mirrored from here (no failback). A start would hide them from "
			 "readers through kmirrord (they stay in the destination's log) and give their offsets to the "
			 "source's records. Read or copy them first, or mirror into a topic that does not exist yet; to "
			 "hide them and mirror, start again with --adopt-existing",
			 t->name, (long long)held, where);
	}
	p->ph = to_create(p) ? P_SRC_META : P_DONE;
}

/* The source cluster's connections (made once, for the peer question and a creation's reads); false when the mirror's source is unusable (the topics named settled). */
static bool src_cluster(struct km_mprep *p, bool (*which)(const ptopic *))
{
	const km_state_mirror *m;
	char why[300] = "";

	if (p->src)
		return true;
	m = km_state_mirror_find(km_mirror_store(p->mi), p->mirror);
	if (m)
		p->src = km_mirror_source_cluster(p->mi, m, "topics", 16 << 20, &p->src_tls, on_cluster, p, why, sizeof(why));
	if (p->src)
		return true;
	for (size_t i = 0; i < p->n; i++)
		if (which(&p->t[i]))
			set_code(&p->t[i], m ? KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG : KM_MIRROR_UNKNOWN_CLUSTER_MIRROR,
				 m ? "The source of mirror '%s' is unusable: %s" : "Cluster mirror '%s' does not exist%s",
				 p->mirror, why);
	p->ph = P_DONE;
	later(p, 0);
	return false;
}

static bool missing_one(const ptopic *t)
{
	return t->missing;
}

static bool peer_checked(const ptopic *t)
{
	return t->peer_check;
}

/*
 * Whether the source is a kmirrord that holds the topics in a mirror of its own (LastMirroredOffsets,
 * any mirror): a failback (docs/mirror.md, "Failback"), whose start keeps what is here below where
 * that mirror stopped. A plain Kafka source, or a topic it does not mirror: refused.
 */
static void send_src_peer(struct km_mprep *p)
{
	km_last_mirrored_offsets_request m;
	km_last_mirrored_offsets_request_topic_data *td;
	km_net_client *c;
	int16_t ver;
	int32_t k = 0;

	if (!src_cluster(p, peer_checked) || !(c = ready_client(p, p->src)))
		return;
	if ((ver = km_net_version_pick(c, KM_API_LAST_MIRRORED_OFFSETS, 0, 0)) < 0) {
		refuse_held(p);
		return later(p, 0);
	}
	if (!(td = calloc(p->n, sizeof(*td))))
		return later(p, RETRY_MS);
	km_last_mirrored_offsets_request_init(&m);
	m.mirror_name = km_str_c("");
	for (size_t i = 0; i < p->n; i++) {
		if (!p->t[i].peer_check || p->t[i].settled)
			continue;
		km_last_mirrored_offsets_request_topic_data_init(&td[k]);
		td[k].name = km_str_c(p->t[i].name);
		td[k++].partitions.count = -1;
	}
	m.topics.items = td;
	m.topics.count = k;
	send_req(p, p->src, c, KM_API_LAST_MIRRORED_OFFSETS, ver, &m);
	free(td); /* encoded in the call */
}

static void took_src_peer(struct km_mprep *p, const km_last_mirrored_offsets_response *r)
{
	for (int32_t i = 0; !r->error_code && i < r->topics.count; i++) {
		ptopic *t = topic_of(p, r->topics.items[i].name);
		if (t && t->peer_check && !r->topics.items[i].error_code) {
			t->peer_check = false; /* a failback: the pipeline compares the records before it trusts it */
			KM_INFO(COMP, 0, "%s: topic %s holds records on the destination and the source's kmirrord holds it "
				"in a mirror: a failback", p->mirror, t->name);
		}
	}
	refuse_held(p);
}

static void took_src_meta(struct km_mprep *p, const km_metadata_response *r)
{
	for (int32_t i = 0; i < r->topics.count; i++) {
		const km_metadata_response_topic *mt = &r->topics.items[i];
		ptopic *t = topic_of(p, mt->name);
		if (!t || !t->missing || t->settled)
			continue;
		if (mt->error_code == KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION)
			set_code(t, KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION,
				 "Topic %s exists neither on the destination cluster nor on the source cluster (%s) of "
				 "mirror '%s'",
				 t->name, p->src_boot, p->mirror);
		else if (mt->error_code)
			set_code(t, mt->error_code, "Metadata of topic %s on the source cluster (%s) failed: %s", t->name,
				 p->src_boot, km_err_name(mt->error_code));
		else if (mt->partitions.count <= 0 || mt->partitions.count > 100000)
			set_code(t, KM_KAFKA_INVALID_REQUEST, "Topic %s has %d partitions on the source", t->name,
				 (int)mt->partitions.count);
		else
			t->partitions = mt->partitions.count;
	}
	/* A topic the answer did not name is not known there either. */
	for (size_t i = 0; i < p->n; i++)
		if (p->t[i].missing && !p->t[i].settled && p->t[i].partitions <= 0)
			set_code(&p->t[i], KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION,
				 "Topic %s exists neither on the destination cluster nor on the source cluster (%s) of "
				 "mirror '%s'",
				 p->t[i].name, p->src_boot, p->mirror);
	p->ph = to_create(p) ? P_SRC_CFG : P_DONE;
}

static bool add_cfg(ptopic *t, const char *name, const char *value)
{
	pcfg *c;
	if (t->ncfg >= MAX_CONFIGS)
		return false;
	c = realloc(t->cfg, (t->ncfg + 1) * sizeof(*c));
	if (!c)
		return false;
	t->cfg = c;
	c[t->ncfg].name = strdup(name);
	c[t->ncfg].value = strdup(value);
	if (!c[t->ncfg].name || !c[t->ncfg].value) {
		free(c[t->ncfg].name);
		free(c[t->ncfg].value);
		return false;
	}
	t->ncfg++;
	return true;
}

static void took_src_cfg(struct km_mprep *p, const km_describe_configs_response *r)
{
	for (int32_t i = 0; i < r->results.count; i++) {
		const km_describe_configs_response_describe_configs_result *res = &r->results.items[i];
		ptopic *t = topic_of(p, res->resource_name);
		if (!t || !t->missing || t->settled)
			continue;
		if (res->error_code) {
			set_code(t, res->error_code, "DescribeConfigs of topic %s on the source cluster failed: %.*s", t->name,
				 res->error_message.len > 0 ? (int)res->error_message.len : 0, res->error_message.p);
			continue;
		}
		for (int32_t j = 0; j < res->configs.count; j++) {
			const km_describe_configs_response_describe_configs_resource_result *c = &res->configs.items[j];
			char name[256], value[4096];
			const char *v = value;
			if (c->name.len <= 0 || (size_t)c->name.len >= sizeof(name) || c->value.len < 0 ||
			    (size_t)c->value.len >= sizeof(value) || c->is_sensitive)
				continue;
			memcpy(name, c->name.p, (size_t)c->name.len);
			name[c->name.len] = 0;
			memcpy(value, c->value.p, (size_t)c->value.len);
			value[c->value.len] = 0;
			if (km_mirror_config_copied(name, c->config_source, &v) && !add_cfg(t, name, v))
				KM_WARN(COMP, 0, "%s: topic %s: config %s not copied (too many or out of memory)", p->mirror,
					t->name, name);
		}
	}
	p->ph = P_CREATE;
}

/* Drop the config the destination named in its refusal ("Unknown topic config name: x"); false if none is named. */
static bool drop_refused(struct km_mprep *p, ptopic *t, km_str msg)
{
	for (size_t j = 0; j < t->ncfg; j++) {
		size_t l = strlen(t->cfg[j].name);
		for (int32_t k = 0; msg.len > 0 && (size_t)msg.len >= l && k + (int32_t)l <= msg.len; k++) {
			char after = k + (int32_t)l < msg.len ? msg.p[k + l] : 0;
			char before = k ? msg.p[k - 1] : ' ';
			if (memcmp(msg.p + k, t->cfg[j].name, l) || (after && (after == '.' || after == '_' ||
									   (after >= 'a' && after <= 'z'))) ||
			    before == '.')
				continue;
			KM_WARN(COMP, 0, "%s: topic %s: the destination refuses config %s=%s (%.*s): created without it",
				p->mirror, t->name, t->cfg[j].name, t->cfg[j].value, (int)msg.len, msg.p);
			free(t->cfg[j].name);
			free(t->cfg[j].value);
			t->cfg[j] = t->cfg[--t->ncfg];
			return true;
		}
	}
	return false;
}

static void took_create(struct km_mprep *p, const km_create_topics_response *r)
{
	bool retry = false;
	for (int32_t i = 0; i < r->topics.count; i++) {
		const km_create_topics_response_creatable_topic_result *res = &r->topics.items[i];
		ptopic *t = topic_of(p, res->name);
		if (!t || !t->missing || t->settled || !t->asked)
			continue;
		t->asked = false;
		if (res->error_code == 0 || res->error_code == K_TOPIC_ALREADY_EXISTS) {
			if (!res->error_code)
				KM_INFO(COMP, 0, "%s: created destination topic %s: %d partitions, %zu configs from the source",
					p->mirror, t->name, (int)t->partitions, t->ncfg);
			t->missing = false; /* now there: wait for its leaders */
			continue;
		}
		if (res->error_code == K_INVALID_CONFIG && p->create_tries < MAX_CREATE_TRIES &&
		    drop_refused(p, t, res->error_message)) {
			retry = true;
			continue;
		}
		set_code(t, res->error_code, "Creating topic %s on the destination failed: %s%s%.*s", t->name,
			 km_err_name(res->error_code), res->error_message.len > 0 ? ": " : "",
			 res->error_message.len > 0 ? (int)res->error_message.len : 0, res->error_message.p);
	}
	if (retry)
		p->create_tries++;
	for (size_t i = 0; i < p->n; i++)
		if (p->t[i].asked) {
			p->t[i].asked = false;
			set_code(&p->t[i], KM_MIRROR_STATE_UNAVAILABLE, "Creating topic %s: no answer for it", p->t[i].name);
		}
	if (to_create(p))
		return; /* P_CREATE again: the next topics, or these without the refused config */
	p->ph = P_LEADERS;
}

/*
 * Whether every created topic has all its partitions led. A topic is settled (OK: the store takes
 * it) as soon as it is led, so that a start of thousands of topics that runs out of time refuses
 * only those still without leaders, not all. One pass over the answer: each topic looked up in
 * the whole answer would be quadratic in the topics per poll (topic_of is linear).
 */
static bool took_leaders(struct km_mprep *p, const km_metadata_response *r)
{
	bool all = true;
	for (int32_t k = 0; k < r->topics.count; k++) {
		const km_metadata_response_topic *mt = &r->topics.items[k];
		ptopic *t = topic_of(p, mt->name);
		bool ok;
		if (!t || t->settled || t->partitions <= 0 || mt->error_code)
			continue;
		ok = mt->partitions.count >= t->partitions;
		for (int32_t j = 0; ok && j < mt->partitions.count; j++)
			if (mt->partitions.items[j].error_code || mt->partitions.items[j].leader_id < 0)
				ok = false;
		if (ok)
			set_code(t, KM_OK, NULL);
	}
	for (size_t i = 0; i < p->n; i++)
		if (!p->t[i].settled && p->t[i].partitions > 0)
			all = false;
	return all;
}

/* ---- batch lookups (km_mirror_batches_at) ---- */

/* The leader of every question's partition, from the destination's metadata (questions without one are answered). */
static void took_lookup_meta(struct km_mprep *p, const km_metadata_response *r)
{
	if (km_cluster_brokers(p->dst, r) != KM_OK) {
		snprintf(p->why, sizeof(p->why), "out of memory");
		return;
	}
	for (size_t i = 0; i < p->nlq; i++) {
		km_mirror_batch_q *q = &p->lq[i];
		q->code = KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION;
		for (int32_t k = 0; k < r->topics.count; k++) {
			const km_metadata_response_topic *t = &r->topics.items[k];
			if (!km_str_eq_c(t->name, q->topic))
				continue;
			for (int32_t j = 0; j < t->partitions.count; j++)
				if (t->partitions.items[j].partition_index == q->partition) {
					q->leader = t->partitions.items[j].leader_id;
					q->code = t->error_code ? t->error_code : t->partitions.items[j].error_code;
					if (!q->code && q->leader < 0)
						q->code = K_LEADER_NOT_AVAILABLE;
					if (!q->code)
						q->code = LQ_PENDING; /* to fetch */
				}
		}
	}
	p->lq_next = 0;
	p->ph = P_LOOKUP_FETCH;
}

/*
 * The first record at or after q->offset, in a data batch, whose timestamp reaches q->timestamp,
 * among the batches of records; q->next moves past each batch read. True when found.
 */
static bool search_batches(km_mirror_batch_q *q, const km_bytes *records, int64_t log_start, int64_t end)
{
	km_batch_iter it;
	km_batch b;
	bool found = false;

	km_batch_iter_init(&it, records->p, records->len > 0 ? (size_t)records->len : 0);
	while (!found && km_batch_next(&it, &b)) {
		int64_t last = b.base_offset + b.last_offset_delta;
		uint8_t *scratch = NULL;
		km_record_iter ri;
		km_record rec;

		if (b.base_offset >= end)
			break;
		if (last >= q->next)
			q->next = last + 1;
		/* A control batch is the mirror's own marker, with the destination's clock: the source tells its own. */
		if (b.control && last >= q->offset && q->marker < 0)
			q->marker = b.base_offset;
		if (last < q->offset || b.control || b.max_timestamp < q->timestamp)
			continue;
		if (q->lat) {
			q->found_offset = b.base_offset > log_start ? b.base_offset : log_start;
			q->found_timestamp = b.max_timestamp;
			return true;
		}
		if (b.codec != KM_CODEC_NONE && !(scratch = malloc(SEARCH_BATCH_MAX)))
			continue;
		if (km_batch_records(&b, scratch, scratch ? SEARCH_BATCH_MAX : 0, &ri) == KM_OK)
			while (!found && km_record_next(&ri, &rec))
				if (rec.timestamp >= q->timestamp && rec.offset >= log_start && rec.offset >= q->offset &&
				    rec.offset < end) {
					q->found_offset = rec.offset;
					q->found_timestamp = rec.timestamp;
					found = true;
				}
		free(scratch);
	}
	return found;
}

/* One Fetch's worth of the search: found, nothing up to the high watermark, or on with the next Fetch. */
static void took_lookup_fetch(struct km_mprep *p, const km_fetch_response *r)
{
	km_mirror_batch_q *q = &p->lq[p->lq_next];
	const km_fetch_response_partition_data *d = NULL;
	int64_t before = q->next, end;

	if (r->responses.count > 0 && r->responses.items[0].partitions.count > 0)
		d = &r->responses.items[0].partitions.items[0];
	if (r->error_code)
		q->code = r->error_code;
	else if (!d)
		q->code = KM_KAFKA_UNKNOWN_SERVER_ERROR;
	else if (d->error_code)
		q->code = d->error_code;
	else if (search_batches(q, &d->records, d->log_start_offset,
				end = q->committed && d->last_stable_offset >= 0 ? d->last_stable_offset : d->high_watermark))
		q->code = KM_OK;
	else if (q->next <= before || q->next >= end) {
		q->found_offset = q->found_timestamp = -1; /* no record up to the end reaches it */
		q->code = KM_OK;
	} else if (++q->reads >= SEARCH_READS_MAX) {
		q->code = K_REQUEST_TIMED_OUT; /* further than the search reads: the broker's answer stays */
	} else {
		return; /* the next Fetch, from q->next */
	}
	p->lq_next++;
}

/* One Fetch of up to 1 MiB from where the next question's search is, to its leader. */
static void send_lookup_fetch(struct km_mprep *p)
{
	km_fetch_request m;
	km_fetch_request_fetch_topic t;
	km_fetch_request_fetch_partition fp;
	km_mirror_batch_q *q;
	km_net_client *c;
	int16_t ver;

	while (p->lq_next < p->nlq && p->lq[p->lq_next].code != LQ_PENDING)
		p->lq_next++;
	if (p->lq_next >= p->nlq) {
		p->ph = P_LOOKUP_SRC_META;
		p->src_leader = -1;
		p->src_since = now_ms();
		later(p, 0);
		return;
	}
	q = &p->lq[p->lq_next];
	c = km_cluster_node(p->dst, q->leader);
	if (!km_cluster_usable(p->dst, c)) {
		later(p, RETRY_MS);
		return;
	}
	if ((ver = km_net_version_pick(c, KM_API_FETCH, FETCH_LO, FETCH_HI)) < 0) {
		q->code = KM_KAFKA_UNSUPPORTED_VERSION;
		p->lq_next++;
		later(p, 0);
		return;
	}
	km_fetch_request_init(&m);
	km_fetch_request_fetch_topic_init(&t);
	km_fetch_request_fetch_partition_init(&fp);
	m.replica_id = -1;
	m.max_wait_ms = 0;
	m.min_bytes = 0;
	m.max_bytes = SEARCH_FETCH_BYTES;
	m.isolation_level = 0; /* up to the high watermark: a marker is passed over, an open transaction's records are records */
	m.session_id = 0;
	m.session_epoch = -1;
	fp.partition = q->partition;
	fp.current_leader_epoch = -1;
	fp.fetch_offset = q->next;
	fp.log_start_offset = -1;
	fp.partition_max_bytes = SEARCH_FETCH_BYTES;
	t.topic = km_str_c(q->topic);
	t.partitions.items = &fp;
	t.partitions.count = 1;
	m.topics.items = &t;
	m.topics.count = 1;
	send_req(p, p->dst, c, KM_API_FETCH, ver, &m);
}

/* ---- a search that passed over a marker: the source's own answer ---- */

/* The next question whose search passed over a marker, from p->lq_src on; NULL when none is left. */
static km_mirror_batch_q *src_question(struct km_mprep *p)
{
	for (; p->lq_src < p->nlq; p->lq_src++)
		if (p->lq[p->lq_src].code == KM_OK && p->lq[p->lq_src].marker >= 0)
			return &p->lq[p->lq_src];
	return NULL;
}

/* The source cluster of the mirror that holds topic (the one it was made for, or a new one); false when none can be had. */
static bool lookup_source(struct km_mprep *p, const char *topic)
{
	const km_state *st = km_mirror_store(p->mi);
	const km_state_topic *t = st ? km_state_topic_find(st, topic, strlen(topic)) : NULL;
	const km_state_mirror *m = t ? km_state_topic_mirror(t) : NULL;
	char why[300] = "";

	if (!m)
		return false;
	if (p->src && p->src_mirror && !strcmp(p->src_mirror, km_state_mirror_name(m)))
		return true;
	km_cluster_free(p->src);
	p->src = NULL;
	if (p->src_tls)
		SSL_CTX_free(p->src_tls);
	p->src_tls = NULL;
	free(p->src_mirror);
	if (!(p->src_mirror = strdup(km_state_mirror_name(m))))
		return false;
	snprintf(p->src_boot, sizeof(p->src_boot), "%s", km_state_mirror_source(m));
	p->src = km_mirror_source_cluster(p->mi, m, "lookup", 16 << 20, &p->src_tls, on_cluster, p, why, sizeof(why));
	return p->src != NULL;
}

/* Metadata of the question's topic on the source (its leader), then ListOffsets by timestamp there. */
static void send_lookup_src(struct km_mprep *p)
{
	km_mirror_batch_q *q = src_question(p);
	km_net_client *c;
	int16_t ver;

	if (!q) {
		p->ph = P_DONE;
		return later(p, 0);
	}
	if (!lookup_source(p, q->topic)) {
		p->lq_src++;
		p->src_leader = -1;
		return later(p, 0);
	}
	c = p->src_leader >= 0 ? km_cluster_node(p->src, p->src_leader) : km_cluster_any(p->src);
	if (!km_cluster_usable(p->src, c)) {
		if (now_ms() - p->src_since < SEARCH_SOURCE_PATIENCE_MS)
			return later(p, RETRY_MS / 4);
		KM_INFO(COMP, 0, "ListOffsets by timestamp on %s-%d: the source (%s) cannot be reached (%s): answered from "
			"the destination (a transaction marker's own time is the source's to tell)", q->topic,
			(int)q->partition, p->src_boot, km_cluster_last_error(p->src));
		p->ph = P_DONE;
		return later(p, 0);
	}
	if (p->src_leader < 0) {
		km_metadata_request m;
		km_metadata_request_topic mt;
		if ((ver = km_net_version_pick(c, KM_API_METADATA, META_LO, META_HI)) < 0) {
			p->lq_src++;
			return later(p, 0);
		}
		km_metadata_request_init(&m);
		km_metadata_request_topic_init(&mt);
		mt.name = km_str_c(q->topic);
		m.topics.items = &mt;
		m.topics.count = 1;
		m.allow_auto_topic_creation = false;
		p->ph = P_LOOKUP_SRC_META;
		send_req(p, p->src, c, KM_API_METADATA, ver, &m);
		return;
	}
	if ((ver = km_net_version_pick(c, KM_API_LIST_OFFSETS, LO_LO, LO_HI)) < 0) {
		p->lq_src++;
		p->src_leader = -1;
		return later(p, 0);
	} else {
		km_list_offsets_request m;
		km_list_offsets_request_list_offsets_topic lt;
		km_list_offsets_request_list_offsets_partition lp;
		km_list_offsets_request_init(&m);
		km_list_offsets_request_list_offsets_topic_init(&lt);
		km_list_offsets_request_list_offsets_partition_init(&lp);
		m.replica_id = -1;
		m.isolation_level = q->committed ? 1 : 0;
		lp.partition_index = q->partition;
		lp.current_leader_epoch = -1;
		lp.timestamp = q->timestamp;
		lt.name = km_str_c(q->topic);
		lt.partitions.items = &lp;
		lt.partitions.count = 1;
		m.topics.items = &lt;
		m.topics.count = 1;
		p->ph = P_LOOKUP_SRC_LO;
		send_req(p, p->src, c, KM_API_LIST_OFFSETS, ver, &m);
	}
}

static void took_lookup_src_meta(struct km_mprep *p, const km_metadata_response *r)
{
	km_mirror_batch_q *q = src_question(p);
	const km_metadata_response_topic *mt = r->topics.count == 1 ? &r->topics.items[0] : NULL;

	if (!q)
		return;
	if (km_cluster_brokers(p->src, r) != KM_OK)
		return; /* asked again */
	for (int32_t k = 0; mt && !mt->error_code && k < mt->partitions.count; k++)
		if (mt->partitions.items[k].partition_index == q->partition && !mt->partitions.items[k].error_code)
			p->src_leader = mt->partitions.items[k].leader_id;
	if (p->src_leader < 0)
		p->lq_src++; /* no leader there now: the destination's answer stands */
}

static void took_lookup_src_lo(struct km_mprep *p, const km_list_offsets_response *r)
{
	km_mirror_batch_q *q = src_question(p);
	const km_list_offsets_response_list_offsets_partition_response *pr = NULL;

	if (r->topics.count == 1 && r->topics.items[0].partitions.count == 1)
		pr = &r->topics.items[0].partitions.items[0];
	if (q && pr && !pr->error_code) {
		q->source_known = true;
		q->source_offset = pr->offset;
		q->source_timestamp = pr->timestamp;
	}
	p->lq_src++;
	p->src_leader = -1;
}

void km_mirror_batches_at(km_mirror *mi, km_mirror_batch_q *q, size_t n, km_mirror_batches_cb cb, void *arg)
{
	static const char mirror[] = "proxy"; /* names the client: kmirrord/<instance>/proxy/lookup */
	struct km_mprep *p = calloc(1, sizeof(*p));

	if (!p || !(p->t = calloc(n ? n : 1, sizeof(*p->t))) || !(p->mirror = strdup(mirror)) ||
	    !(p->ev = event_new(km_mirror_base(mi), -1, 0, on_ev, p)))
		goto nomem;
	p->mi = mi;
	p->lq = q;
	p->nlq = n;
	p->lcb = cb;
	p->arg = arg;
	p->deadline = now_ms() + LOOKUP_TIMEOUT_MS;
	for (size_t i = 0; i < n; i++) {
		q[i].code = LQ_PENDING;
		q[i].next = q[i].offset;
		q[i].reads = 0;
		q[i].found_offset = q[i].found_timestamp = q[i].marker = -1;
		q[i].source_known = false;
		q[i].source_offset = q[i].source_timestamp = -1;
		if (!topic_of(p, km_str_c(q[i].topic))) {
			if (!(p->t[p->n].name = strdup(q[i].topic)))
				goto nomem;
			p->n++;
		}
	}
	p->ph = P_LOOKUP_META;
	if (!(p->dst = km_mirror_dest_cluster(mi, mirror, "lookup", on_cluster, p)))
		goto nomem;
	p->next = *km_mirror_prep_list(mi);
	*km_mirror_prep_list(mi) = p;
	later(p, 0); /* never answer from inside the call */
	return;
nomem:
	if (p)
		prep_free(p);
	for (size_t i = 0; i < n; i++)
		q[i].code = KM_MIRROR_STATE_UNAVAILABLE;
	cb(arg, q, n);
}

/* r->msg is the response of the phase's request (ph): Metadata, DescribeConfigs, CreateTopics, Fetch or CreatePartitions. */
static void took_answer(struct km_mprep *p, phase ph, const km_rpc_response *r)
{
	switch (ph) {
	case P_DST_META:
		took_dst_meta(p, r->msg);
		break;
	case P_SRC_META:
		took_src_meta(p, r->msg);
		break;
	case P_LEADERS:
		if (!took_leaders(p, r->msg)) {
			later(p, RETRY_MS); /* leaders not elected yet: ask again */
			return;
		}
		p->ph = P_DONE;
		break;
	case P_SRC_CFG:
		took_src_cfg(p, r->msg);
		break;
	case P_CREATE:
		took_create(p, r->msg);
		break;
	case P_LOOKUP_META:
		took_lookup_meta(p, r->msg);
		break;
	case P_LOOKUP_FETCH:
		took_lookup_fetch(p, r->msg);
		break;
	case P_LOOKUP_SRC_META:
		took_lookup_src_meta(p, r->msg);
		break;
	case P_LOOKUP_SRC_LO:
		took_lookup_src_lo(p, r->msg);
		break;
	case P_GROW_PARTS:
		took_grow(p, r->msg);
		break;
	case P_TXN_LIST:
		if (!took_txn_list(p, r->msg)) {
			later(p, RETRY_MS); /* the broker's error: asked again, within the deadline */
			return;
		}
		break;
	case P_TXN_DESC:
		took_txn_describe(p, r->msg);
		break;
	case P_DATA_META:
		took_data_meta(p, r->msg);
		break;
	case P_DATA_ENDS:
		took_data_ends(p, r->msg);
		break;
	case P_SRC_PEER:
		took_src_peer(p, r->msg);
		break;
	default:
		break;
	}
	later(p, 0);
}

static void on_response(km_net_client *c, const km_rpc_response *r, void *arg)
{
	rctx *x = arg;
	struct km_mprep *p = x->p;
	phase ph = x->ph;
	km_cluster *cl = x->cl;

	free(x);
	if (p->finished)
		return;
	p->inflight = false;
	if (km_rpc_undecoded(r)) {
		snprintf(p->why, sizeof(p->why), "the %s cluster's answer could not be decoded", km_cluster_side(cl));
		later(p, RETRY_MS);
		return;
	}
	if (r->err != KM_OK) {
		snprintf(p->why, sizeof(p->why), "a request to the %s cluster failed: %s", km_cluster_side(cl),
			 km_err_name(r->err));
		km_cluster_drop(cl, c);
		later(p, RETRY_MS);
		return;
	}
	took_answer(p, ph, r);
}

static void send_describe(struct km_mprep *p)
{
	km_net_client *c = ready_client(p, p->src);
	km_describe_configs_request m;
	km_describe_configs_request_describe_configs_resource *rs;
	int16_t ver;
	int32_t k = 0;

	if (!c)
		return;
	if ((ver = km_net_version_pick(c, KM_API_DESCRIBE_CONFIGS, DC_LO, DC_HI)) < 0) {
		for (size_t i = 0; i < p->n; i++)
			if (p->t[i].missing)
				set_code(&p->t[i], KM_KAFKA_UNSUPPORTED_VERSION,
					 "the source cluster does not support DescribeConfigs v%d+", DC_LO);
		p->ph = P_DONE;
		return later(p, 0);
	}
	if (!(rs = calloc(p->n, sizeof(*rs))))
		return later(p, RETRY_MS);
	km_describe_configs_request_init(&m);
	for (size_t i = 0; i < p->n; i++) {
		if (!p->t[i].missing || p->t[i].settled)
			continue;
		km_describe_configs_request_describe_configs_resource_init(&rs[k]);
		rs[k].resource_type = K_RESOURCE_TOPIC;
		rs[k].resource_name = km_str_c(p->t[i].name);
		rs[k++].configuration_keys.count = -1; /* all */
	}
	m.resources.items = rs;
	m.resources.count = k;
	m.include_synonyms = false;
	m.include_documentation = false;
	send_req(p, p->src, c, KM_API_DESCRIBE_CONFIGS, ver, &m);
	free(rs); /* encoded in the call */
}

static void send_create(struct km_mprep *p)
{
	km_net_client *c = ready_client(p, p->dst);
	km_create_topics_request m;
	km_create_topics_request_creatable_topic *ts;
	km_create_topics_request_creatable_topic_config *cs = NULL;
	size_t ncs = 0;
	int16_t ver;
	int32_t k = 0;
	int64_t left = p->deadline - now_ms(), records = 0;

	if (!c)
		return;
	if ((ver = km_net_version_pick(c, KM_API_CREATE_TOPICS, CT_LO, CT_HI)) < 0) {
		for (size_t i = 0; i < p->n; i++)
			if (p->t[i].missing)
				set_code(&p->t[i], KM_KAFKA_UNSUPPORTED_VERSION,
					 "the destination does not support CreateTopics v%d+ (Kafka 2.4)", CT_LO);
		p->ph = P_DONE;
		return later(p, 0);
	}
	for (size_t i = 0; i < p->n; i++)
		if (p->t[i].missing && !p->t[i].settled)
			ncs += p->t[i].ncfg + 1;
	ts = calloc(p->n, sizeof(*ts));
	cs = calloc(ncs ? ncs : 1, sizeof(*cs));
	if (!ts || !cs) {
		free(ts);
		free(cs);
		return later(p, RETRY_MS);
	}
	km_create_topics_request_init(&m);
	ncs = 0;
	for (size_t i = 0; i < p->n; i++) {
		ptopic *t = &p->t[i];
		size_t first = ncs;
		int64_t cost = 2 + (int64_t)t->partitions + (int64_t)t->ncfg;
		if (!t->missing || t->settled)
			continue;
		if (k > 0 && records + cost > CREATE_RECORDS_MAX)
			break; /* the next request takes it */
		records += cost;
		t->asked = true;
		km_create_topics_request_creatable_topic_init(&ts[k]);
		ts[k].name = km_str_c(t->name);
		ts[k].num_partitions = t->partitions;
		ts[k].replication_factor = -1; /* the destination's default.replication.factor */
		ts[k].assignments.count = 0;
		for (size_t j = 0; j < t->ncfg; j++) {
			km_create_topics_request_creatable_topic_config_init(&cs[ncs]);
			cs[ncs].name = km_str_c(t->cfg[j].name);
			cs[ncs++].value = km_str_c(t->cfg[j].value);
		}
		/* The broker stores the source's compressed batches as they are only with "producer". */
		km_create_topics_request_creatable_topic_config_init(&cs[ncs]);
		cs[ncs].name = km_str_c("compression.type");
		cs[ncs++].value = km_str_c("producer");
		ts[k].configs.items = &cs[first];
		ts[k].configs.count = (int32_t)(ncs - first);
		k++;
	}
	m.topics.items = ts;
	m.topics.count = k;
	m.timeout_ms = left > 1000 ? (int32_t)(left - 500) : 500;
	m.validate_only = false;
	send_req(p, p->dst, c, KM_API_CREATE_TOPICS, ver, &m);
	free(ts); /* encoded in the call */
	free(cs);
}

static void send_grow(struct km_mprep *p)
{
	km_net_client *c = ready_client(p, p->dst);
	km_create_partitions_request m;
	km_create_partitions_request_create_partitions_topic t;
	int64_t left = p->deadline - now_ms();
	int16_t ver;

	if (!c)
		return;
	if ((ver = km_net_version_pick(c, KM_API_CREATE_PARTITIONS, CP_LO, CP_HI)) < 0) {
		set_code(&p->t[0], KM_KAFKA_UNSUPPORTED_VERSION, "the destination does not support CreatePartitions");
		p->ph = P_DONE;
		return later(p, 0);
	}
	km_create_partitions_request_init(&m);
	km_create_partitions_request_create_partitions_topic_init(&t);
	t.name = km_str_c(p->t[0].name);
	t.count = p->t[0].partitions;
	t.assignments.count = -1; /* the destination places them */
	m.topics.items = &t;
	m.topics.count = 1;
	m.timeout_ms = left > 1000 ? (int32_t)(left - 500) : 500;
	send_req(p, p->dst, c, KM_API_CREATE_PARTITIONS, ver, &m);
}

static void grow_done(void *arg, const km_state_result *res)
{
	struct km_mprep *p = arg;
	if (p->finished) {
		prep_free(p); /* shut down while the store held it (km_mirror_topics_shutdown) */
		return;
	}
	p->inflight = false;
	if (res->code)
		set_code(&p->t[0], res->code, "%s", res->message ? res->message : km_err_message(res->code));
	p->ph = P_DONE;
	later(p, 0);
}

static void timed_out(struct km_mprep *p)
{
	static const char *const doing[P_DONE + 1] = {
		[P_DST_META] = "reading the destination's metadata",
		[P_SRC_META] = "reading the source's metadata",
		[P_SRC_CFG] = "reading the source topic's configs",
		[P_CREATE] = "creating the destination topic",
		[P_LEADERS] = "waiting for the new topic's leaders",
		[P_GROW_PARTS] = "adding partitions on the destination",
		[P_GROW_STATE] = "adding the partitions to the state store",
		[P_LOOKUP_META] = "reading the destination's metadata",
		[P_LOOKUP_FETCH] = "searching the destination partition",
		[P_LOOKUP_SRC_META] = "reading the source's metadata",
		[P_LOOKUP_SRC_LO] = "asking the source",
		[P_TXN_LIST] = "listing the destination's open transactions",
		[P_TXN_DESC] = "describing the destination's open transactions",
		[P_DATA_META] = "reading the destination's metadata",
		[P_DATA_ENDS] = "reading the destination topic's offsets",
		[P_SRC_PEER] = "asking the source's kmirrord whether the start is a failback",
		[P_DONE] = "",
	};
	for (size_t i = 0; i < p->n; i++)
		if (!p->t[i].settled &&
		    (p->ph != P_DST_META ? p->t[i].partitions > 0 || p->t[i].missing || p->t[i].txn_check : true))
			set_code(&p->t[i], K_REQUEST_TIMED_OUT, "Preparing topic %s timed out after %d ms while %s%s%s",
				 p->t[i].name, p->lq ? LOOKUP_TIMEOUT_MS : PREP_TIMEOUT_MS, doing[p->ph], p->why[0] ? ": " : "",
				 p->why);
}

static void advance(struct km_mprep *p)
{
	if (p->finished || (p->ph == P_GROW_STATE && p->inflight))
		return; /* the store holds p until it answers (it answers even while it is freed) */
	if (p->ph != P_DONE && now_ms() >= p->deadline) {
		timed_out(p);
		p->ph = P_DONE;
	}
	if (p->inflight && p->ph != P_DONE) {
		later(p, RETRY_MS); /* the deadline still counts while a request is out */
		return;
	}
	switch (p->ph) {
	case P_DST_META:
		send_metadata(p, p->dst, false);
		return;
	case P_SRC_META:
		if (src_cluster(p, missing_one))
			send_metadata(p, p->src, true);
		return;
	case P_SRC_CFG:
		send_describe(p);
		return;
	case P_CREATE:
		send_create(p);
		return;
	case P_LEADERS: {
		bool any = false;
		for (size_t i = 0; i < p->n; i++)
			any = any || (!p->t[i].settled && p->t[i].partitions > 0);
		if (!any) {
			p->ph = P_DONE;
			later(p, 0);
			return;
		}
		send_metadata(p, p->dst, false);
		return;
	}
	case P_GROW_PARTS:
		send_grow(p);
		return;
	case P_LOOKUP_META:
		send_metadata(p, p->dst, false);
		return;
	case P_LOOKUP_FETCH:
		send_lookup_fetch(p);
		return;
	case P_LOOKUP_SRC_META:
	case P_LOOKUP_SRC_LO:
		send_lookup_src(p);
		return;
	case P_TXN_LIST:
		send_txn_list(p);
		return;
	case P_TXN_DESC:
		send_txn_describe(p);
		return;
	case P_DATA_META:
		send_metadata(p, p->dst, false);
		return;
	case P_DATA_ENDS:
		send_data_ends(p);
		return;
	case P_SRC_PEER:
		send_src_peer(p);
		return;
	case P_GROW_STATE:
		/* The store answers once the records are in; it holds p until then (p->inflight). */
		p->inflight = true;
		km_state_topic_add_partitions(km_mirror_store(p->mi), p->mirror, p->t[0].name, p->t[0].partitions,
					      grow_done, p);
		return;
	case P_DONE:
		answer(p);
		return;
	}
}

void km_mirror_prepare_start(km_mirror *mi, const char *mirror, const char *const *topics, size_t n, bool adopt,
			     km_mirror_prepare_cb cb, void *arg)
{
	struct km_mprep *p = calloc(1, sizeof(*p));
	const km_state_mirror *m;

	if (!p || n > MAX_TOPICS || !(p->t = calloc(n ? n : 1, sizeof(*p->t))) || !(p->mirror = strdup(mirror)))
		goto nomem;
	p->mi = mi;
	p->cb = cb;
	p->arg = arg;
	p->adopt = adopt;
	p->deadline = now_ms() + PREP_TIMEOUT_MS;
	for (size_t i = 0; i < n; i++) {
		if (!(p->t[i].name = strdup(topics[i])))
			goto nomem;
		/* Never created, whatever the clusters hold: the store refuses the name itself. */
		p->t[i].settled = km_mirror_store(mi) && km_state_topic_internal(km_mirror_store(mi), topics[i]);
		p->n++;
	}
	if (!(p->ev = event_new(km_mirror_base(mi), -1, 0, on_ev, p)))
		goto nomem;
	p->next = *km_mirror_prep_list(mi);
	*km_mirror_prep_list(mi) = p;
	m = km_mirror_store(mi) ? km_state_mirror_find(km_mirror_store(mi), mirror) : NULL;
	if (!m) {
		/* Nothing to create for a mirror that does not exist: the store answers UNKNOWN_CLUSTER_MIRROR. */
		p->ph = P_DONE;
	} else {
		snprintf(p->src_boot, sizeof(p->src_boot), "%s", km_state_mirror_source(m));
		p->dst = km_mirror_dest_cluster(mi, mirror, "topics", on_cluster, p);
		if (!p->dst)
			p->ph = P_DONE;
	}
	later(p, 0); /* never answer from inside the call */
	return;
nomem:
	if (p)
		prep_free(p);
	cb(arg, KM_MIRROR_STATE_UNAVAILABLE, "out of memory", NULL, 0);
}

void km_mirror_grow(km_mirror *mi, const char *mirror, const char *topic, int32_t source_partitions)
{
	km_state *st = km_mirror_store(mi);
	const km_state_topic *t = st ? km_state_topic_find(st, topic, strlen(topic)) : NULL;
	struct km_mprep *p;

	if (!t || strcmp(km_state_mirror_name(km_state_topic_mirror(t)), mirror) || source_partitions <= 0 ||
	    source_partitions > 100000 || km_state_topic_partition_count(t) >= (size_t)source_partitions)
		return; /* not ours, or the store holds them all: nothing to do */
	for (p = *km_mirror_prep_list(mi); p; p = p->next)
		if (p->grow && !strcmp(p->mirror, mirror) && !strcmp(p->t[0].name, topic) &&
		    p->t[0].partitions >= source_partitions)
			return; /* one is on its way */
	if (!(p = calloc(1, sizeof(*p))) || !(p->t = calloc(1, sizeof(*p->t))) || !(p->mirror = strdup(mirror)) ||
	    !(p->t[0].name = strdup(topic)) || !(p->ev = event_new(km_mirror_base(mi), -1, 0, on_ev, p)) ||
	    !(p->dst = km_mirror_dest_cluster(mi, mirror, "topics", on_cluster, p))) {
		if (p) {
			p->n = p->t && p->t[0].name ? 1 : 0;
			prep_free(p);
		}
		KM_ERROR(COMP, 0, "%s: out of memory growing topic %s", mirror, topic);
		return;
	}
	p->n = 1;
	p->mi = mi;
	p->grow = true;
	p->t[0].partitions = source_partitions;
	p->t[0].missing = true;
	p->deadline = now_ms() + PREP_TIMEOUT_MS;
	p->next = *km_mirror_prep_list(mi);
	*km_mirror_prep_list(mi) = p;
	KM_INFO(COMP, 0, "%s: the source topic %s has %d partitions, the mirror %zu: adding the new ones", mirror, topic,
		(int)source_partitions, km_state_topic_partition_count(t));
	later(p, 0);
}

void km_mirror_topics_shutdown(km_mirror *mi)
{
	struct km_mprep **head = km_mirror_prep_list(mi);
	while (*head) {
		struct km_mprep *p = *head;
		for (size_t i = 0; i < p->n; i++)
			set_code(&p->t[i], KM_MIRROR_STATE_UNAVAILABLE, "kmirrord is shutting down");
		if (p->ph == P_GROW_STATE && p->inflight) {
			/*
			 * The store holds p until it answers, which it does even while it is freed: grow_done
			 * frees p then. Freed here, that answer would land on freed memory.
			 */
			unlink_prep(p);
			p->finished = true;
			continue;
		}
		answer(p); /* unlinks p */
	}
}
