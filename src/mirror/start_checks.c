/* A start's checks of a destination topic that is there (docs/mirror.md, "A transaction that is not the mirror's", "A destination topic that holds records"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/api.h"
#include "kmirror/log.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/describe_transactions_request.h"
#include "kmirror/msg/describe_transactions_response.h"
#include "kmirror/msg/last_mirrored_offsets_request.h"
#include "kmirror/msg/last_mirrored_offsets_response.h"
#include "kmirror/msg/list_offsets_request.h"
#include "kmirror/msg/list_offsets_response.h"
#include "kmirror/msg/list_transactions_request.h"
#include "kmirror/msg/list_transactions_response.h"
#include "kmirror/msg/metadata_response.h"
#include "kmirror/rpc.h"
#include "prep.h"

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
	km_prep_free_tids(p);
	p->node_next++;
	p->node_since = km_wall_ms();
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
		return km_prep_later(p, 0);
	}
	c = km_cluster_node(p->dst, p->nodes[p->node_next]);
	if (!km_cluster_usable(p->dst, c)) {
		if (km_wall_ms() - p->node_since < TXN_PATIENCE_MS)
			return km_prep_later(p, RETRY_MS);
		KM_WARN(COMP, 0, "%s: destination broker %d cannot be reached (%s): its open transactions are not checked "
			"before the start", p->mirror, (int)p->nodes[p->node_next], km_cluster_last_error(p->dst));
		txn_next_node(p);
		return km_prep_later(p, 0);
	}
	if ((ver = km_net_version_pick(c, KM_API_LIST_TRANSACTIONS, LT_LO, LT_HI)) < 0) {
		KM_INFO(COMP, 0, "%s: the destination cannot list transactions (before Kafka 3.0): open transactions are "
			"not checked before the start", p->mirror);
		txn_checked(p);
		return km_prep_later(p, 0);
	}
	km_list_transactions_request_init(&m);
	for (size_t i = 0; i < sizeof(open_states) / sizeof(*open_states); i++)
		states[i] = km_str_c(open_states[i]);
	m.state_filters.items = states;
	m.state_filters.count = (int32_t)(sizeof(open_states) / sizeof(*open_states));
	km_prep_send_req(p, p->dst, c, KM_API_LIST_TRANSACTIONS, ver, &m);
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
		return km_prep_later(p, RETRY_MS);
	if ((ver = km_net_version_pick(c, KM_API_DESCRIBE_TRANSACTIONS, DT_LO, DT_HI)) < 0 ||
	    !(ids = calloc(p->ntids, sizeof(*ids)))) {
		txn_next_node(p);
		return km_prep_later(p, 0);
	}
	for (size_t i = 0; i < p->ntids; i++)
		ids[i] = km_str_c(p->tids[i]);
	km_describe_transactions_request_init(&m);
	m.transactional_ids.items = ids;
	m.transactional_ids.count = (int32_t)p->ntids;
	km_prep_send_req(p, p->dst, c, KM_API_DESCRIBE_TRANSACTIONS, ver, &m);
	free(ids); /* encoded in the call */
}

/* A transaction that holds a partition of a checked topic refuses that topic's start (its marker would land in the mirror topic). */
static void took_txn_describe(struct km_mprep *p, const km_describe_transactions_response *r)
{
	int64_t now = km_wall_ms();
	for (int32_t i = 0; i < r->transaction_states.count; i++) {
		const km_describe_transactions_response_transaction_state *ts = &r->transaction_states.items[i];
		if (ts->error_code || km_str_eq_c(ts->transaction_state, "Empty") ||
		    km_str_eq_c(ts->transaction_state, "CompleteCommit") || km_str_eq_c(ts->transaction_state, "CompleteAbort"))
			continue; /* ended since the listing, or its coordinator moved (NOT_COORDINATOR) */
		for (int32_t k = 0; k < ts->topics.count; k++) {
			const km_describe_transactions_response_topic_data *td = &ts->topics.items[k];
			ptopic *t = km_prep_topic_of(p, td->topic);
			int64_t age = ts->transaction_start_time_ms > 0 ? (now - ts->transaction_start_time_ms) / 1000 : -1;
			int64_t left = ts->transaction_timeout_ms > 0 && age >= 0 ? ts->transaction_timeout_ms / 1000 - age : -1;
			if (!t || !t->txn_check || t->settled || td->partitions.count <= 0)
				continue;
			km_prep_set_code(t, K_CONCURRENT_TRANSACTIONS,
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
/* The leaders Metadata names for t's partitions (-1: none elected). */
static void set_leaders(ptopic *t, const km_metadata_response_topic *mt)
{
	for (int32_t i = 0; i < mt->partitions.count; i++) {
		int32_t k = mt->partitions.items[i].partition_index;
		if (k >= 0 && k < t->nparts)
			t->leader[k] = mt->partitions.items[i].error_code ? -1 : mt->partitions.items[i].leader_id;
	}
}

static bool take_leaders(ptopic *t, const km_metadata_response_topic *mt)
{
	int32_t n = mt->partitions.count > 0 ? mt->partitions.count : 0;

	free(t->leader);
	free(t->lo);
	free(t->hi);
	t->leader = malloc(((size_t)n + 1) * sizeof(*t->leader));
	t->lo = malloc(((size_t)n + 1) * sizeof(*t->lo));
	t->hi = malloc(((size_t)n + 1) * sizeof(*t->hi));
	t->nparts = 0;
	if (!t->leader || !t->lo || !t->hi)
		return false;
	/* A partition Metadata did not list has no leader yet: asked again (P_DATA_META). */
	for (int32_t k = 0; k < n; k++)
		t->leader[k] = t->lo[k] = t->hi[k] = -1;
	t->nparts = n;
	set_leaders(t, mt);
	return true;
}

/* Leaders moved (or were not elected): Metadata again, then the offsets not known yet. */
static void took_data_meta(struct km_mprep *p, const km_metadata_response *r)
{
	if (km_cluster_brokers(p->dst, r) != KM_OK)
		snprintf(p->why, sizeof(p->why), "the destination's brokers could not be taken from its Metadata");
	for (int32_t i = 0; i < r->topics.count; i++) {
		const km_metadata_response_topic *mt = &r->topics.items[i];
		ptopic *t = km_prep_topic_of(p, mt->name);
		if (t && t->data_check && !t->settled && !mt->error_code)
			set_leaders(t, mt);
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
	p->ph = ask ? P_SRC_PEER : km_prep_to_create(p) ? P_SRC_META : P_DONE;
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
		return km_prep_later(p, 0);
	}
	c = node >= 0 ? km_cluster_node(p->dst, node) : NULL;
	if (!c) {
		p->ph = P_DATA_META;
		return km_prep_later(p, RETRY_MS);
	}
	if (!km_cluster_usable(p->dst, c)) {
		snprintf(p->why, sizeof(p->why), "destination broker %d cannot be reached: %s", (int)node,
			 km_cluster_last_error(p->dst));
		return km_prep_later(p, RETRY_MS);
	}
	if ((ver = km_net_version_pick(c, KM_API_LIST_OFFSETS, LO_LO, LO_HI)) < 0) {
		for (size_t i = 0; i < p->n; i++)
			if (p->t[i].data_check)
				km_prep_set_code(&p->t[i], KM_KAFKA_UNSUPPORTED_VERSION,
					 "the destination does not support ListOffsets v%d+", LO_LO);
		p->ph = P_DONE;
		return km_prep_later(p, 0);
	}
	for (size_t i = 0; i < p->n; i++)
		total += p->t[i].data_check ? p->t[i].nparts : 0;
	lt = calloc(p->n, sizeof(*lt));
	lp = calloc((size_t)total + 1, sizeof(*lp));
	if (!lt || !lp) {
		free(lt);
		free(lp);
		return km_prep_later(p, RETRY_MS);
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
	km_prep_send_req(p, p->dst, c, KM_API_LIST_OFFSETS, ver, &m);
	free(lt); /* encoded in the call */
	free(lp);
}

static void took_data_ends(struct km_mprep *p, const km_list_offsets_response *r)
{
	for (int32_t i = 0; i < r->topics.count; i++) {
		ptopic *t = km_prep_topic_of(p, r->topics.items[i].name);
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
		km_prep_set_code(t, K_TOPIC_ALREADY_EXISTS,
			 "Topic %s already holds records (or transaction markers) on the destination at %lld offset(s) "
			 "(%s) that no mirror here wrote, and "
			 "the source does not know it as mirrored from here (no failback). A start would hide them from "
			 "readers through kmirrord (they stay in the destination's log) and give their offsets to the "
			 "source's records. Read or copy them first, or mirror into a topic that does not exist yet; to "
			 "hide them and mirror, start again with --adopt-existing",
			 t->name, (long long)held, where);
	}
	p->ph = km_prep_to_create(p) ? P_SRC_META : P_DONE;
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

	if (!km_prep_src_cluster(p, peer_checked) || !(c = km_prep_ready_client(p, p->src)))
		return;
	if ((ver = km_net_version_pick(c, KM_API_LAST_MIRRORED_OFFSETS, 0, 0)) < 0) {
		refuse_held(p);
		return km_prep_later(p, 0);
	}
	if (!(td = calloc(p->n, sizeof(*td))))
		return km_prep_later(p, RETRY_MS);
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
	km_prep_send_req(p, p->src, c, KM_API_LAST_MIRRORED_OFFSETS, ver, &m);
	free(td); /* encoded in the call */
}

static void took_src_peer(struct km_mprep *p, const km_last_mirrored_offsets_response *r)
{
	for (int32_t i = 0; !r->error_code && i < r->topics.count; i++) {
		ptopic *t = km_prep_topic_of(p, r->topics.items[i].name);
		if (t && t->peer_check && !r->topics.items[i].error_code) {
			t->peer_check = false; /* a failback: the pipeline compares the records before it trusts it */
			KM_INFO(COMP, 0, "%s: topic %s holds records on the destination and the source's kmirrord holds it "
				"in a mirror: a failback", p->mirror, t->name);
		}
	}
	refuse_held(p);
}

bool km_prep_check_existing(struct km_mprep *p, ptopic *t, const km_metadata_response_topic *mt)
{
	const km_state *st = km_mirror_store(p->mi);

	if (!writable_here(p, t->name))
		return false;
	t->txn_check = true;
	/* In no mirror here: whatever it holds, no mirror of this kmirrord wrote it. */
	if (st && !km_state_topic_find(st, t->name, strlen(t->name)) && take_leaders(t, mt))
		t->data_check = true;
	return true;
}

void km_prep_checks_send(struct km_mprep *p)
{
	switch (p->ph) {
	case P_TXN_LIST:
		send_txn_list(p);
		return;
	case P_TXN_DESC:
		send_txn_describe(p);
		return;
	case P_DATA_META:
		km_prep_send_metadata(p, p->dst, false);
		return;
	case P_DATA_ENDS:
		send_data_ends(p);
		return;
	case P_SRC_PEER:
		send_src_peer(p);
		return;
	default:
		return;
	}
}

int km_prep_checks_took(struct km_mprep *p, phase ph, const km_rpc_response *r)
{
	switch (ph) {
	case P_TXN_LIST:
		if (!took_txn_list(p, r->msg))
			return RETRY_MS; /* the broker's error: asked again, within the deadline */
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
	return 0;
}
