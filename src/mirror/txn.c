/*
 * Transactional producers on the destination (docs/mirror.md, "Transactions"): one transactional
 * id, its coordinator, its producer id and epoch, and the one transaction it is in. Transaction
 * version 1 throughout (AddPartitionsToTxn v3 at most, EndTxn v4 at most, Produce v11 at most
 * for its batches): the epoch stays for the life of the producer id, sequences run on.
 */
#include <stdlib.h>
#include <string.h>

#include "kmirror/api.h"
#include "kmirror/batch.h"
#include "kmirror/log.h"
#include "kmirror/msg/add_partitions_to_txn_request.h"
#include "kmirror/msg/add_partitions_to_txn_response.h"
#include "kmirror/msg/end_txn_request.h"
#include "kmirror/msg/end_txn_response.h"
#include "kmirror/msg/find_coordinator_request.h"
#include "kmirror/msg/find_coordinator_response.h"
#include "kmirror/msg/init_producer_id_request.h"
#include "kmirror/msg/init_producer_id_response.h"
#include "kmirror/rpc.h"
#include "mirror_int.h"

#define COMP KM_MIRROR_COMP
/* The longest a destination transaction may stay open; a destination with a lower maximum gets the fallback. */
#define TXN_TIMEOUT_MS 900000
#define TXN_TIMEOUT_FALLBACK_MS 60000
#define RETRY_MS 20
#define RETRY_MAX_MS 2000

enum { OP_NONE, OP_FIND, OP_INIT, OP_ADD, OP_END };

/* An answer's way back: the producer may be gone by then (t NULL). */
typedef struct txp_ctx {
	km_txp *t;
	int op;
} txp_ctx;

struct km_txp {
	km_cluster *dst;
	char *tid;
	void (*on_change)(void *arg);
	void *arg;
	km_txp_state st;
	int32_t coord; /* -1: not known */
	int64_t pid;
	int16_t epoch;
	int32_t seq;
	int32_t timeout_ms;
	bool commit;
	char *topic;
	int32_t partition;
	txp_ctx *inflight;
	int64_t retry_at;
	int backoff_ms;
	char err[300];
};

const char *km_txp_state_name(km_txp_state s)
{
	static const char *n[] = {"INIT", "FREE", "ADDING", "OPEN", "ENDING", "FAILED"};
	return s <= KM_TXP_FAILED ? n[s] : "?";
}

km_txp *km_txp_new(km_cluster *dst, const char *transactional_id, const char *topic, int32_t partition,
		   void (*on_change)(void *arg), void *arg)
{
	km_txp *t = calloc(1, sizeof(*t));
	if (!t || !(t->tid = strdup(transactional_id)) || !(t->topic = strdup(topic))) {
		if (t)
			free(t->tid);
		free(t);
		return NULL;
	}
	t->dst = dst;
	t->on_change = on_change;
	t->arg = arg;
	t->st = KM_TXP_INIT;
	t->coord = -1;
	t->pid = -1;
	t->epoch = -1;
	t->timeout_ms = TXN_TIMEOUT_MS;
	t->partition = partition;
	return t;
}

void km_txp_free(km_txp *t)
{
	if (!t)
		return;
	if (t->inflight)
		t->inflight->t = NULL;
	free(t->topic);
	free(t->tid);
	free(t);
}

km_txp_state km_txp_state_of(const km_txp *t) { return t->st; }
const char *km_txp_error(const km_txp *t) { return t->err; }
const char *km_txp_id(const km_txp *t) { return t->tid; }
int64_t km_txp_pid(const km_txp *t) { return t->pid; }
int16_t km_txp_epoch(const km_txp *t) { return t->epoch; }
int32_t km_txp_seq(const km_txp *t) { return t->seq; }

void km_txp_advance(km_txp *t, int32_t count)
{
	t->seq = km_batch_seq_add(t->seq, count);
}

void km_txp_begin(km_txp *t)
{
	if (t->st != KM_TXP_FREE)
		return;
	t->st = KM_TXP_ADDING;
	t->retry_at = 0;
}

void km_txp_end(km_txp *t, bool commit)
{
	if (t->st != KM_TXP_OPEN)
		return;
	t->commit = commit;
	t->st = KM_TXP_ENDING;
	t->retry_at = 0;
}

void km_txp_fence(km_txp *t)
{
	t->st = KM_TXP_INIT;
	t->err[0] = 0;
	t->retry_at = 0;
	t->backoff_ms = 0;
	if (t->inflight) {
		t->inflight->t = NULL; /* its answer no longer counts */
		t->inflight = NULL;
	}
}

static void changed(km_txp *t)
{
	if (t->on_change)
		t->on_change(t->arg);
}

static void retry(km_txp *t, int ms)
{
	if (!ms) {
		ms = t->backoff_ms ? t->backoff_ms * 2 : RETRY_MS * 5;
		if (ms > RETRY_MAX_MS)
			ms = RETRY_MAX_MS;
		t->backoff_ms = ms;
	}
	t->retry_at = km_wall_ms() + ms;
}

static void failed(km_txp *t, const char *what, int16_t code)
{
	snprintf(t->err, sizeof(t->err), "%s for transactional id %s: %s", what, t->tid, km_err_name((km_err)code));
	KM_WARN(COMP, 0, "%s", t->err);
	t->st = KM_TXP_FAILED;
}

/* An error code of a coordinator request: true when it was handled by retrying. */
static bool retriable(km_txp *t, int16_t code)
{
	switch (code) {
	case 14: /* COORDINATOR_LOAD_IN_PROGRESS */
		retry(t, 0);
		return true;
	case 15: /* COORDINATOR_NOT_AVAILABLE */
	case 16: /* NOT_COORDINATOR */
		t->coord = -1;
		retry(t, 0);
		return true;
	case 51: /* CONCURRENT_TRANSACTIONS: the previous transaction is still being completed */
		retry(t, RETRY_MS);
		return true;
	default:
		if (km_err_retriable((km_err)code)) {
			retry(t, 0);
			return true;
		}
		return false;
	}
}

static void took_find(km_txp *t, const km_find_coordinator_response *r)
{
	const km_find_coordinator_response_coordinator *c = r->coordinators.count == 1 ? &r->coordinators.items[0] : NULL;
	if (!c)
		return retry(t, 0);
	if (c->error_code && !retriable(t, c->error_code))
		return failed(t, "FindCoordinator", c->error_code);
	if (!c->error_code) {
		t->coord = c->node_id;
		t->backoff_ms = 0;
	}
}

static void took_init(km_txp *t, const km_init_producer_id_response *r)
{
	if (r->error_code == 50 && t->timeout_ms != TXN_TIMEOUT_FALLBACK_MS) {
		/* INVALID_TRANSACTION_TIMEOUT: the destination's transaction.max.timeout.ms is lower. */
		t->timeout_ms = TXN_TIMEOUT_FALLBACK_MS;
		return retry(t, 1);
	}
	if (r->error_code && !retriable(t, r->error_code))
		return failed(t, "InitProducerId", r->error_code);
	if (r->error_code)
		return;
	t->pid = r->producer_id;
	t->epoch = r->producer_epoch;
	t->seq = 0;
	t->st = KM_TXP_FREE;
	t->backoff_ms = 0;
	KM_DEBUG(COMP, 0, "transactional id %s: producer id %lld epoch %d", t->tid, (long long)t->pid, t->epoch);
}

static void took_add(km_txp *t, const km_add_partitions_to_txn_response *r)
{
	int16_t code = -1;
	for (int32_t i = 0; i < r->results_by_topic_v3_and_below.count; i++) {
		const km_add_partitions_to_txn_response_add_partitions_to_txn_topic_result *tr =
			&r->results_by_topic_v3_and_below.items[i];
		for (int32_t k = 0; k < tr->results_by_partition.count; k++)
			if (tr->results_by_partition.items[k].partition_index == t->partition)
				code = tr->results_by_partition.items[k].partition_error_code;
	}
	if (code < 0)
		return retry(t, 0);
	if (code && !retriable(t, code))
		return failed(t, "AddPartitionsToTxn", code);
	if (!code) {
		t->st = KM_TXP_OPEN;
		t->backoff_ms = 0;
	}
}

static void took_end(km_txp *t, const km_end_txn_response *r)
{
	if (r->error_code && !retriable(t, r->error_code))
		return failed(t, t->commit ? "EndTxn (commit)" : "EndTxn (abort)", r->error_code);
	if (!r->error_code) {
		t->st = KM_TXP_FREE;
		t->backoff_ms = 0;
	}
}

static void on_answer(km_net_client *c, const km_rpc_response *r, void *arg)
{
	txp_ctx *x = arg;
	km_txp *t = x->t;
	int op = x->op;

	free(x);
	if (!t)
		return;
	t->inflight = NULL;
	if (km_rpc_undecoded(r)) {
		retry(t, 0); /* the connection is sound: the same request again later */
		changed(t);
		return;
	}
	if (r->err != KM_OK) {
		km_cluster_drop(t->dst, c);
		t->coord = -1;
		retry(t, 0);
		changed(t);
		return;
	}
	switch (op) {
	case OP_FIND:
		took_find(t, r->msg);
		break;
	case OP_INIT:
		if (t->st == KM_TXP_INIT)
			took_init(t, r->msg);
		break;
	case OP_ADD:
		if (t->st == KM_TXP_ADDING)
			took_add(t, r->msg);
		break;
	case OP_END:
		if (t->st == KM_TXP_ENDING)
			took_end(t, r->msg);
		break;
	}
	changed(t);
}

/* req: the km_<name>_request of key, encoded by the API table. */
static void send_op(km_txp *t, km_net_client *c, int op, int16_t key, int16_t ver, const void *req)
{
	txp_ctx *x = calloc(1, sizeof(*x));
	if (!x)
		return retry(t, 0);
	*x = (txp_ctx){t, op};
	if (km_rpc_call(c, key, ver, req, NULL, on_answer, x) != KM_OK) {
		free(x);
		km_cluster_drop(t->dst, c);
		return retry(t, 0);
	}
	t->inflight = x;
}

int64_t km_txp_poll(km_txp *t, int64_t now)
{
	km_net_client *c;
	int16_t ver;
	km_str tid = km_str_c(t->tid);

	if (t->inflight || t->st == KM_TXP_FREE || t->st == KM_TXP_OPEN || t->st == KM_TXP_FAILED)
		return now + 1000;
	if (t->retry_at > now)
		return t->retry_at;
	if (t->coord < 0) {
		km_find_coordinator_request m;
		c = km_cluster_any(t->dst);
		if (!km_cluster_usable(t->dst, c))
			return now + 100;
		if ((ver = km_net_version_pick(c, KM_API_FIND_COORDINATOR, 4, 6)) < 0) {
			snprintf(t->err, sizeof(t->err), "the destination cannot carry transactions: it has no FindCoordinator "
				 "v4 (Kafka 3.0 and later have it)");
			t->st = KM_TXP_FAILED;
			return now + 1000;
		}
		km_find_coordinator_request_init(&m);
		m.key_type = 1; /* TRANSACTION */
		m.coordinator_keys.items = &tid;
		m.coordinator_keys.count = 1;
		send_op(t, c, OP_FIND, KM_API_FIND_COORDINATOR, ver, &m);
		return now + 1000;
	}
	c = km_cluster_node(t->dst, t->coord);
	if (!c) {
		t->coord = -1; /* not in the metadata (yet): asked again */
		retry(t, 0);
		return t->retry_at;
	}
	if (!km_cluster_usable(t->dst, c))
		return now + 100;
	switch (t->st) {
	case KM_TXP_INIT: {
		km_init_producer_id_request m;
		if ((ver = km_net_version_pick(c, KM_API_INIT_PRODUCER_ID, 0, 5)) < 0)
			return now + 1000;
		km_init_producer_id_request_init(&m);
		m.transactional_id = tid;
		m.transaction_timeout_ms = t->timeout_ms;
		m.producer_id = -1;
		m.producer_epoch = -1;
		send_op(t, c, OP_INIT, KM_API_INIT_PRODUCER_ID, ver, &m);
		break;
	}
	case KM_TXP_ADDING: {
		km_add_partitions_to_txn_request m;
		km_add_partitions_to_txn_request_add_partitions_to_txn_topic tp;
		int32_t part = t->partition;
		if ((ver = km_net_version_pick(c, KM_API_ADD_PARTITIONS_TO_TXN, 0, 3)) < 0)
			return now + 1000;
		km_add_partitions_to_txn_request_init(&m);
		km_add_partitions_to_txn_request_add_partitions_to_txn_topic_init(&tp);
		tp.name = km_str_c(t->topic);
		tp.partitions.items = &part;
		tp.partitions.count = 1;
		m.v3_and_below_transactional_id = tid;
		m.v3_and_below_producer_id = t->pid;
		m.v3_and_below_producer_epoch = t->epoch;
		m.v3_and_below_topics.items = &tp;
		m.v3_and_below_topics.count = 1;
		send_op(t, c, OP_ADD, KM_API_ADD_PARTITIONS_TO_TXN, ver, &m);
		break;
	}
	case KM_TXP_ENDING: {
		km_end_txn_request m;
		if ((ver = km_net_version_pick(c, KM_API_END_TXN, 0, 4)) < 0)
			return now + 1000;
		km_end_txn_request_init(&m);
		m.transactional_id = tid;
		m.producer_id = t->pid;
		m.producer_epoch = t->epoch;
		m.committed = t->commit;
		send_op(t, c, OP_END, KM_API_END_TXN, ver, &m);
		break;
	}
	default:
		break;
	}
	return now + 1000;
}
