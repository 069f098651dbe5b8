/* The proxy's searches of a destination partition by timestamp (docs/mirror.md, "ListOffsets by timestamp"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/api.h"
#include "kmirror/batch.h"
#include "kmirror/log.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/fetch_request.h"
#include "kmirror/msg/fetch_response.h"
#include "kmirror/msg/list_offsets_request.h"
#include "kmirror/msg/list_offsets_response.h"
#include "kmirror/msg/metadata_request.h"
#include "kmirror/msg/metadata_response.h"
#include "kmirror/rpc.h"
#include "prep.h"

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
		p->src_since = km_wall_ms();
		km_prep_later(p, 0);
		return;
	}
	q = &p->lq[p->lq_next];
	c = km_cluster_node(p->dst, q->leader);
	if (!km_cluster_usable(p->dst, c)) {
		km_prep_later(p, RETRY_MS);
		return;
	}
	if ((ver = km_net_version_pick(c, KM_API_FETCH, FETCH_LO, FETCH_HI)) < 0) {
		q->code = KM_KAFKA_UNSUPPORTED_VERSION;
		p->lq_next++;
		km_prep_later(p, 0);
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
	km_prep_send_req(p, p->dst, c, KM_API_FETCH, ver, &m);
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
	p->src = km_mirror_source_cluster(p->mi, m, "lookup", 16 << 20, &p->src_tls, km_prep_on_cluster, p, why, sizeof(why));
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
		return km_prep_later(p, 0);
	}
	if (!lookup_source(p, q->topic)) {
		p->lq_src++;
		p->src_leader = -1;
		return km_prep_later(p, 0);
	}
	c = p->src_leader >= 0 ? km_cluster_node(p->src, p->src_leader) : km_cluster_any(p->src);
	if (!km_cluster_usable(p->src, c)) {
		if (km_wall_ms() - p->src_since < SEARCH_SOURCE_PATIENCE_MS)
			return km_prep_later(p, RETRY_MS / 4);
		KM_INFO(COMP, 0, "ListOffsets by timestamp on %s-%d: the source (%s) cannot be reached (%s): answered from "
			"the destination (a transaction marker's own time is the source's to tell)", q->topic,
			(int)q->partition, p->src_boot, km_cluster_last_error(p->src));
		p->ph = P_DONE;
		return km_prep_later(p, 0);
	}
	if (p->src_leader < 0) {
		km_metadata_request m;
		km_metadata_request_topic mt;
		if ((ver = km_net_version_pick(c, KM_API_METADATA, META_LO, META_HI)) < 0) {
			p->lq_src++;
			return km_prep_later(p, 0);
		}
		km_metadata_request_init(&m);
		km_metadata_request_topic_init(&mt);
		mt.name = km_str_c(q->topic);
		m.topics.items = &mt;
		m.topics.count = 1;
		m.allow_auto_topic_creation = false;
		p->ph = P_LOOKUP_SRC_META;
		km_prep_send_req(p, p->src, c, KM_API_METADATA, ver, &m);
		return;
	}
	if ((ver = km_net_version_pick(c, KM_API_LIST_OFFSETS, LO_LO, LO_HI)) < 0) {
		p->lq_src++;
		p->src_leader = -1;
		return km_prep_later(p, 0);
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
		km_prep_send_req(p, p->src, c, KM_API_LIST_OFFSETS, ver, &m);
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
	    !(p->ev = event_new(km_mirror_base(mi), -1, 0, km_prep_on_ev, p)))
		goto nomem;
	p->mi = mi;
	p->lq = q;
	p->nlq = n;
	p->lcb = cb;
	p->arg = arg;
	p->deadline = km_wall_ms() + LOOKUP_TIMEOUT_MS;
	for (size_t i = 0; i < n; i++) {
		q[i].code = LQ_PENDING;
		q[i].next = q[i].offset;
		q[i].reads = 0;
		q[i].found_offset = q[i].found_timestamp = q[i].marker = -1;
		q[i].source_known = false;
		q[i].source_offset = q[i].source_timestamp = -1;
		if (!km_prep_topic_of(p, km_str_c(q[i].topic))) {
			if (!(p->t[p->n].name = strdup(q[i].topic)))
				goto nomem;
			p->n++;
		}
	}
	p->ph = P_LOOKUP_META;
	if (!(p->dst = km_mirror_dest_cluster(mi, mirror, "lookup", km_prep_on_cluster, p)))
		goto nomem;
	p->next = *km_mirror_prep_list(mi);
	*km_mirror_prep_list(mi) = p;
	km_prep_later(p, 0); /* never answer from inside the call */
	return;
nomem:
	if (p)
		km_prep_free(p);
	for (size_t i = 0; i < n; i++)
		q[i].code = KM_MIRROR_STATE_UNAVAILABLE;
	cb(arg, q, n);
}

void km_prep_lookup_send(struct km_mprep *p)
{
	switch (p->ph) {
	case P_LOOKUP_META:
		km_prep_send_metadata(p, p->dst, false);
		return;
	case P_LOOKUP_FETCH:
		send_lookup_fetch(p);
		return;
	case P_LOOKUP_SRC_META:
	case P_LOOKUP_SRC_LO:
		send_lookup_src(p);
		return;
	default:
		return;
	}
}

void km_prep_lookup_took(struct km_mprep *p, phase ph, const km_rpc_response *r)
{
	switch (ph) {
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
	default:
		break;
	}
}
