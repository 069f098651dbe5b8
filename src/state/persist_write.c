/* __mirror_state written: the topic made when missing, records produced (idempotent), topics' metadata. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/batch.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/create_topics_request.h"
#include "kmirror/msg/create_topics_response.h"
#include "kmirror/msg/init_producer_id_request.h"
#include "kmirror/msg/init_producer_id_response.h"
#include "kmirror/msg/produce_request.h"
#include "kmirror/msg/produce_response.h"
#include "state/persist_int.h"

static void write_step(km_state_persist *io);
static void write_produce(km_state_persist *io);
static void meta_send(km_state_persist *io);
static void on_write_metadata(km_net_client *c, const km_rpc_response *rr, void *arg);
static void write_checked(km_state_persist *io);
static void write_check_failed(km_state_persist *io, const char *why);
static void write_refused(km_state_persist *io, const char *message);

/* ---- write ---- */

static bool retriable(int16_t e)
{
	return e == K_ERR_NOT_LEADER || e == K_ERR_TIMED_OUT || e == K_ERR_LEADER_NOT_AVAILABLE ||
	       e == K_ERR_NOT_ENOUGH_REPLICAS || e == K_ERR_NOT_ENOUGH_REPLICAS_AFTER || e == K_ERR_UNKNOWN_TOPIC ||
	       e == K_ERR_COORD_LOADING || e == K_ERR_COORD_NOT_AVAILABLE || e == K_ERR_NOT_COORD ||
	       e == K_ERR_NOT_CONTROLLER || e == K_ERR_FENCED_LEADER_EPOCH || e == K_ERR_UNKNOWN_LEADER_EPOCH;
}

static void write_end(km_state_persist *io, km_err err, const char *msg)
{
	km_state_write_cb cb = io->wcb;
	km_state *st = io->st;

	free(io->rpart);
	free(io->pdone);
	free(io->pcount);
	io->rpart = NULL;
	io->pdone = NULL;
	io->pcount = NULL;
	io->wcb = NULL;
	io->ph = PH_IDLE;
	io->gen++;
	io->backoff_ms = 0;
	km_ps_follow_kick(io, 0);
	if (err != KM_OK) {
		/* Part of the write may have landed: read the topic back, under a new producer id. */
		io->pid = -1;
		km_state_persist_load(io);
	}
	cb(st, err, msg);
}

/* The failure is prefix followed by what. */
static void write_fail_or_retry(km_state_persist *io, bool retry, const char *prefix, const char *what)
{
	char msg[sizeof(io->wmsg)];
	snprintf(msg, sizeof(msg), "%s%s", prefix, what);
	memcpy(io->wmsg, msg, sizeof(msg));
	/*
	 * A former owner's write is not retried: the mirror may run elsewhere by now, and this write,
	 * made when the link comes back, would land after the new owner's and undo them (docs/state.md,
	 * "Writes of a former owner"). The reload that follows a failure reads what did land.
	 */
	if (retry && km_state_write_owner_gone(io->st, msg, sizeof(msg))) {
		KM_INFO(COMP, 0, "writing %s: %s (%s)", io->st->cfg.mirror_state_topic, msg, io->wmsg);
		memcpy(io->wmsg, msg, sizeof(msg));
		retry = false;
	}
	if (retry && ++io->attempts < WRITE_ATTEMPTS) {
		int ms = km_ps_next_backoff(&io->backoff_ms);
		KM_INFO(COMP, 0, "writing %s: %s; retrying in %d ms", io->st->cfg.mirror_state_topic, io->wmsg, ms);
		io->gen++;
		/* Leaders may have moved: metadata again, then the same batches with the same sequence numbers. */
		km_ps_after(io, ms, write_step);
		return;
	}
	write_end(io, KM_MIRROR_STATE_UNAVAILABLE, io->wmsg);
}

/* The partitions of one Produce answer: acknowledged ones are done, the others say retry or fail. */
static void produce_take(km_state_persist *io, const km_produce_response *r)
{
	for (int32_t i = 0; i < r->responses.count; i++)
		for (int32_t j = 0; j < r->responses.items[i].partition_responses.count; j++) {
			const km_produce_response_partition_produce_response *p =
				&r->responses.items[i].partition_responses.items[j];
			if (p->index < 0 || p->index >= io->nparts || io->pdone[p->index])
				continue;
			/* A duplicate is our own earlier attempt that landed. */
			if (p->error_code == 0 || p->error_code == K_ERR_DUPLICATE_SEQ) {
				io->pdone[p->index] = true;
				io->seq[p->index] += io->pcount[p->index];
				/* Following keeps them for a model it rebuilds before it read them. */
				km_ps_follow_acked(io, p->index, p->error_code == 0 ? p->base_offset : -1);
				continue;
			}
			if (retriable(p->error_code))
				io->wretry = true;
			else
				io->wfail = true;
			snprintf(io->wmsg, sizeof(io->wmsg), "partition %d: %s%s%.*s", p->index,
				 km_err_name(p->error_code), p->error_message.len > 0 ? " (" : "",
				 p->error_message.len > 0 ? (int)p->error_message.len : 0,
				 p->error_message.p ? p->error_message.p : "");
			if (p->error_message.len > 0)
				strncat(io->wmsg, ")", sizeof(io->wmsg) - strlen(io->wmsg) - 1);
		}
}

static void on_produce(km_net_client *c, const km_rpc_response *rr, void *arg)
{
	req_ctx x;
	km_state_persist *io = km_ps_ctx_take(arg, &x);

	if (!io)
		return;
	io->outstanding--;
	if (km_rpc_undecoded(rr)) {
		io->wfail = true;
		snprintf(io->wmsg, sizeof(io->wmsg), "broker %d: undecodable Produce response", x.node_id);
	} else if (rr->err != KM_OK) {
		km_ps_drop(io, c);
		io->wretry = true;
		snprintf(io->wmsg, sizeof(io->wmsg), "broker %d: %s", x.node_id, km_err_name(rr->err));
	} else {
		produce_take(io, rr->msg);
	}
	if (io->outstanding)
		return;
	for (int32_t p = 0; p < io->nparts; p++)
		if (!io->pdone[p]) {
			char tmp[512];
			snprintf(tmp, sizeof(tmp), "%s", io->wmsg[0] ? io->wmsg : "not acknowledged");
			write_fail_or_retry(io, !io->wfail, "", tmp);
			return;
		}
	write_end(io, KM_OK, NULL);
}

/* What a Produce round builds its requests in: room for every partition and record, reused per leader. */
typedef struct produce_buf {
	km_produce_request_partition_produce_data *pd;
	km_wr *bw;                 /* the batches built, one per partition of the request */
	km_batch_record *br;
} produce_buf;

static void produce_buf_free(produce_buf *b)
{
	free(b->pd);
	free(b->bw);
	free(b->br);
}

/*
 * The Produce to one leader: a batch per partition it leads that is not acknowledged yet, built
 * here (the request's records are those bytes). *cp: the leader's client when it leads any;
 * *sent: whether the request went out.
 */
static km_err produce_to(km_state_persist *io, produce_buf *b, int32_t leader, int64_t now, km_net_client **cp,
			 bool *sent)
{
	km_produce_request m;
	km_produce_request_topic_produce_data td;
	int32_t npd = 0;
	km_err rc = KM_OK;
	char why[200];

	*sent = false;
	*cp = NULL;
	for (int32_t p = 0; p < io->nparts && rc == KM_OK; p++) {
		size_t k = 0;
		km_batch_params bp;
		if (io->pdone[p] || io->leaders[p] != leader)
			continue;
		for (size_t i = 0; i < io->nrecs; i++)
			if (io->rpart[i] == p) {
				b->br[k].timestamp = now;
				b->br[k].offset_delta = (int32_t)k;
				b->br[k].key = (km_bytes){io->recs[i].key, (int32_t)io->recs[i].klen};
				b->br[k].value = io->recs[i].val ? (km_bytes){io->recs[i].val, (int32_t)io->recs[i].vlen}
								 : KM_BYTES_NULL;
				k++;
			}
		km_batch_params_init(&bp);
		bp.producer_id = io->pid;
		bp.producer_epoch = io->epoch;
		bp.base_sequence = io->seq[p];
		km_wr_init(&b->bw[npd]);
		rc = km_batch_build(&bp, b->br, k, &b->bw[npd]);
		km_produce_request_partition_produce_data_init(&b->pd[npd]);
		b->pd[npd].index = p;
		b->pd[npd].records = (km_bytes){b->bw[npd].buf, (int32_t)b->bw[npd].len};
		npd++;
	}
	if (npd)
		*cp = km_ps_node(io, leader);
	if (rc == KM_OK && npd) {
		km_net_client *c = *cp;
		int16_t ver = c && km_net_client_ready(c) ? km_ps_version_for(c, KM_API_PRODUCE, why, sizeof(why)) : 3;
		km_produce_request_init(&m);
		km_produce_request_topic_produce_data_init(&td);
		m.acks = -1;
		m.timeout_ms = 30000;
		td.name = km_str_c(io->st->cfg.mirror_state_topic);
		td.partition_data.items = b->pd;
		td.partition_data.count = npd;
		m.topic_data.items = &td;
		m.topic_data.count = 1;
		rc = km_ps_send_req(io, c, KM_API_PRODUCE, ver, &m, on_produce, leader, -1);
		*sent = rc == KM_OK;
	}
	for (int32_t i = 0; i < npd; i++)
		km_wr_free(&b->bw[i]);
	return rc;
}

/* Every leader written to has negotiated its versions; false when the step waits or the write ended. */
static bool produce_ready(km_state_persist *io)
{
	char why[200];

	for (int32_t p = 0; p < io->nparts; p++) {
		km_net_client *c;
		if (io->pdone[p])
			continue;
		c = km_ps_node(io, io->leaders[p]);
		if (!km_ps_client_wait(io, c, io->leaders[p], write_produce))
			return false;
		if (c && km_net_client_ready(c) && km_ps_version_for(c, KM_API_PRODUCE, why, sizeof(why)) < 0) {
			write_end(io, KM_MIRROR_STATE_UNAVAILABLE, why);
			return false;
		}
	}
	return true;
}

/* One Produce per leader, one batch per partition of that leader not yet acknowledged. */
static void write_produce(km_state_persist *io)
{
	int64_t now = 0;
	bool sent_any = false, ok;
	/* The brokers the metadata named, in its order: the leaders are among them. */
	size_t nids = km_cluster_node_ids(io->cl, NULL, 0);
	int32_t *ids;
	produce_buf b;

	if (!produce_ready(io))
		return;
	ids = calloc(nids ? nids : 1, sizeof(*ids));
	b.pd = calloc((size_t)io->nparts, sizeof(*b.pd));
	b.bw = calloc((size_t)io->nparts, sizeof(*b.bw));
	b.br = calloc(io->nrecs ? io->nrecs : 1, sizeof(*b.br));
	if ((ok = ids && b.pd && b.bw && b.br)) {
		km_cluster_node_ids(io->cl, ids, nids);
		now = km_wall_ms();
		io->wretry = io->wfail = false;
		io->wmsg[0] = 0;
		io->outstanding = 0;
	}
	for (size_t ni = 0; ok && ni < nids; ni++) {
		int32_t leader = ids[ni];
		km_net_client *c;
		bool sent;
		km_err rc = produce_to(io, &b, leader, now, &c, &sent);

		if (sent) {
			io->outstanding++;
			sent_any = true;
		}
		if (rc == KM_OK)
			continue;
		km_ps_drop(io, c);
		if (!io->outstanding) {
			free(ids);
			produce_buf_free(&b);
			write_fail_or_retry(io, true, "sending Produce: ", km_err_name(rc));
			return;
		}
		/* The others are in flight: their answers end the round, and it is retried. */
		io->wretry = true;
		snprintf(io->wmsg, sizeof(io->wmsg), "sending Produce to broker %d: %s", leader, km_err_name(rc));
	}
	free(ids);
	produce_buf_free(&b);
	if (!ok)
		write_end(io, KM_MIRROR_STATE_UNAVAILABLE, "out of memory");
	else if (!sent_any && !io->outstanding)
		write_fail_or_retry(io, true, "", "no leader for a partition of the state topic");
}

static void on_init_pid(km_net_client *c, const km_rpc_response *rr, void *arg)
{
	req_ctx x;
	km_state_persist *io = km_ps_ctx_take(arg, &x);
	const km_init_producer_id_response *r = rr->msg;

	if (!io)
		return;
	if (km_rpc_transport_err(rr) != KM_OK) {
		km_ps_drop(io, c);
		write_fail_or_retry(io, true, "InitProducerId: ", km_err_name(rr->err));
		return;
	}
	if (rr->err != KM_OK) {
		write_fail_or_retry(io, false, "InitProducerId: ", "undecodable response");
		return;
	}
	if (r->error_code) {
		write_fail_or_retry(io, retriable(r->error_code), "InitProducerId: ", km_err_name(r->error_code));
		return;
	}
	io->pid = r->producer_id;
	io->epoch = r->producer_epoch;
	KM_INFO(COMP, 0, "writing %s as producer id %lld (InitProducerId v%d, Metadata v%d)",
		io->st->cfg.mirror_state_topic, (long long)r->producer_id, rr->version, io->used[0]);
	memset(io->seq, 0, (size_t)io->nparts * sizeof(*io->seq));
	KM_DEBUG(COMP, 0, "state producer id %lld epoch %d", (long long)io->pid, io->epoch);
	write_produce(io);
}

static void init_pid(km_state_persist *io)
{
	km_init_producer_id_request m;
	km_err rc;
	km_net_client *c = km_ps_any(io);
	int16_t ver = 0;
	char why[200];

	if (!km_ps_client_wait(io, c, KM_PS_ANY, init_pid))
		return;
	if (c && km_net_client_ready(c) && (ver = km_ps_version_for(c, KM_API_INIT_PRODUCER_ID, why, sizeof(why))) < 0) {
		write_end(io, KM_MIRROR_STATE_UNAVAILABLE, why);
		return;
	}
	km_init_producer_id_request_init(&m);
	m.transactional_id = KM_STR_NULL;
	m.transaction_timeout_ms = 60000;
	m.producer_id = -1;
	m.producer_epoch = -1;
	rc = km_ps_send_req(io, c, KM_API_INIT_PRODUCER_ID, ver, &m, on_init_pid, -1, -1);
	if (rc != KM_OK) {
		km_ps_drop(io, c);
		write_fail_or_retry(io, true, "InitProducerId: ", km_err_name(rc));
	}
}

/* The records' partitions, once the layout is known. */
static bool write_layout(km_state_persist *io)
{
	free(io->pdone);
	free(io->pcount);
	free(io->rpart);
	io->pdone = calloc((size_t)io->nparts, sizeof(*io->pdone));
	io->pcount = calloc((size_t)io->nparts, sizeof(*io->pcount));
	io->rpart = calloc(io->nrecs, sizeof(*io->rpart));
	if (!io->pdone || !io->pcount || !io->rpart)
		return false;
	io->layout_parts = io->nparts;
	for (int32_t p = 0; p < io->nparts; p++)
		io->pdone[p] = true;
	for (size_t i = 0; i < io->nrecs; i++) {
		int32_t p = km_state_key_partition(io->recs[i].key, io->recs[i].klen, io->nparts);
		io->rpart[i] = p;
		io->pdone[p] = false;
		io->pcount[p]++;
	}
	return true;
}

static void on_create_topics(km_net_client *c, const km_rpc_response *rr, void *arg)
{
	req_ctx x;
	km_state_persist *io = km_ps_ctx_take(arg, &x);
	const km_create_topics_response *r = rr->msg;
	char why[400];

	if (!io)
		return;
	if (km_rpc_transport_err(rr) != KM_OK) {
		km_ps_drop(io, c);
		write_fail_or_retry(io, true, "CreateTopics: ", km_err_name(rr->err));
		return;
	}
	if (rr->err != KM_OK || r->topics.count != 1) {
		write_fail_or_retry(io, false, "CreateTopics: ", "undecodable response");
		return;
	}
	const km_create_topics_response_creatable_topic_result *t = &r->topics.items[0];
	if (t->error_code && t->error_code != K_ERR_TOPIC_EXISTS) {
		snprintf(why, sizeof(why), "creating %s: %s%s%.*s%s", io->st->cfg.mirror_state_topic,
			 km_err_name(t->error_code), t->error_message.len > 0 ? " (" : "",
			 t->error_message.len > 0 ? (int)t->error_message.len : 0, t->error_message.p ? t->error_message.p : "",
			 t->error_message.len > 0 ? ")" : "");
		write_fail_or_retry(io, retriable(t->error_code), "", why);
		return;
	}
	KM_INFO(COMP, 0, "%s %s", io->st->cfg.mirror_state_topic,
		t->error_code ? "was created by another kmirrord" : "created");
	write_step(io); /* metadata until leaders are known */
}

static void create_topic(km_state_persist *io)
{
	const km_config *cfg = &io->st->cfg;
	km_create_topics_request m;
	km_create_topics_request_creatable_topic t;
	km_create_topics_request_creatable_topic_config cf[2];
	int64_t rf = cfg->mirror_state_replication_factor;
	/* The brokers the destination's metadata named. */
	int64_t nbrokers = (int64_t)km_cluster_node_ids(io->cl, NULL, 0);
	char misr[8];
	km_err rc;
	km_net_client *c = km_ps_any(io);
	int16_t ver = 0;
	char why[200];

	if (!km_ps_client_wait(io, c, KM_PS_ANY, create_topic))
		return;
	if (c && km_net_client_ready(c) && (ver = km_ps_version_for(c, KM_API_CREATE_TOPICS, why, sizeof(why))) < 0) {
		write_end(io, KM_MIRROR_STATE_UNAVAILABLE, why);
		return;
	}
	if (rf < 0)
		rf = nbrokers >= 3 ? 3 : nbrokers > 0 ? nbrokers : 1;
	snprintf(misr, sizeof(misr), "%d", rf >= 3 ? 2 : 1);
	km_create_topics_request_init(&m);
	km_create_topics_request_creatable_topic_init(&t);
	km_create_topics_request_creatable_topic_config_init(&cf[0]);
	km_create_topics_request_creatable_topic_config_init(&cf[1]);
	cf[0].name = km_str_c("cleanup.policy");
	cf[0].value = km_str_c("compact");
	cf[1].name = km_str_c("min.insync.replicas");
	cf[1].value = km_str_c(misr);
	t.name = km_str_c(cfg->mirror_state_topic);
	t.num_partitions = (int32_t)cfg->mirror_state_partitions;
	t.replication_factor = (int16_t)rf;
	t.configs.items = cf;
	t.configs.count = 2;
	m.topics.items = &t;
	m.topics.count = 1;
	m.timeout_ms = 30000;
	KM_INFO(COMP, 0, "creating %s: %d partitions, replication factor %d, min.insync.replicas %s",
		cfg->mirror_state_topic, t.num_partitions, (int)rf, misr);
	rc = km_ps_send_req(io, c, KM_API_CREATE_TOPICS, ver, &m, on_create_topics, -1, -1);
	if (rc != KM_OK) {
		km_ps_drop(io, c);
		write_fail_or_retry(io, true, "CreateTopics: ", km_err_name(rc));
	}
}

static void on_write_metadata(km_net_client *c, const km_rpc_response *rr, void *arg)
{
	req_ctx x;
	km_state_persist *io = km_ps_ctx_take(arg, &x);
	int16_t terr = 0;
	km_err rc = rr->err;

	if (!io)
		return;
	if (km_rpc_transport_err(rr) != KM_OK) {
		km_ps_drop(io, c);
		write_fail_or_retry(io, true, "Metadata: ", km_err_name(rc));
		return;
	}
	if (rc == KM_OK)
		rc = km_ps_take_metadata(io, rr->msg, &terr);
	if (rc == KM_OK && !io->exists && terr == K_ERR_UNKNOWN_TOPIC) {
		create_topic(io);
		return;
	}
	if (rc != KM_OK || !io->exists) {
		/* Leaders of a topic just created take a moment: these retries do not count as failed attempts. */
		if (io->attempts < META_ATTEMPTS) {
			io->attempts++;
			io->gen++;
			km_ps_after(io, 250, write_step);
			return;
		}
		write_fail_or_retry(io, false, "", rc == KM_ERR_UNSUPPORTED ? "a partition of the state topic has no leader"
									 : km_err_name(rc != KM_OK ? rc : terr));
		return;
	}
	/*
	 * Whoever made the topic (this kmirrord, another one, or anyone on the brokers directly since
	 * the load found none), it must be compacted before a record goes in.
	 */
	km_ps_check_policy(io, write_checked, write_check_failed, write_refused);
}

/* The topic is compacted: the producer id if needed, then the Produce round. */
static void write_checked(km_state_persist *io)
{
	/* A retry keeps what was acknowledged (unless the layout changed under it). */
	if ((!io->pdone || io->layout_parts != io->nparts) && !write_layout(io)) {
		write_end(io, KM_MIRROR_STATE_UNAVAILABLE, "out of memory");
		return;
	}
	if (io->pid < 0)
		init_pid(io);
	else
		write_produce(io);
}

static void write_check_failed(km_state_persist *io, const char *why)
{
	write_fail_or_retry(io, true, "", why);
}

/* Not compacted: the write fails with the reason, and the store stops (its reload does nothing then). */
static void write_refused(km_state_persist *io, const char *message)
{
	km_state_fatal(io->st, message);
	write_end(io, KM_MIRROR_STATE_UNAVAILABLE, message);
}

/* Metadata (creating the topic when absent), the producer id, then the Produce round. */
static void write_step(km_state_persist *io)
{
	km_err rc;
	char *name = io->st->cfg.mirror_state_topic;
	km_net_client *c;
	int16_t ver = 0;
	char why[200];

	if (io->exists && io->pid >= 0 && io->pdone && io->attempts == 0) {
		write_produce(io);
		return;
	}
	c = km_ps_any(io);
	if (!km_ps_client_wait(io, c, KM_PS_ANY, write_step))
		return;
	if (c && km_net_client_ready(c) && (ver = km_ps_version_for(c, KM_API_METADATA, why, sizeof(why))) < 0) {
		write_end(io, KM_MIRROR_STATE_UNAVAILABLE, why);
		return;
	}
	rc = km_ps_send_metadata(io, c, ver, &name, 1, on_write_metadata);
	if (rc != KM_OK) {
		km_ps_drop(io, c);
		write_fail_or_retry(io, true, "Metadata: ", km_err_name(rc));
	}
}

void km_state_persist_write(km_state_persist *io, const km_state_rec *recs, size_t n, km_state_write_cb cb)
{
	io->ph = PH_WRITE;
	io->wait_c = NULL;
	io->recs = recs;
	io->nrecs = n;
	io->wcb = cb;
	io->attempts = 0;
	io->backoff_ms = 0;
	io->gen++;
	free(io->pdone);
	io->pdone = NULL;
	if (io->exists && io->nparts > 0 && io->pid >= 0 && write_layout(io)) {
		write_produce(io);
		return;
	}
	write_step(io);
}

/* ---- destination topics' metadata (start) ---- */

static void meta_end(km_state_persist *io, km_err err, const char *msg, const km_state_topic_meta *metas)
{
	km_state_meta_cb cb = io->mcb;
	for (size_t i = 0; i < io->mn; i++)
		free(io->mnames[i]);
	free(io->mnames);
	io->mnames = NULL;
	io->mn = 0;
	io->mcb = NULL;
	io->ph = PH_IDLE;
	io->gen++;
	km_ps_follow_kick(io, 0);
	cb(io->st, err, msg, metas);
}

static void on_topics_metadata(km_net_client *c, const km_rpc_response *rr, void *arg)
{
	req_ctx x;
	km_state_persist *io = km_ps_ctx_take(arg, &x);
	const km_metadata_response *r = rr->msg;
	km_state_topic_meta *metas;
	char why[200];

	if (!io)
		return;
	if (km_rpc_transport_err(rr) != KM_OK) {
		km_ps_drop(io, c);
		if (++io->attempts < WRITE_ATTEMPTS) {
			io->gen++;
			km_ps_after(io, km_ps_next_backoff(&io->backoff_ms), meta_send);
			return;
		}
		snprintf(why, sizeof(why), "the destination's metadata could not be read: %s", km_err_name(rr->err));
		meta_end(io, KM_MIRROR_STATE_UNAVAILABLE, why, NULL);
		return;
	}
	metas = calloc(io->mn ? io->mn : 1, sizeof(*metas));
	if (!metas || rr->err != KM_OK) {
		free(metas);
		meta_end(io, KM_MIRROR_STATE_UNAVAILABLE, "undecodable Metadata response", NULL);
		return;
	}
	bool unknown = false;
	for (size_t i = 0; i < io->mn; i++) {
		metas[i].error = K_ERR_UNKNOWN_TOPIC;
		for (int32_t j = 0; j < r->topics.count; j++) {
			const km_metadata_response_topic *t = &r->topics.items[j];
			if (!km_str_eq_c(t->name, io->mnames[i]))
				continue;
			metas[i].error = t->error_code;
			metas[i].id = t->topic_id;
			metas[i].partitions = t->partitions.count > 0 ? t->partitions.count : 0;
		}
		unknown = unknown || metas[i].error == K_ERR_UNKNOWN_TOPIC || metas[i].partitions == 0;
	}
	/* A topic the mirror module has just created may not have reached the broker asked yet (each broker
	 * learns it from the controller on its own): ask again, another broker perhaps, for a short while. */
	if (unknown && km_wall_ms() < io->munknown_until_ms) {
		free(metas);
		io->gen++;
		km_ps_after(io, META_UNKNOWN_RETRY_MS, meta_send);
		return;
	}
	meta_end(io, KM_OK, NULL, metas);
	free(metas);
}

static void meta_send(km_state_persist *io)
{
	km_err rc;
	km_net_client *c = km_ps_any(io);
	int16_t ver = 0;
	char why[200];

	if (!km_ps_client_wait(io, c, KM_PS_ANY, meta_send))
		return;
	if (c && km_net_client_ready(c) && (ver = km_ps_version_for(c, KM_API_METADATA, why, sizeof(why))) < 0) {
		meta_end(io, KM_MIRROR_STATE_UNAVAILABLE, why, NULL);
		return;
	}
	rc = km_ps_send_metadata(io, c, ver, io->mnames, io->mn, on_topics_metadata);
	if (rc != KM_OK) {
		km_ps_drop(io, c);
		if (++io->attempts < WRITE_ATTEMPTS) {
			io->gen++;
			km_ps_after(io, km_ps_next_backoff(&io->backoff_ms), meta_send);
			return;
		}
		meta_end(io, KM_MIRROR_STATE_UNAVAILABLE, "the destination's metadata could not be asked", NULL);
	}
}

void km_state_persist_topics(km_state_persist *io, char *const *names, size_t n, km_state_meta_cb cb)
{
	io->ph = PH_META;
	io->wait_c = NULL;
	io->mcb = cb;
	io->munknown_until_ms = km_wall_ms() + META_UNKNOWN_WAIT_MS;
	io->attempts = 0;
	io->backoff_ms = 0;
	io->gen++;
	io->mnames = calloc(n ? n : 1, sizeof(*io->mnames));
	for (size_t i = 0; io->mnames && i < n; i++)
		if ((io->mnames[i] = strdup(names[i])))
			io->mn++;
	if (!io->mnames || io->mn != n) {
		meta_end(io, KM_MIRROR_STATE_UNAVAILABLE, "out of memory", NULL);
		return;
	}
	meta_send(io);
}
